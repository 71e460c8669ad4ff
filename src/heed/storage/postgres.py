"""PostgreSQL as heed's database: a :class:`~heed.storage.database.SqlDatabase` on psycopg 3.

Chosen with ``HEED_DATABASE_URL=postgresql://...`` so that several ``heed serve``
processes, on one machine or several, share one source of truth. The domain stores
are the same classes as on SQLite (:mod:`heed.storage.run_store`,
:mod:`heed.storage.session_store`): they write ``?`` placeholders and portable SQL,
and this module adapts the text (``?`` becomes ``%s``) and the rows (indexable by
position and by column name, as :class:`sqlite3.Row` is).

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
whose journal is being appended. Migrations run under an advisory lock too, so
instances starting together apply each step once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, Final

import psycopg
import psycopg.conninfo
from psycopg_pool import ConnectionPool

from heed.errors import NUL, InvalidText
from heed.redact import redact, secrets_of
from heed.storage.database import Migration

__all__ = ["DatabaseUnavailable", "PostgresDatabase", "is_postgres_url"]

_MIGRATIONS_LOCK: Final = "heed:schema_migrations"


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

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A connection for reads (autocommit), or the thread's open write transaction."""
        current: Connection | None = getattr(self._local, "conn", None)
        if current is not None:
            yield current
            return
        with self._pool.connection() as raw:
            yield Connection(raw)

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """One transaction: committed on exit, rolled back on error; nested blocks join."""
        current: Connection | None = getattr(self._local, "conn", None)
        if current is not None:
            yield current
            return
        with self._pool.connection() as raw, raw.transaction():
            conn = Connection(raw)
            self._local.conn = conn
            try:
                yield conn
            finally:
                self._local.conn = None

    def lock(self, conn: Connection, key: str) -> None:
        """A transaction-scoped advisory lock on *key*; other transactions taking it wait."""
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(?, 0))", (key,))

    def close(self) -> None:
        """Close the pool (idempotent)."""
        self._pool.close()

    # -- migrations --------------------------------------------------------------

    def migrate(self, migrations: Sequence[Migration]) -> list[Migration]:
        """Apply the migrations not yet applied, each in its own transaction with its
        bookkeeping row, under an advisory lock (concurrent starts apply each once)."""
        with self.write() as conn:
            self.lock(conn, _MIGRATIONS_LOCK)
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " component TEXT NOT NULL, version INTEGER NOT NULL,"
                " applied_at TIMESTAMPTZ NOT NULL DEFAULT now(),"
                " PRIMARY KEY (component, version))"
            )
        applied: list[Migration] = []
        for migration in sorted(migrations, key=lambda m: (m.component, m.version)):
            with self.write() as conn:
                self.lock(conn, _MIGRATIONS_LOCK)
                done = conn.execute(
                    "SELECT 1 FROM schema_migrations WHERE component = ? AND version = ?",
                    (migration.component, migration.version),
                ).fetchone()
                if done:
                    continue
                conn.execute(migration.sql)
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
        return int(row[0] or 0) if row is not None else 0
