"""PostgreSQL as heed's database: a :class:`~heed.storage.database.SqlDatabase` on psycopg 3.

Chosen with ``HEED_DATABASE_URL=postgresql://...`` so that several ``heed serve``
processes, on one machine or several, share one source of truth. The domain stores
are the same classes as on SQLite (:mod:`heed.storage.run_store`,
:mod:`heed.storage.session_store`, :mod:`heed.storage.memory`): they write ``?``
placeholders and portable SQL, and this module adapts the text (``?`` becomes ``%s``) and
the rows (indexable by position and by column name, as :class:`sqlite3.Row` is).

Why the blocking psycopg API with a pool (``psycopg_pool.ConnectionPool``) rather than
the async one: every store call is already a short blocking call that async code
reaches through the run manager's I/O executor or the offload pool (see
:mod:`heed.runs.io`), which is also what bounds how many run at once. One store
interface with two blocking implementations keeps the engines unaware of the backend.

Transactions: :meth:`PostgresDatabase.write` takes a pooled connection and opens a
transaction (``READ COMMITTED``); a nested ``write()`` or a ``read()`` in the same
thread joins it, so store calls inside :meth:`heed.runs.store.RunStore.transaction`
commit together, as on SQLite. SQLite's single writer makes every check-then-write
atomic for free; here the stores say where they need it: :meth:`PostgresDatabase.lock`
takes a transaction-scoped advisory lock (admission and claims of one session, the
transcript of one session), and :attr:`PostgresDatabase.for_update` row-locks the run
whose journal is being appended. Migrations
(:func:`heed.storage.database.apply_migrations`) run under an advisory lock too, so
instances starting together apply each step once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from functools import lru_cache
from typing import Any, Final

import psycopg
import psycopg.conninfo
import psycopg.errors
from psycopg_pool import ConnectionPool

from heed.errors import NUL, InvalidText
from heed.redact import redact, secrets_of
from heed.runtime import CancellationToken, OperationCancelled, current_token, helper_pool

__all__ = [
    "CANCEL_GIVE_UP_SECONDS",
    "CANCEL_RETRY_SECONDS",
    "Connection",
    "DatabaseUnavailable",
    "PostgresDatabase",
    "Statements",
    "is_postgres_url",
]

log = logging.getLogger(__name__)

#: A cancel request is sent again after this long while the statement still runs.
CANCEL_RETRY_SECONDS: Final = 0.2
#: How long cancel requests for one statement are sent before giving up.
CANCEL_GIVE_UP_SECONDS: Final = 10.0


def is_postgres_url(url: str | None) -> bool:
    """Whether *url* names a PostgreSQL database (``postgresql://`` or ``postgres://``)."""
    return bool(url) and str(url).split("://", 1)[0] in ("postgresql", "postgres")


@lru_cache(maxsize=1024)
def _pg_sql(sql: str) -> str:
    """The stores' ``?`` placeholders in psycopg's style (a literal ``%`` doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


class Row(tuple[Any, ...]):
    """A result row readable by position and by column name, like :class:`sqlite3.Row`."""

    _index: dict[str, int]

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self._index[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._index)


def _row_factory(cursor: Any) -> Any:
    names = [column.name for column in cursor.description or ()]
    index = {name: i for i, name in enumerate(names)}

    def make(values: Sequence[Any]) -> Row:
        row = Row(values)
        row._index = index
        return row

    return make


def _holds_nul(values: Iterable[Any]) -> bool:
    """Whether a text among *values* (or in a list among them, an array parameter) holds
    NUL."""
    for value in values:
        if isinstance(value, str):
            if NUL in value:
                return True
        elif isinstance(value, list | tuple) and _holds_nul(value):
            return True
    return False


def _refuse_nul() -> InvalidText:
    return InvalidText("a text holds a NUL character (U+0000), which heed does not store")


class Connection:
    """A psycopg connection speaking the stores' dialect (``?`` placeholders).

    A parameter holding NUL, which a PostgreSQL ``text`` cannot hold, is refused here with
    :class:`~heed.errors.InvalidText` (400) before it reaches the server, never as the
    driver's ``DataError`` (a 500, or a failed turn's text). The stores refuse such text
    earlier, naming the field, and alike on SQLite; this is the net under them.
    """

    def __init__(self, raw: psycopg.Connection[Any]) -> None:
        self.raw = raw

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> psycopg.Cursor[Any]:
        if params is None:
            return self.raw.execute(sql)
        if _holds_nul(params):
            raise _refuse_nul()
        return self.raw.execute(_pg_sql(sql), params)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> psycopg.Cursor[Any]:
        if any(_holds_nul(row) for row in rows):
            raise _refuse_nul()
        cursor = self.raw.cursor()
        cursor.executemany(_pg_sql(sql), rows)
        return cursor


# -- cancelling a running statement ----------------------------------------------------

#: The threads that send cancel requests (a network round trip each), shared by every
#: connection (:func:`heed.runtime.helper_pool`).
_CANCEL_POOL: Final = "heed-pg-cancel"
_CANCEL_THREADS: Final = 8


class _Canceller:
    """Sends cancel requests for one connection's running statement while it runs.

    :meth:`close` returns only after any cancel request in flight has been sent, so no
    request reaches the connection after its user released it.
    """

    def __init__(self, raw: psycopg.Connection[Any]) -> None:
        self._raw = raw
        self._lock = threading.Lock()
        self._done = threading.Event()

    def request(self, reason: str) -> None:
        """The token's callback: hand the network round trip to the cancel threads."""
        if not self._done.is_set():
            helper_pool(_CANCEL_POOL, _CANCEL_THREADS).submit(self._cancel)

    def _cancel(self) -> None:
        give_up = time.monotonic() + CANCEL_GIVE_UP_SECONDS
        while time.monotonic() < give_up:
            with self._lock:
                if self._done.is_set():
                    return
                try:
                    self._raw.cancel_safe(timeout=CANCEL_RETRY_SECONDS * 10)
                except psycopg.Error as exc:
                    log.warning("could not cancel a PostgreSQL query: %s", exc)
            if self._done.wait(CANCEL_RETRY_SECONDS):
                return

    def close(self) -> None:
        with self._lock:
            self._done.set()


