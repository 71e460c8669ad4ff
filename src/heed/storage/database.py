"""What every store needs of a SQL database, and the one migration runner.

Two databases implement :class:`SqlDatabase`: SQLite (:class:`heed.storage.sqlite.SqliteDatabase`,
the embedded file) and PostgreSQL (:class:`heed.storage.postgres.PostgresDatabase`, shared by
several processes). Each domain store is one class over either (:mod:`heed.storage.run_store`,
:mod:`heed.storage.session_store`, :mod:`heed.storage.revocation_store`,
:mod:`heed.storage.memory`): it writes one SQL text for both and asks the database only where
the two really differ (:attr:`SqlDatabase.dialect`).

Schemas are stated once too. A :class:`Migration`'s SQL names what the databases spell
differently by placeholder, ``{real}`` for a float column say, and :meth:`Migration.sql_for`
spells it in the database's dialect (:data:`TYPE_WORDS`, and the step's own words where a
clause differs). :func:`apply_migrations` is the runner for every store on either database:
each step in its own transaction with its bookkeeping row in ``schema_migrations``, under a
lock (PostgreSQL: an advisory lock, so instances starting together apply each step once;
SQLite: the writer lock). Versions only grow, and a shipped step is never rewritten: a change
is a new step.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Protocol, TypeVar

__all__ = [
    "DIALECTS",
    "TYPE_WORDS",
    "Migration",
    "SqlDatabase",
    "SqlStore",
    "apply_migrations",
    "read_page",
    "schema_version",
    "split_statements",
]

#: The dialects :class:`SqlDatabase` implementations name.
DIALECTS: Final = ("sqlite", "postgresql")

#: How each dialect spells the types every schema names by placeholder.
TYPE_WORDS: Final[Mapping[str, Mapping[str, str]]] = {
    "sqlite": {
        "real": "REAL",
        "bigint": "INTEGER",
        # SQLite compares text bytewise unless told otherwise.
        "bytewise": "TEXT",
        "timestamp": "TEXT",
        "now": "CURRENT_TIMESTAMP",
    },
    "postgresql": {
        "real": "DOUBLE PRECISION",
        "bigint": "BIGINT",
        # Text compared or sorted (ids, ISO timestamps, names looked up) as on SQLite,
        # whatever the database's locale.
        "bytewise": 'TEXT COLLATE "C"',
        "timestamp": "TIMESTAMPTZ",
        "now": "now()",
    },
}

_PLACEHOLDER: Final = re.compile(r"\{([a-z_]+)\}")
_MIGRATIONS_LOCK: Final = "heed:schema_migrations"


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema step of one component; versions start at 1 and only grow.

    *sql* is the step for both databases: a placeholder ``{word}`` stands where they differ,
    spelled by the step's *words* for the dialect, else by :data:`TYPE_WORDS` (an unknown
    word is a ``KeyError`` when the step is spelled).
    """

    component: str
    version: int
    sql: str
    #: Per dialect, words of this step alone (a clause, an index, a data conversion).
    words: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def sql_for(self, dialect: str) -> str:
        """The step's SQL in *dialect* (``"sqlite"`` or ``"postgresql"``)."""
        spelled = {**TYPE_WORDS[dialect], **self.words.get(dialect, {})}

        def word(match: re.Match[str]) -> str:
            try:
                return spelled[match[1]]
            except KeyError:
                raise KeyError(
                    f"migration {self.component} {self.version}: no {dialect} word {match[1]!r}"
                ) from None

        return _PLACEHOLDER.sub(word, self.sql)


class SqlDatabase(Protocol):
    """What a domain store needs of a SQL database; SQLite
    (:class:`heed.storage.sqlite.SqliteDatabase`) and PostgreSQL
    (:class:`heed.storage.postgres.PostgresDatabase`) implement it.

    Stores write one SQL text for both: ``?`` placeholders, standard SQL plus
    ``RETURNING`` and ``ON CONFLICT``. Where the two must differ, the store asks the
    database: :attr:`dialect` spells the migrations (and picks the memory store's
    per-database part), :attr:`for_update` is appended to a ``SELECT`` whose rows the
    transaction is about to change (:attr:`skip_locked` to one that takes only rows no
    other transaction holds), :meth:`json_text` reads a JSON text column's field, and
    :meth:`lock` serialises check-then-write sequences
    (admission, a bank's writes) across connections and processes.
    """

    #: ``"sqlite"`` or ``"postgresql"``.
    dialect: str
    #: ``" FOR UPDATE"`` where row locks exist, else ``""`` (SQLite's writer lock covers it).
    for_update: str
    #: ``" FOR UPDATE SKIP LOCKED"`` where row locks exist (rows another connection is
    #: claiming are skipped, not waited for), else ``""``.
    skip_locked: str

    def json_text(self, column: str, key: str) -> str:
        """SQL for the text value of *key* in the JSON object text in *column* (both fixed
        identifiers the caller has checked)."""
        ...

    def read(self) -> AbstractContextManager[Any]:
        """A connection for reads; inside :meth:`write` in the same thread, that one."""
        ...

    def write(self) -> AbstractContextManager[Any]:
        """One write transaction (nested blocks in the same thread join it)."""
        ...

    def cancellable(self) -> AbstractContextManager[Any]:
        """A connection for reads whose statements stop, raising
        :class:`~heed.runtime.OperationCancelled`, when the active token is cancelled (SQLite:
        a progress handler; PostgreSQL: a cancel request to the server). Without an active
        token, :meth:`read`."""
        ...

    def lock(self, conn: Any, key: str) -> None:
        """Hold a lock named *key* until the current write transaction ends."""
        ...

    def close(self) -> None: ...


