"""SQLite as heed's database: the embedded file, in WAL mode, one connection per thread.

The default when ``HEED_DATABASE_URL`` is unset. It is a
:class:`~heed.storage.database.SqlDatabase`: the domain stores speak to it only through
:meth:`SqliteDatabase.read` and :meth:`SqliteDatabase.write`, in the SQL they also send to
PostgreSQL (:mod:`heed.storage.database`).

Threading: each thread gets its own connection (SQLite connections must not be shared
across threads while in use). Writes are serialized by a process-wide lock, which is what
SQLite does anyway, minus the busy-wait; ``busy_timeout`` covers other processes sharing
the file. Calls block: async code reaches them through :func:`heed.runtime.run_in_thread`,
or calls them directly when they are known to be short (a primary-key lookup).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from heed.runtime import OperationCancelled, current_token

__all__ = ["PROGRESS_STEPS", "SqliteDatabase"]

#: SQLite VM instructions between two token checks inside a cancellable statement.
PROGRESS_STEPS: Final = 20_000


class SqliteDatabase:
    """A SQLite database file with per-thread connections (a
    :class:`~heed.storage.database.SqlDatabase`).

    ``":memory:"`` gives a private in-memory database shared by this object's
    threads (a named shared-cache database), for tests.
    """

    dialect = "sqlite"
    for_update = ""
    skip_locked = ""

    @staticmethod
    def json_text(column: str, key: str) -> str:
        """See :meth:`heed.storage.database.SqlDatabase.json_text`."""
        return f"json_extract({column}, '$.{key}')"

    def __init__(self, path: Path | str, *, busy_timeout_ms: int = 10_000) -> None:
        self.path = str(path)
        self._uri = False
        if self.path == ":memory:":
            self.path = f"file:heed-{id(self):x}?mode=memory&cache=shared"
            self._uri = True
        else:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._busy_timeout_ms = busy_timeout_ms
        self._local = threading.local()
        self._write_lock = threading.RLock()
        self._connections: list[sqlite3.Connection] = []
        self._connections_lock = threading.Lock()
        self._closed = False

    def _connection(self) -> sqlite3.Connection:
        if self._closed:
            raise RuntimeError("database is closed")
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(
                self.path, check_same_thread=False, isolation_level=None, timeout=30, uri=self._uri
            )
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
            self._local.conn = conn
            with self._connections_lock:
                self._connections.append(conn)
        return conn

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A connection for reads (autocommit; each statement sees committed data)."""
        yield self._connection()

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """A connection inside one write transaction: committed on exit, rolled back on error.

        Nested ``write()`` blocks in the same thread join the outer transaction.
        """
        conn = self._connection()
        with self._write_lock:
            if conn.in_transaction:
                yield conn
                return
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    @contextmanager
    def cancellable(self) -> Iterator[sqlite3.Connection]:
        """A read connection whose statements stop when the active token is cancelled.

        SQLite's progress handler runs every :data:`PROGRESS_STEPS` VM instructions; once
        the token is cancelled it aborts the statement, which surfaces here as
        :class:`~heed.runtime.OperationCancelled` instead of ``sqlite3.OperationalError``.
        Without an active token it is :meth:`read`.
        """
        token = current_token()
        with self.read() as conn:
            if token is None:
                yield conn
                return
            conn.set_progress_handler(lambda: 1 if token.cancelled else 0, PROGRESS_STEPS)
            try:
                yield conn
            except sqlite3.OperationalError as exc:
                if token.cancelled and "interrupt" in str(exc):
                    raise OperationCancelled(token.reason or "cancelled") from exc
                raise
            finally:
                conn.set_progress_handler(None, 0)

    def lock(self, conn: sqlite3.Connection, key: str) -> None:
        """Nothing to take: ``BEGIN IMMEDIATE`` already excludes every other writer."""

    def close(self) -> None:
        """Close every connection this database opened."""
        self._closed = True
        with self._connections_lock:
            for conn in self._connections:
                conn.close()
            self._connections.clear()
