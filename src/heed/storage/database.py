"""The embedded database: SQLite in WAL mode, one connection per thread, migrations.

Domain stores (memory, runs) sit on top of :class:`Database` and own their SQL.
They speak to it only through :meth:`Database.read` and :meth:`Database.write`,
and keep their SQL portable (no SQLite-only syntax outside FTS5), so that a
PostgreSQL backend can implement the same store interfaces later without the
engine changing.

Threading: each thread gets its own connection (SQLite connections must not be
shared across threads while in use). Writes are serialized by a process-wide
lock, which is what SQLite does anyway, minus the busy-wait; ``busy_timeout``
covers other processes sharing the file. Calls block: async code reaches them
through :func:`heed.runtime.run_in_thread`, or calls them directly when they are
known to be short (a primary-key lookup).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

__all__ = ["Database", "Migration", "SqlDatabase"]


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema step of one component; versions start at 1 and only grow."""

    component: str
    version: int
    sql: str


class SqlDatabase(Protocol):
    """What a domain store needs of a SQL database; SQLite (:class:`Database`) and
    PostgreSQL (:class:`heed.storage.postgres.PostgresDatabase`) implement it.

    Stores write one SQL text for both: ``?`` placeholders, standard SQL plus
    ``RETURNING`` and ``ON CONFLICT``. Where the two must differ, the store asks the
    database: :attr:`dialect` picks the migrations, :attr:`for_update` is appended to a
    ``SELECT`` whose rows the transaction is about to change, and :meth:`lock` serialises
    check-then-write sequences (admission) across connections and processes.
    """

    #: ``"sqlite"`` or ``"postgresql"``.
    dialect: str
    #: ``" FOR UPDATE"`` where row locks exist, else ``""`` (SQLite's writer lock covers it).
    for_update: str

    def read(self) -> AbstractContextManager[Any]:
        """A connection for reads; inside :meth:`write` in the same thread, that one."""
        ...

    def write(self) -> AbstractContextManager[Any]:
        """One write transaction (nested blocks in the same thread join it)."""
        ...

    def lock(self, conn: Any, key: str) -> None:
        """Hold a lock named *key* until the current write transaction ends."""
        ...

    def migrate(self, migrations: Sequence[Migration]) -> list[Migration]: ...

    def schema_version(self, component: str) -> int: ...

    def close(self) -> None: ...


class Database:
    """A SQLite database file with per-thread connections (a :class:`SqlDatabase`).

    ``":memory:"`` gives a private in-memory database shared by this object's
    threads (a named shared-cache database), for tests.
    """

    dialect = "sqlite"
    for_update = ""

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

    # -- connections -------------------------------------------------------------

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

    def lock(self, conn: sqlite3.Connection, key: str) -> None:
        """Nothing to take: ``BEGIN IMMEDIATE`` already excludes every other writer."""

    def close(self) -> None:
        """Close every connection this database opened."""
        self._closed = True
        with self._connections_lock:
            for conn in self._connections:
                conn.close()
            self._connections.clear()

    # -- migrations --------------------------------------------------------------

    def migrate(self, migrations: Sequence[Migration]) -> list[Migration]:
        """Apply the migrations not yet applied, in version order per component.

        Each migration runs in its own transaction with its bookkeeping row, so a
        failed step leaves the schema at the previous version. Returns the steps
        applied now.
        """
        with self.write() as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " component TEXT NOT NULL, version INTEGER NOT NULL,"
                " applied_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP,"
                " PRIMARY KEY (component, version))"
            )
        applied: list[Migration] = []
        for migration in sorted(migrations, key=lambda m: (m.component, m.version)):
            with self.write() as conn:
                done = conn.execute(
                    "SELECT 1 FROM schema_migrations WHERE component = ? AND version = ?",
                    (migration.component, migration.version),
                ).fetchone()
                if done:
                    continue
                for statement in _split_statements(migration.sql):
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO schema_migrations (component, version) VALUES (?, ?)",
                    (migration.component, migration.version),
                )
            applied.append(migration)
        return applied

    def schema_version(self, component: str) -> int:
        """The highest applied version of *component* (0 when none)."""
        with self.read() as conn:
            row = conn.execute(
                "SELECT MAX(version) FROM schema_migrations WHERE component = ?", (component,)
            ).fetchone()
        return int(row[0] or 0)


def _split_statements(sql: str) -> list[str]:
    """Split a migration script into complete statements (handles triggers' BEGIN...END)."""
    statements: list[str] = []
    buffer = ""
    for line in sql.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                statements.append(buffer.strip())
            buffer = ""
    if buffer.strip():
        statements.append(buffer.strip())
    return statements