#: The runner's bookkeeping table.
_BOOKKEEPING: Final = Migration(
    "schema_migrations",
    0,
    "CREATE TABLE IF NOT EXISTS schema_migrations ("
    " component TEXT NOT NULL, version INTEGER NOT NULL,"
    " applied_at {timestamp} NOT NULL DEFAULT {now},"
    " PRIMARY KEY (component, version))",
)


def apply_migrations(db: SqlDatabase, migrations: Sequence[Migration]) -> list[Migration]:
    """Apply the *migrations* not yet applied to *db*, in version order per component.

    Each step runs in its own transaction with its bookkeeping row, under the migrations
    lock, so a failed step leaves the schema at the previous version and processes starting
    together apply each step once. Returns the steps applied now.
    """
    with db.write() as conn:
        db.lock(conn, _MIGRATIONS_LOCK)
        conn.execute(_BOOKKEEPING.sql_for(db.dialect))
    applied: list[Migration] = []
    for migration in sorted(migrations, key=lambda m: (m.component, m.version)):
        with db.write() as conn:
            db.lock(conn, _MIGRATIONS_LOCK)
            done = conn.execute(
                "SELECT 1 FROM schema_migrations WHERE component = ? AND version = ?",
                (migration.component, migration.version),
            ).fetchone()
            if done:
                continue
            for statement in split_statements(migration.sql_for(db.dialect)):
                conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_migrations (component, version) VALUES (?, ?)",
                (migration.component, migration.version),
            )
        applied.append(migration)
    return applied


def schema_version(db: SqlDatabase, component: str) -> int:
    """The highest applied version of *component* in *db* (0 when none)."""
    with db.read() as conn:
        row = conn.execute(
            "SELECT MAX(version) FROM schema_migrations WHERE component = ?", (component,)
        ).fetchone()
    return int(row[0] or 0) if row is not None else 0


class SqlStore:
    """The part every domain store shares: the :class:`SqlDatabase` it is given, and
    :meth:`migrate`, which applies its component's :attr:`migrations`."""

    #: The store's component's schema steps (a subclass names its module's list).
    migrations: ClassVar[Sequence[Migration]] = ()

    def __init__(self, db: SqlDatabase) -> None:
        self.db = db

    def migrate(self) -> None:
        """Apply the component's migrations not yet applied (in the database's dialect)."""
        apply_migrations(self.db, self.migrations)


def read_page(
    db: SqlDatabase,
    columns: str,
    source: str,
    params: Sequence[Any],
    order: str,
    limit: int,
    offset: int,
) -> tuple[list[Any], int]:
    """One page of ``SELECT {columns} FROM {source}`` (*source*: the tables and their
    ``WHERE``, whose placeholders *params* fill) in *order*: at most *limit* rows after the
    first *offset*, and how many rows there are in all (both read on one connection)."""
    with db.read() as conn:
        total = conn.execute(f"SELECT COUNT(*) FROM {source}", params).fetchone()[0]
        rows = conn.execute(
            f"SELECT {columns} FROM {source} ORDER BY {order} LIMIT ? OFFSET ?",
            (*params, limit, offset),
        ).fetchall()
    return list(rows), int(total)


def split_statements(sql: str) -> list[str]:
    """Split a migration script into complete statements (a semicolon in a string, a
    comment or a trigger's ``BEGIN ... END`` does not end one; comments alone are no
    statement). Plain text rules, so one splitter serves both databases (no PostgreSQL
    ``$$`` bodies in heed's schemas)."""
    statements: list[str] = []
    buffer = ""
    for line in sql.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            statements.append(buffer.strip())
            buffer = ""
    statements.append(buffer.strip())
    return [s for s in statements if any(_is_code(line) for line in s.splitlines())]


def _is_code(line: str) -> bool:
    text = line.strip()
    return bool(text) and not text.startswith("--")


_Value = TypeVar("_Value")


@functools.cache
def _init_fields(cls: Any) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.init)


def from_row(
    cls: type[_Value],
    row: Any,
    *,
    ints: Iterable[str] = (),
    floats: Iterable[str] = (),
    **values: Any,
) -> _Value:
    """An instance of the dataclass *cls* from a database row (SQLite's or PostgreSQL's: both
    have ``keys()``): each field with a column of the same name takes that column's value,
    unless *values* gives the field (a conversion: JSON, a bool from an integer, a value the
    row does not hold); a field in neither keeps its default, and raises ``TypeError`` if it
    has none. The columns named in *ints* and *floats* (fields *values* does not give) are
    taken as ``int`` and ``float`` (a ``NULL`` stays ``None``): a column's number whatever
    the database gave (SQLite's ``REAL`` column hands back an integral value as ``int``)."""
    build: Callable[..., _Value] = cls
    for kind, names in ((int, ints), (float, floats)):
        for name in names:
            if name not in values:
                value = row[name]
                values[name] = None if value is None else kind(value)
    columns = set(row.keys())
    taken = {
        name: row[name] for name in _init_fields(build) if name in columns and name not in values
    }
    return build(**taken, **values)