class Statements:
    """A connection whose every statement is preceded by a token check (what
    :meth:`PostgresDatabase.cancellable` yields)."""

    def __init__(self, conn: Connection, token: CancellationToken | None) -> None:
        self.conn = conn
        self._token = token

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> Any:
        if self._token is not None:
            self._token.raise_if_cancelled()
        return self.conn.execute(sql, params)

    def binary(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """Rows of *sql* (``?`` placeholders) in binary form (vectors as bytes)."""
        if self._token is not None:
            self._token.raise_if_cancelled()
        cursor = self.conn.raw.cursor(binary=True)
        cursor.execute(_pg_sql(sql), params)
        return cursor.fetchall()


class DatabaseUnavailable(ConnectionError):
    """PostgreSQL could not be reached at start-up; the message names where and why."""


def _where(url: str) -> str:
    """``host:port/dbname`` of *url*, without its password."""
    try:
        parts = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "the configured URL (it does not parse)"
    host = parts.get("host") or "localhost"
    return f"{host}:{parts.get('port') or 5432}/{parts.get('dbname') or ''}"


class PostgresDatabase:
    """A pool of connections to one PostgreSQL database. See the module docstring.

    Raises :class:`DatabaseUnavailable` at construction when the server cannot be
    reached within *connect_timeout* seconds: a server that cannot store anything
    should not start.
    """

    dialect = "postgresql"
    for_update = " FOR UPDATE"
    skip_locked = " FOR UPDATE SKIP LOCKED"

    def __init__(self, url: str, *, pool_size: int = 16, connect_timeout: float = 10.0) -> None:
        self.url = url
        try:  # one direct attempt first: it fails at once, with the server's reason
            psycopg.connect(url, connect_timeout=max(1, round(connect_timeout))).close()
        except psycopg.Error as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            reason = redact(reason, secrets_of(url))  # drivers echo a conninfo they cannot parse
            raise DatabaseUnavailable(
                f"cannot reach PostgreSQL at {_where(url)}: {reason}"
            ) from exc
        self._local = threading.local()
        self._pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            url,
            min_size=1,
            max_size=max(1, pool_size),
            kwargs={"autocommit": True, "row_factory": _row_factory},
            timeout=30.0,
            open=False,
            name="heed",
        )
        self._pool.open(wait=True, timeout=connect_timeout)

    def read(self) -> AbstractContextManager[Connection]:
        """A connection for reads (autocommit), or the thread's open write transaction."""
        return self._connection(transaction=False)

    def write(self) -> AbstractContextManager[Connection]:
        """One transaction: committed on exit, rolled back on error; nested blocks join."""
        return self._connection(transaction=True)

    @contextmanager
    def _connection(self, *, transaction: bool) -> Iterator[Connection]:
        """The thread's open write transaction when it has one; else a pooled connection,
        in autocommit or (*transaction*) in a transaction the thread's nested blocks join."""
        current: Connection | None = getattr(self._local, "conn", None)
        if current is not None:
            yield current
            return
        with self._pool.connection() as raw:
            if not transaction:
                yield Connection(raw)
                return
            with raw.transaction():
                conn = Connection(raw)
                self._local.conn = conn
                try:
                    yield conn
                finally:
                    self._local.conn = None

    @contextmanager
    def cancellable(self, *, transaction: bool = False) -> Iterator[Statements]:
        """A read connection (in a transaction of its own when *transaction*) whose
        statements stop when the active token is cancelled.

        The connection is registered with the token: cancelling it asks a small thread pool
        to send the server a cancel request for the connection (``cancel_safe``; never in
        the cancelling thread, which may be the event loop), repeated every
        :data:`CANCEL_RETRY_SECONDS` while the statement runs in case the first arrived
        between two statements. The server stops the statement with ``QueryCanceled``,
        which surfaces as :class:`~heed.runtime.OperationCancelled` with the token's
        reason; the connection returns to the pool idle and usable. No cancel is sent once
        the block has released the connection. Other errors, a ``statement_timeout``
        included, pass as they are.
        """
        token = current_token()
        if token is not None:
            token.raise_if_cancelled()
        with self.read() as conn:
            if token is None:
                if transaction:
                    with conn.raw.transaction():
                        yield Statements(conn, None)
                else:
                    yield Statements(conn, None)
                return
            canceller = _Canceller(conn.raw)
            handle = token.on_cancel(canceller.request)
            try:
                if transaction:
                    with conn.raw.transaction():
                        yield Statements(conn, token)
                else:
                    yield Statements(conn, token)
            except psycopg.errors.QueryCanceled as exc:
                if token.cancelled:
                    raise OperationCancelled(token.reason or "cancelled") from exc
                raise
            finally:
                handle.remove()
                canceller.close()

    def json_text(self, column: str, key: str) -> str:
        return f"({column}::jsonb ->> '{key}')"

    def lock(self, conn: Connection, key: str) -> None:
        """A transaction-scoped advisory lock on *key*; other transactions taking it wait."""
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(?, 0))", (key,))

    def close(self) -> None:
        """Close the pool (idempotent)."""
        self._pool.close()
