"""Copy a heed SQLite database into PostgreSQL (pgvector), then check the copy.

For a user who outgrows one machine: ``heed migrate`` (:mod:`heed.cli.migrate`) calls
:func:`migrate` with the SQLite file of a stopped server and the URL of the PostgreSQL
database that several servers will share.

What is copied
    Memory: banks, documents, chunks, units (with their vectors and keyword text),
    entities, unit-entity memberships, links and the retain ledger. Sessions with their
    transcripts and wakeups. Runs whose phase is terminal (completed, failed, cancelled,
    interrupted), with their journals and summaries but not their payloads (a run's
    input, read only by the worker that executes it). Runs that are not terminal are left
    out and counted in :attr:`MigrationSummary.left_out`: the server that owned them is
    stopped, so they are stale (a transcript keeps whatever messages they had already
    stored).
    The source is opened read-only and read in one transaction: a consistent snapshot.
    The copier takes no locks in the target: servers may use it meanwhile, but none should
    write to the banks, sessions or runs being copied.

How
    The target schema is created first by the target stores' own ``migrate()``
    (:class:`SqlRunStore`, :class:`SqlSessionStore`, :class:`PgMemoryStore` sized to the
    source vectors: byte length / 4; a target already holding vectors of another size is
    refused). Tables are copied in batches (``batch_size`` rows), each batch one
    transaction. Every table is read in pages by rowid (units by seq) over the whole file,
    so a page is one range scan however many banks there are. Values are copied as they
    are (same JSON text, same ISO timestamps, same epoch floats), except: a float32
    ``BLOB`` becomes a pgvector value (exactly: the literal round-trips float32); the
    unit's keyword ``tsvector`` is built from SQLite's ``memory_fts.body`` for that unit
    (its index text) with the expression :class:`PgMemoryStore` uses at insert
    (``to_tsvector('simple', bank token) || to_tsvector('english', index text)``); NUL
    characters, which PostgreSQL text cannot hold, become U+FFFD as in the store.

Idempotency
    Every insert is ``ON CONFLICT DO NOTHING`` on the table's natural key (ids,
    ``(bank_ref, document_id)``, ``(run_id, seq)``, ``(session_id, idx)``,
    ``(unit_seq, entity_id)``, ``(from_seq, to_seq, link_type)``, ...), and units are
    matched by id, so running the migration again copies nothing and reports 0; an
    interrupted run resumes where it stopped. Rows already in the target are counted in
    :attr:`MigrationSummary.existing`. A bank whose ``(tenant, bank_id)`` exists in the
    target under another ref is refused before anything is written (its rows could not be
    told apart).

Seq remapping
    ``memory_units.seq`` is the target's to assign: it comes from the column's identity
    sequence, which steps by :data:`SEQ_BLOCK` per value, as in :class:`PgMemoryStore`.
    The source units are read in seq order and cut into *runs*: units of one bank and one
    document with consecutive source seqs (a document written at once is one run; an
    appended document or a deleted unit starts a new run). Each run takes ``nextval``
    once per :data:`SEQ_BLOCK` units and numbers its units from there, so units that were
    neighbours in the source (recall's ``seq +- 1`` expansion, same document) are
    neighbours in the target and no others are, and the order of seqs is kept. A
    batch holds whole runs, so a run is written whole or not at all. Units whose id is
    already in the target keep their seq there (a unit missing from a run that is
    otherwise there, say deleted by hand, comes back in a block of its own).
    ``memory_unit_entities.unit_seq`` and ``memory_links.from_seq/to_seq`` are then
    translated batch by batch, source seq -> unit id -> target seq, and entity ids through
    the target's ``(bank_ref, canonical)`` row (the same id after a plain copy; the
    target's own when it already had that entity). Rows that point at no unit are left
    out and counted.

Verification (:func:`verify`, run at the end of :func:`migrate` and on its own)
    Counts: per bank, source and target must hold the same number of documents, chunks,
    units, units with a vector, entities, memberships, links and ledger rows; for
    sessions, messages, wakeups, (terminal) runs and journal events, every source row's
    key must be in the target. Recall: for each bank, up to ``queries`` units sampled
    deterministically (the first by id; ids are random UUIDs) are used as queries, their
    text recalled on a :class:`MemoryEngine` over the SQLite store and one over the
    PostgreSQL store; reported are the share of queries whose top hit is the same unit
    id and the mean overlap of the top 10 ids. The check fails when a count differs or
    the top-1 agreement is below :data:`MIN_TOP1_AGREEMENT`.

Storage does not import :mod:`heed.settings`: the engines for the recall check come from
an :data:`EngineFactory` (:func:`engine_factory_for` makes one from a ``Settings``).
Everything here blocks (the recall check runs its own event loop): call it from a thread
when inside one.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import psycopg
from psycopg_pool import PoolTimeout

from heed.memory import MemoryEngine, build_embedder, build_memory_engine
from heed.memory.embeddings import Embedder
from heed.memory.models import Bank, InvalidInput, RecallQuery
from heed.memory.store import MemoryStore
from heed.runs.model import TERMINAL_PHASES
from heed.runtime import Lane, Lanes, RequestContext, use_context
from heed.storage.database import Database
from heed.storage.memory_store import MEMORY_MIGRATIONS, SqliteMemoryStore, bank_token
from heed.storage.pg_memory_store import (
    DEFAULT_DIM,
    SEQ_BLOCK,
    PgMemoryStore,
    SchemaMismatch,
)
from heed.storage.postgres import Connection, PostgresDatabase, is_postgres_url
from heed.storage.run_store import MIGRATIONS as RUN_MIGRATIONS
from heed.storage.run_store import SqlRunStore
from heed.storage.session_store import MIGRATIONS as SESSION_MIGRATIONS
from heed.storage.session_store import SqlSessionStore

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_VERIFY_QUERIES",
    "MIN_TOP1_AGREEMENT",
    "BankRecall",
    "CountCheck",
    "EngineFactory",
    "MigrationError",
    "MigrationSummary",
    "Progress",
    "Verification",
    "engine_factory_for",
    "migrate",
    "sqlite_source_path",
    "verify",
]

DEFAULT_BATCH_SIZE: Final = 500
DEFAULT_VERIFY_QUERIES: Final = 20
#: The least share of recall queries whose top hit must be the same unit on both sides.
MIN_TOP1_AGREEMENT: Final = 0.9
#: Results compared per recall query.
TOP_K: Final = 10
#: A query is the unit's text cut to this many characters (recall refuses long queries).
MAX_QUERY_CHARS: Final = 400
#: Keys per lookup when counting the target's copies of source rows.
KEY_BATCH: Final = 2000

#: The schema versions this heed writes; a source at another version is refused.
SOURCE_SCHEMA: Final = {
    "memory": max(m.version for m in MEMORY_MIGRATIONS),
    "runs": max(m.version for m in RUN_MIGRATIONS),
    "sessions": max(m.version for m in SESSION_MIGRATIONS),
}

_TERMINAL_SQL: Final = ", ".join(f"'{p.value}'" for p in sorted(TERMINAL_PHASES))

#: Builds a memory engine over a store (for the recall check).
EngineFactory = Callable[[MemoryStore], MemoryEngine]


class MigrationError(RuntimeError):
    """The migration cannot proceed; the message names the problem for the user."""


class Progress(Protocol):
    """Where :func:`migrate` and :func:`verify` report progress (a CLI progress bar)."""

    def start(self, phase: str, total: int) -> None:
        """A phase (``"copy"``, ``"verify"``) of *total* steps (rows, queries) begins."""
        ...

    def advance(self, label: str, steps: int) -> None:
        """*steps* more are done; *label* names what is being worked on (a table)."""
        ...

    def finish(self) -> None:
        """The current phase is over."""
        ...


class _NoProgress:
    def start(self, phase: str, total: int) -> None:
        pass

    def advance(self, label: str, steps: int) -> None:
        pass

    def finish(self) -> None:
        pass


# -- reports --------------------------------------------------------------------------------


@dataclass(slots=True)
class CountCheck:
    """One table's row count in one scope (a bank, or ``"all"``), source against target."""

    scope: str
    table: str
    source: int
    target: int

    @property
    def ok(self) -> bool:
        return self.source == self.target


@dataclass(slots=True)
class BankRecall:
    """The recall comparison of one bank."""

    tenant: str
    bank_id: str
    queries: int
    top1_same: int
    top10_overlap_sum: float
    #: Ids of the query units whose top hit differed (at most 10 listed).
    differing: list[str] = field(default_factory=list)

    @property
    def top1_agreement(self) -> float:
        return self.top1_same / self.queries if self.queries else 1.0

    @property
    def mean_top10_overlap(self) -> float:
        return self.top10_overlap_sum / self.queries if self.queries else 1.0


@dataclass(slots=True)
class Verification:
    """Counts and the recall comparison (see the module docstring)."""

    counts: list[CountCheck]
    recall: list[BankRecall]
    min_top1: float = MIN_TOP1_AGREEMENT

    @property
    def mismatches(self) -> list[CountCheck]:
        return [c for c in self.counts if not c.ok]

    @property
    def queries(self) -> int:
        return sum(b.queries for b in self.recall)

    @property
    def top1_agreement(self) -> float:
        n = self.queries
        return sum(b.top1_same for b in self.recall) / n if n else 1.0

    @property
    def mean_top10_overlap(self) -> float:
        n = self.queries
        return sum(b.top10_overlap_sum for b in self.recall) / n if n else 1.0

    @property
    def ok(self) -> bool:
        return not self.mismatches and self.top1_agreement >= self.min_top1

    def problems(self) -> list[str]:
        """What failed, one line each (empty when :attr:`ok`)."""
        out = [
            f"{c.table} ({c.scope}): {c.source} in the source, {c.target} in the target"
            for c in self.mismatches
        ]
        if self.top1_agreement < self.min_top1:
            out.append(
                f"recall top-1 agreement {self.top1_agreement:.3f} is below {self.min_top1}"
                f" ({self.queries} queries)"
            )
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "problems": self.problems(),
            "counts_checked": len(self.counts),
            "count_mismatches": [asdict(c) for c in self.mismatches],
            "recall": {
                "queries": self.queries,
                "top1_agreement": round(self.top1_agreement, 4),
                "mean_top10_overlap": round(self.mean_top10_overlap, 4),
                "min_top1_agreement": self.min_top1,
                "banks": [
                    {
                        "tenant": b.tenant,
                        "bank_id": b.bank_id,
                        "queries": b.queries,
                        "top1_agreement": round(b.top1_agreement, 4),
                        "mean_top10_overlap": round(b.mean_top10_overlap, 4),
                        "differing": b.differing,
                    }
                    for b in self.recall
                ],
            },
        }


@dataclass(slots=True)
class MigrationSummary:
    """What a migration did. ``copied``: rows inserted now, per table; ``existing``: source
    rows already in the target (a second run has them all there); ``left_out``: source rows
    not copied on purpose (non-terminal runs and their journal events)."""

    source: str
    target: str
    dim: int
    copied: dict[str, int]
    existing: dict[str, int]
    left_out: dict[str, int]
    seconds: float = 0.0
    verification: Verification | None = None

    @property
    def total_copied(self) -> int:
        return sum(self.copied.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "target": self.target,
            "dim": self.dim,
            "copied": dict(self.copied),
            "total_copied": self.total_copied,
            "existing": dict(self.existing),
            "left_out": dict(self.left_out),
            "seconds": round(self.seconds, 3),
            "verification": self.verification.as_dict() if self.verification else None,
        }


# -- locations ------------------------------------------------------------------------------


def sqlite_source_path(value: str | Path) -> Path:
    """The file a ``--from`` value names: a plain path or a ``sqlite:///`` URL.

    URLs follow SQLAlchemy's convention: ``sqlite:///relative.db``,
    ``sqlite:////absolute.db``. When the relative reading names no file but the absolute
    one does (``sqlite:///home/me/heed.db``), the absolute one is used. Raises
    :class:`MigrationError` when the file does not exist.
    """
    text = str(value)
    if text.startswith("sqlite:"):
        rest = text.removeprefix("sqlite:")
        if not rest.startswith("///"):
            raise MigrationError(
                f"{text!r} is not a sqlite:/// URL: use sqlite:///relative/path.db, "
                "sqlite:////absolute/path.db or a plain path"
            )
        rest = rest[3:].split("?", 1)[0]
        path = Path(rest)
        if not path.is_absolute() and not path.exists() and Path("/" + rest).exists():
            path = Path("/" + rest)
    else:
        path = Path(text)
    path = path.expanduser()
    if not path.exists():
        raise MigrationError(f"source database {path} does not exist")
    if not path.is_file():
        raise MigrationError(f"source database {path} is not a file")
    return path


def redact(url: str) -> str:
    """*url* without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


# -- the source -----------------------------------------------------------------------------


class _Source:
    """The SQLite file, read-only, inside one read transaction (a consistent snapshot)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.conn = sqlite3.connect(
                f"{path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None
            )
            self.conn.row_factory = sqlite3.Row
            self.conn.execute("PRAGMA busy_timeout = 10000")
            self.conn.execute("BEGIN")
            names = {
                str(r[0])
                for r in self.conn.execute(
                    "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')"
                )
            }
        except sqlite3.DatabaseError as exc:
            raise MigrationError(f"cannot read {path} as a SQLite database: {exc}") from exc
        if "schema_migrations" not in names:
            self.close()
            raise MigrationError(f"{path} is not a heed database (no schema_migrations table)")
        versions = {
            str(r[0]): int(r[1])
            for r in self.conn.execute(
                "SELECT component, MAX(version) FROM schema_migrations GROUP BY component"
            )
        }
        for component, expected in SOURCE_SCHEMA.items():
            found = versions.get(component)
            if found is None or found == expected:
                continue
            self.close()
            if found < expected:
                raise MigrationError(
                    f"{path}: its {component} schema is at version {found}, this heed writes "
                    f"version {expected}; start this heed version on it once (heed serve) to "
                    "upgrade it, then migrate"
                )
            raise MigrationError(
                f"{path}: its {component} schema is at version {found}, newer than this heed "
                f"knows ({expected}); migrate with the heed version that wrote it"
            )
        self.components = {c for c in SOURCE_SCHEMA if c in versions}

    def has(self, component: str) -> bool:
        return component in self.components

    def scalar(self, sql: str, params: Sequence[Any] = ()) -> int:
        row = self.conn.execute(sql, tuple(params)).fetchone()
        return int(row[0] or 0) if row is not None else 0

    def pages(
        self, sql: str, params: Sequence[Any], batch: int, key: str
    ) -> Iterator[list[sqlite3.Row]]:
        """Rows of *sql* in pages of *batch*, by the integer expression *key* ascending.

        *sql* selects *key* as its column ``_k`` and ends in a ``WHERE`` clause, to which
        ``AND key > ? ORDER BY key LIMIT ?`` is added (keyset paging: each page is an
        index range scan however far in).
        """
        after = -(2**63)
        while True:
            rows = self.conn.execute(
                f"{sql} AND {key} > ? ORDER BY {key} LIMIT ?", (*params, after, batch)
            ).fetchall()
            if not rows:
                return
            yield rows
            after = int(rows[-1]["_k"])
            if len(rows) < batch:
                return

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.conn.execute("ROLLBACK")
        self.conn.close()


# -- the target -----------------------------------------------------------------------------


def _probe_target(url: str, connect_timeout: float) -> None:
    """Fail early, with the server's own words, when the target is unusable."""
    if not is_postgres_url(url):
        raise MigrationError(f"the target {redact(url)!r} is not a postgresql:// URL")
    try:
        with psycopg.connect(
            url, autocommit=True, connect_timeout=max(1, round(connect_timeout))
        ) as conn:
            installed = conn.execute(
                "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
            ).fetchone()
            if installed is None:
                available = conn.execute(
                    "SELECT default_version FROM pg_available_extensions WHERE name = 'vector'"
                ).fetchone()
                if available is None:
                    raise MigrationError(
                        f"the target PostgreSQL ({redact(url)}) has no pgvector extension: "
                        "install pgvector 0.8 or later on that server"
                    )
                return  # the memory migration creates it (CREATE EXTENSION IF NOT EXISTS)
            visible = conn.execute("SELECT to_regtype('vector')").fetchone()
            if visible is None or visible[0] is None:
                raise MigrationError(
                    f"pgvector is installed in the target ({redact(url)}) but its type is "
                    "not on the connection's search_path: add the extension's schema to it"
                )
    except psycopg.Error as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise MigrationError(f"cannot reach the target PostgreSQL {redact(url)}: {detail}") from exc


def _open_target(url: str, connect_timeout: float) -> PostgresDatabase:
    _probe_target(url, connect_timeout)
    try:
        return PostgresDatabase(url, pool_size=4, connect_timeout=connect_timeout)
    except (psycopg.Error, PoolTimeout) as exc:
        raise MigrationError(f"cannot reach the target PostgreSQL {redact(url)}: {exc}") from exc


def _target_dim(db: PostgresDatabase) -> int | None:
    """The vector size of the target's ``memory_units.embedding``, if that table exists."""
    with db.read() as conn:
        row = conn.execute(
            "SELECT a.atttypmod FROM pg_attribute a"
            " WHERE a.attrelid = to_regclass('memory_units') AND a.attname = 'embedding'"
        ).fetchone()
    return int(row[0]) if row is not None and row[0] is not None and int(row[0]) > 0 else None


def _source_dim(src: _Source) -> int | None:
    if not src.has("memory"):
        return None
    sizes = sorted(
        int(r[0])
        for r in src.conn.execute(
            "SELECT DISTINCT length(embedding) FROM memory_units WHERE embedding IS NOT NULL"
        )
    )
    if not sizes:
        return None
    if len(sizes) > 1 or sizes[0] % 4:
        raise MigrationError(
            f"{src.path} holds unit vectors of several sizes ({', '.join(map(str, sizes))} "
            "bytes); a PostgreSQL bank holds one size: re-embed the banks first"
        )
    return sizes[0] // 4


def _migrate_target(db: PostgresDatabase, dim: int) -> None:
    try:
        SqlRunStore(db).migrate()
        SqlSessionStore(db).migrate()
        PgMemoryStore(db, dim).migrate()
    except SchemaMismatch as exc:
        raise MigrationError(f"the target cannot take this source: {exc}") from exc
    except psycopg.Error as exc:
        raise MigrationError(f"could not create heed's schema in the target: {exc}") from exc


# -- values ---------------------------------------------------------------------------------


def _clean(value: Any) -> Any:
    """*value* storable in PostgreSQL (text cannot hold NUL)."""
    if isinstance(value, str) and "\x00" in value:
        return value.replace("\x00", "\ufffd")
    return value


def _one(cursor: Any) -> Any:
    """The first column of a query's one row (``None`` when there is no row)."""
    row = cursor.fetchone()
    return None if row is None else row[0]


def _vector(blob: bytes | None) -> str | None:
    """A float32 BLOB as a pgvector literal that round-trips float32 exactly."""
    if blob is None:
        return None
    values = np.frombuffer(blob, dtype=np.float32).tolist()
    return "[" + ",".join(map(repr, values)) + "]"


# -- copying --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Plain:
    """A table copied row for row (sessions and runs)."""

    table: str
    columns: tuple[str, ...]
    #: The source rows: ``FROM`` and ``WHERE`` over alias ``t`` (the copied table).
    source: str = ""
    where: str = "1 = 1"

    @property
    def select(self) -> str:
        columns = ", ".join(f"t.{c}" for c in self.columns)
        return f"SELECT t.rowid AS _k, {columns} FROM {self.source} WHERE {self.where}"

    @property
    def count(self) -> str:
        return f"SELECT COUNT(*) FROM {self.source} WHERE {self.where}"


def _plain(table: str, columns: str, source: str = "", where: str = "1 = 1") -> _Plain:
    names = tuple(c.strip() for c in columns.split(","))
    return _Plain(table, names, source or f"{table} t", where)


_TERMINAL_RUN: Final = f"phase IN ({_TERMINAL_SQL})"

#: In copy order. Journals of runs left out stay behind with them.
PLAIN_TABLES: Final = (
    _plain("sessions", "id, tenant, title, bank_id, created_at, updated_at, remember_messages"),
    _plain(
        "session_messages",
        "id, session_id, idx, role, content, created_at, run_id, status, source, tool_calls,"
        " tool_call_id, name",
    ),
    _plain("session_wakeups", "id, session_id, task_run_id, summary, created_at, delivered_run_id"),
    _plain(
        "runs",
        "id, kind, tenant, session_id, phase, source, created_at, started_at, cancelled_at,"
        " finished_at, cancel_reason, error, worker_id, lease_expires_at, summary, result,"
        " last_seq, first_seq, journal_closed",
        where=f"t.{_TERMINAL_RUN}",
    ),
    _plain(
        "run_events",
        "run_id, seq, type, data, ts",
        source="run_events t JOIN runs r ON r.id = t.run_id",
        where=f"r.{_TERMINAL_RUN}",
    ),
)

#: Memory tables copied row for row, in copy order (foreign keys: banks first).
MEMORY_PLAIN_TABLES: Final = (
    _plain(
        "memory_banks",
        "ref, tenant, bank_id, name, mission, background, disposition, config, created_at,"
        " updated_at, last_write_at",
    ),
    # Tags and metadata shared by units and documents (heed.storage.memory_values).
    _plain("memory_values", "bank_ref, digest, body"),
    _plain(
        "memory_documents",
        "bank_ref, document_id, original_text, content_hash, metadata, metadata_ref, tags,"
        " tags_ref, created_at, updated_at",
    ),
    _plain("memory_chunks", "id, bank_ref, document_id, chunk_index, text"),
    _plain("memory_entities", "id, bank_ref, canonical, name, type"),
    _plain(
        "memory_retain_ledger",
        "bank_ref, idempotency_key, document_index, document_id, units, fingerprint, created_at",
    ),
)

_COMPONENT_OF: Final = {
    "sessions": "sessions",
    "session_messages": "sessions",
    "session_wakeups": "sessions",
    "runs": "runs",
    "run_events": "runs",
    **{spec.table: "memory" for spec in MEMORY_PLAIN_TABLES},
}

#: The memory tables (what verification counts per bank).
BANK_TABLES: Final = (
    "memory_banks",
    "memory_values",
    "memory_documents",
    "memory_chunks",
    "memory_units",
    "memory_entities",
    "memory_unit_entities",
    "memory_links",
    "memory_retain_ledger",
)

_UNIT_COLUMNS: Final = (
    "seq, id, bank_ref, document_id, chunk_id, text, fact_type, context, context_ref,"
    " occurred_start, occurred_end, mentioned_at, metadata, metadata_ref, tags, tags_ref,"
    " embedding, keywords, created_at, updated_at, token_count"
)

#: Values per ``IN (...)`` list on SQLite (older builds allow 999 parameters).
_SQLITE_IN: Final = 500


def _insert_sql(table: str, columns: Sequence[str]) -> str:
    marks = ", ".join("?" * len(columns))
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks}) ON CONFLICT DO NOTHING"


def _source_bank_counts(src: _Source) -> dict[str, dict[str, int]]:
    """Per bank ref, per table: the rows the source holds (what verification compares)."""
    counts: dict[str, dict[str, int]] = {}
    if not src.has("memory"):
        return counts
    for (ref,) in src.conn.execute("SELECT ref FROM memory_banks ORDER BY ref"):
        counts[str(ref)] = {t: 0 for t in (*BANK_TABLES, "memory_units.embedding")}
        counts[str(ref)]["memory_banks"] = 1
    for table, sql in _bank_count_queries("").items():
        for ref, n in src.conn.execute(sql):
            if str(ref) in counts:
                counts[str(ref)][table] = int(n)
    return counts


def _bank_count_queries(where: str) -> dict[str, str]:
    """``SELECT bank_ref, COUNT(*) ... GROUP BY bank_ref`` per table; *where* filters refs."""
    out = {}
    for table in (
        "memory_values",
        "memory_documents",
        "memory_chunks",
        "memory_entities",
        "memory_retain_ledger",
    ):
        out[table] = (
            f"SELECT bank_ref, COUNT(*) FROM {table} t {where.format(ref='t.bank_ref')}"
            " GROUP BY bank_ref"
        )
    out["memory_units"] = (
        f"SELECT bank_ref, COUNT(*) FROM memory_units u {where.format(ref='u.bank_ref')}"
        " GROUP BY bank_ref"
    )
    out["memory_units.embedding"] = (
        f"SELECT bank_ref, COUNT(embedding) FROM memory_units u"
        f" {where.format(ref='u.bank_ref')} GROUP BY bank_ref"
    )
    out["memory_unit_entities"] = (
        "SELECT u.bank_ref, COUNT(*) FROM memory_unit_entities x JOIN memory_units u"
        f" ON u.seq = x.unit_seq {where.format(ref='u.bank_ref')} GROUP BY u.bank_ref"
    )
    out["memory_links"] = (
        "SELECT u.bank_ref, COUNT(*) FROM memory_links x JOIN memory_units u"
        f" ON u.seq = x.from_seq {where.format(ref='u.bank_ref')} GROUP BY u.bank_ref"
    )
    return out


class _Copier:
    """One migration's state: the two databases, the counters, the progress sink.

    Every table is read in pages by rowid (units by seq) over the whole file, not bank by
    bank: each page is then one range scan of the table, however many banks there are.
    """

    def __init__(self, src: _Source, dst: PostgresDatabase, batch: int, progress: Progress) -> None:
        self.src = src
        self.dst = dst
        self.batch = batch
        self.progress = progress
        self.copied: dict[str, int] = {}
        self.existing: dict[str, int] = {}
        self.left_out: dict[str, int] = {}

    def _count(self, table: str, offered: int, inserted: int, read: int | None = None) -> None:
        """*offered* rows written with ON CONFLICT DO NOTHING, *inserted* of them new;
        *read* source rows done (more than offered when some were left out)."""
        self.copied[table] = self.copied.get(table, 0) + inserted
        self.existing[table] = self.existing.get(table, 0) + offered - inserted
        self.progress.advance(table, offered if read is None else read)

    def _leave_out(self, table: str, n: int) -> None:
        if n:
            self.left_out[table] = self.left_out.get(table, 0) + n

    # -- the plan ------------------------------------------------------------------

    def plan(self) -> int:
        """Source rows to read (the progress total); fills ``left_out`` with the runs."""
        total = 0
        for spec in (*PLAIN_TABLES, *MEMORY_PLAIN_TABLES):
            self.copied[spec.table] = 0
            self.existing[spec.table] = 0
            if self.src.has(_COMPONENT_OF[spec.table]):
                total += self.src.scalar(spec.count)
        for table in ("memory_units", "memory_unit_entities", "memory_links"):
            self.copied[table] = 0
            self.existing[table] = 0
            if self.src.has("memory"):
                total += self.src.scalar(f"SELECT COUNT(*) FROM {table}")
        if self.src.has("runs"):
            self.left_out["runs"] = self.src.scalar(
                f"SELECT COUNT(*) FROM runs WHERE phase NOT IN ({_TERMINAL_SQL})"
            )
            self.left_out["run_events"] = self.src.scalar(
                "SELECT COUNT(*) FROM run_events e JOIN runs r ON r.id = e.run_id"
                f" WHERE r.phase NOT IN ({_TERMINAL_SQL})"
            )
        return total

    # -- tables copied row for row -------------------------------------------------

    def _copy_plain(self, spec: _Plain) -> None:
        if not self.src.has(_COMPONENT_OF[spec.table]):
            return
        insert = _insert_sql(spec.table, spec.columns)
        for rows in self.src.pages(spec.select, (), self.batch, "t.rowid"):
            values = [tuple(_clean(r[c]) for c in spec.columns) for r in rows]
            with self.dst.write() as conn:
                inserted = conn.executemany(insert, values).rowcount
            self._count(spec.table, len(values), max(0, inserted))

    def copy_sessions_and_runs(self) -> None:
        for spec in PLAIN_TABLES:
            self._copy_plain(spec)

    # -- memory --------------------------------------------------------------------

    def check_banks(self) -> None:
        """Refuse banks whose ``(tenant, bank_id)`` the target holds under another ref."""
        if not self.src.has("memory"):
            return
        banks = self.src.conn.execute("SELECT ref, tenant, bank_id FROM memory_banks").fetchall()
        clashes: list[str] = []
        with self.dst.read() as conn:
            for start in range(0, len(banks), KEY_BATCH):
                part = banks[start : start + KEY_BATCH]
                rows = conn.execute(
                    "SELECT b.ref, b.tenant, b.bank_id FROM memory_banks b"
                    " JOIN unnest(?::text[], ?::text[]) AS k(tenant, bank_id)"
                    " ON b.tenant = k.tenant AND b.bank_id = k.bank_id",
                    ([_clean(b["tenant"]) for b in part], [_clean(b["bank_id"]) for b in part]),
                ).fetchall()
                theirs = {(r[1], r[2]): r[0] for r in rows}
                for b in part:
                    ref = theirs.get((_clean(b["tenant"]), _clean(b["bank_id"])))
                    if ref is not None and ref != b["ref"]:
                        clashes.append(f"{b['tenant']}/{b['bank_id']}")
        if clashes:
            raise MigrationError(
                "the target already has other banks named "
                + ", ".join(sorted(clashes)[:10])
                + (" ..." if len(clashes) > 10 else "")
                + " (tenant/bank_id); delete or rename them there first"
            )

    def copy_memory(self) -> None:
        if not self.src.has("memory"):
            return
        banks, values, documents, chunks, entities, ledger = MEMORY_PLAIN_TABLES
        for spec in (banks, values, documents, chunks):
            self._copy_plain(spec)
        self._copy_units()
        self._copy_plain(entities)
        self._copy_memberships()
        self._copy_links()
        self._copy_plain(ledger)

    def _unit_runs(self) -> Iterator[list[sqlite3.Row]]:
        """The units in seq order, cut into runs (see the module docstring)."""
        select = (
            "SELECT u.seq AS _k, u.id, u.bank_ref, u.document_id, u.chunk_id, u.text,"
            " u.fact_type, u.context, u.context_ref, u.occurred_start, u.occurred_end,"
            " u.mentioned_at,"
            " u.metadata, u.metadata_ref, u.tags, u.tags_ref, u.embedding, u.created_at,"
            " u.updated_at, u.token_count, f.body"
            " FROM memory_units u LEFT JOIN memory_fts f ON f.rowid = u.seq WHERE 1 = 1"
        )
        run: list[sqlite3.Row] = []
        for rows in self.src.pages(select, (), self.batch, "u.seq"):
            for row in rows:
                last = run[-1] if run else None
                if last is not None and (
                    row["_k"] != last["_k"] + 1
                    or row["bank_ref"] != last["bank_ref"]
                    or row["document_id"] != last["document_id"]
                ):
                    yield run
                    run = []
                run.append(row)
        if run:
            yield run

    def _copy_units(self) -> None:
        """Copy the units in batches of whole runs."""
        pending: list[list[sqlite3.Row]] = []
        size = 0
        for run in self._unit_runs():
            if pending and size + len(run) > self.batch:
                self._write_units(pending)
                pending, size = [], 0
            pending.append(run)
            size += len(run)
        if pending:
            self._write_units(pending)

    def _write_units(self, runs: list[list[sqlite3.Row]]) -> None:
        """One transaction: skip the runs' units already in the target, insert the others
        with seqs allocated run by run."""
        ids = [_clean(u["id"]) for run in runs for u in run]
        with self.dst.write() as conn:
            there = {
                str(r[0]): str(r[1])
                for r in conn.execute(
                    "SELECT id, bank_ref FROM memory_units WHERE id = ANY(?::text[])", (ids,)
                ).fetchall()
            }
            missing: list[list[sqlite3.Row]] = []
            for run in runs:
                new = []
                for unit in run:
                    bank = there.get(_clean(unit["id"]))
                    if bank is None:
                        new.append(unit)
                    elif bank != unit["bank_ref"]:
                        raise MigrationError(
                            f"unit {unit['id']} is in the target under another bank ({bank})"
                        )
                if new:
                    missing.append(new)
            starts = self._allocate(conn, sum(-(-len(run) // SEQ_BLOCK) for run in missing))
            rows: list[tuple[Any, ...]] = []
            for run in missing:
                blocks = -(-len(run) // SEQ_BLOCK)
                mine, starts = starts[:blocks], starts[blocks:]
                seqs = [start + i for start in mine for i in range(SEQ_BLOCK)]
                rows.extend(_unit_row(seq, unit) for seq, unit in zip(seqs, run, strict=False))
            inserted = 0
            if rows:
                inserted = conn.executemany(
                    f"INSERT INTO memory_units ({_UNIT_COLUMNS}) VALUES"
                    " (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?::vector,"
                    " to_tsvector('simple', ?) || to_tsvector('english', ?),?,?,?)"
                    " ON CONFLICT DO NOTHING",
                    rows,
                ).rowcount
                if inserted != len(rows):
                    raise MigrationError(
                        "units appeared in the target while this migration wrote them; "
                        "stop the servers writing to it and run the migration again"
                    )
        self._count("memory_units", len(ids), inserted)

    @staticmethod
    def _allocate(conn: Connection, blocks: int) -> list[int]:
        """*blocks* values of the unit seq's identity sequence, ascending."""
        if blocks == 0:
            return []
        return sorted(
            int(r[0])
            for r in conn.execute(
                "SELECT nextval(pg_get_serial_sequence('memory_units', 'seq'))"
                " FROM generate_series(1, ?)",
                (blocks,),
            ).fetchall()
        )

    def _target_seqs(self, conn: Connection, seqs: set[int]) -> dict[int, int]:
        """Source seq -> target seq of the units with these source seqs (by unit id)."""
        ids: dict[str, int] = {}
        ordered = sorted(seqs)
        for start in range(0, len(ordered), _SQLITE_IN):
            part = ordered[start : start + _SQLITE_IN]
            for seq, unit_id in self.src.conn.execute(
                f"SELECT seq, id FROM memory_units WHERE seq IN ({', '.join('?' * len(part))})",
                part,
            ):
                ids[_clean(unit_id)] = int(seq)
        if not ids:
            return {}
        return {
            ids[str(r[0])]: int(r[1])
            for r in conn.execute(
                "SELECT id, seq FROM memory_units WHERE id = ANY(?::text[])", (list(ids),)
            ).fetchall()
        }

    def _target_entities(self, conn: Connection, entity_ids: set[str]) -> dict[str, str]:
        """Source entity id -> the target's id for the same ``(bank_ref, canonical)``."""
        keys: dict[tuple[str, str], str] = {}
        ordered = sorted(entity_ids)
        for start in range(0, len(ordered), _SQLITE_IN):
            part = ordered[start : start + _SQLITE_IN]
            for entity_id, ref, name in self.src.conn.execute(
                "SELECT id, bank_ref, canonical FROM memory_entities"
                f" WHERE id IN ({', '.join('?' * len(part))})",
                part,
            ):
                keys[(str(ref), _clean(name))] = str(entity_id)
        if not keys:
            return {}
        return {
            keys[(str(r[0]), str(r[1]))]: str(r[2])
            for r in conn.execute(
                "SELECT e.bank_ref, e.canonical, e.id FROM memory_entities e"
                " JOIN unnest(?::text[], ?::text[]) AS k(bank_ref, canonical)"
                " ON e.bank_ref = k.bank_ref AND e.canonical = k.canonical",
                ([k[0] for k in keys], [k[1] for k in keys]),
            ).fetchall()
        }

    def _copy_memberships(self) -> None:
        select = (
            "SELECT x.rowid AS _k, x.unit_seq, x.entity_id FROM memory_unit_entities x WHERE 1 = 1"
        )
        for rows in self.src.pages(select, (), self.batch, "x.rowid"):
            with self.dst.write() as conn:
                seqs = self._target_seqs(conn, {int(r["unit_seq"]) for r in rows})
                entities = self._target_entities(conn, {str(r["entity_id"]) for r in rows})
                values = [
                    (seqs[int(r["unit_seq"])], entities[str(r["entity_id"])])
                    for r in rows
                    if int(r["unit_seq"]) in seqs and str(r["entity_id"]) in entities
                ]
                inserted = 0
                if values:
                    inserted = conn.executemany(
                        _insert_sql("memory_unit_entities", ("unit_seq", "entity_id")), values
                    ).rowcount
            self._leave_out("memory_unit_entities", len(rows) - len(values))  # dangling rows
            self._count("memory_unit_entities", len(values), max(0, inserted), len(rows))

    def _copy_links(self) -> None:
        select = (
            "SELECT x.rowid AS _k, x.from_seq, x.to_seq, x.link_type, x.weight"
            " FROM memory_links x WHERE 1 = 1"
        )
        for rows in self.src.pages(select, (), self.batch, "x.rowid"):
            with self.dst.write() as conn:
                seqs = self._target_seqs(
                    conn, {int(r[c]) for r in rows for c in ("from_seq", "to_seq")}
                )
                values = [
                    (
                        seqs[int(r["from_seq"])],
                        seqs[int(r["to_seq"])],
                        _clean(r["link_type"]),
                        float(r["weight"]),
                    )
                    for r in rows
                    if int(r["from_seq"]) in seqs and int(r["to_seq"]) in seqs
                ]
                inserted = 0
                if values:
                    inserted = conn.executemany(
                        _insert_sql("memory_links", ("from_seq", "to_seq", "link_type", "weight")),
                        values,
                    ).rowcount
            self._leave_out("memory_links", len(rows) - len(values))  # dangling rows
            self._count("memory_links", len(values), max(0, inserted), len(rows))


def _unit_row(seq: int, unit: sqlite3.Row) -> tuple[Any, ...]:
    """A target ``memory_units`` row (see ``_UNIT_COLUMNS``) from a source row and its seq."""
    ref = str(unit["bank_ref"])
    body = unit["body"] if unit["body"] is not None else unit["text"]
    return (
        seq,
        _clean(unit["id"]),
        ref,
        _clean(unit["document_id"]),
        _clean(unit["chunk_id"]),
        _clean(unit["text"]),
        _clean(unit["fact_type"]),
        _clean(unit["context"]),
        unit["context_ref"],
        unit["occurred_start"],
        unit["occurred_end"],
        unit["mentioned_at"],
        _clean(unit["metadata"]),
        unit["metadata_ref"],
        _clean(unit["tags"]),
        unit["tags_ref"],
        _vector(unit["embedding"]),
        bank_token(ref),
        _clean(body),
        unit["created_at"],
        unit["updated_at"],
        unit["token_count"],
    )


# -- verification ---------------------------------------------------------------------------


def _count_checks(src: _Source, dst: PostgresDatabase) -> list[CountCheck]:
    checks: list[CountCheck] = []
    with dst.read() as conn:
        missing = [
            table
            for table in ("schema_migrations", "memory_units", "sessions", "runs")
            if _one(conn.execute("SELECT to_regclass(?)", (table,))) is None
        ]
    if missing:
        raise MigrationError(
            f"the target has no heed schema (no {', '.join(missing)}); run the migration "
            "without --verify-only first"
        )
    # Memory: per bank, exact counts.
    source = _source_bank_counts(src)
    if source:
        refs = list(source)
        names = {
            str(r[0]): f"bank {r[1]}/{r[2]}"
            for r in src.conn.execute("SELECT ref, tenant, bank_id FROM memory_banks")
        }
        target: dict[str, dict[str, int]] = {ref: {} for ref in refs}
        with dst.read() as conn:
            for (ref,) in conn.execute(
                "SELECT ref FROM memory_banks WHERE ref = ANY(?::text[])", (refs,)
            ).fetchall():
                target[str(ref)]["memory_banks"] = 1
            for table, sql in _bank_count_queries("WHERE {ref} = ANY(?::text[])").items():
                for ref, n in conn.execute(sql, (refs,)).fetchall():
                    target[str(ref)][table] = int(n)
        for ref in refs:
            for table, n in source[ref].items():
                checks.append(CountCheck(names[ref], table, n, target[ref].get(table, 0)))
    # Sessions and runs: every source row's key in the target.
    keyed = [
        ("sessions", "sessions", "SELECT rowid AS _k, id FROM sessions WHERE 1 = 1", "id"),
        (
            "sessions",
            "session_messages",
            "SELECT rowid AS _k, id FROM session_messages WHERE 1 = 1",
            "id",
        ),
        (
            "sessions",
            "session_wakeups",
            "SELECT rowid AS _k, id FROM session_wakeups WHERE 1 = 1",
            "id",
        ),
        (
            "runs",
            "runs",
            f"SELECT rowid AS _k, id FROM runs WHERE phase IN ({_TERMINAL_SQL})",
            "id",
        ),
    ]
    for component, table, select, column in keyed:
        if not src.has(component):
            continue
        n_source = n_target = 0
        for rows in src.pages(select, (), KEY_BATCH, "rowid"):
            keys = [_clean(r[column]) for r in rows]
            n_source += len(keys)
            with dst.read() as conn:
                n_target += int(
                    _one(
                        conn.execute(
                            f"SELECT COUNT(*) FROM {table} WHERE {column} = ANY(?::text[])",
                            (keys,),
                        )
                    )
                )
        checks.append(CountCheck("all", table, n_source, n_target))
    if src.has("runs"):
        n_source = n_target = 0
        select = (
            "SELECT e.rowid AS _k, e.run_id, e.seq FROM run_events e JOIN runs r"
            f" ON r.id = e.run_id WHERE r.{_TERMINAL_RUN}"
        )
        for rows in src.pages(select, (), KEY_BATCH, "e.rowid"):
            n_source += len(rows)
            with dst.read() as conn:
                n_target += int(
                    _one(
                        conn.execute(
                            "SELECT COUNT(*) FROM run_events e"
                            " JOIN unnest(?::text[], ?::bigint[]) AS k(run_id, seq)"
                            " ON e.run_id = k.run_id AND e.seq = k.seq",
                            ([_clean(r["run_id"]) for r in rows], [int(r["seq"]) for r in rows]),
                        )
                    )
                )
        checks.append(CountCheck("all", "run_events", n_source, n_target))
    return checks


def _samples(src: _Source, queries: int) -> list[tuple[str, str, str, list[tuple[str, str]]]]:
    """Per bank: ref, tenant, bank_id and up to *queries* (unit id, text), first by id."""
    if not src.has("memory") or queries <= 0:
        return []
    out = []
    for ref, tenant, bank_id in src.conn.execute(
        "SELECT ref, tenant, bank_id FROM memory_banks ORDER BY tenant, bank_id"
    ).fetchall():
        units = [
            (str(r[0]), str(r[1]))
            for r in src.conn.execute(
                "SELECT id, text FROM memory_units WHERE bank_ref = ? ORDER BY id LIMIT ?",
                (ref, queries),
            )
        ]
        if units:
            out.append((str(ref), str(tenant), str(bank_id), units))
    return out


def _query_text(text: str) -> str:
    if len(text) <= MAX_QUERY_CHARS:
        return text
    cut = text[:MAX_QUERY_CHARS]
    return cut.rsplit(" ", 1)[0] if " " in cut else cut


async def _top_ids(engine: MemoryEngine, bank: Bank | None, query: RecallQuery) -> list[str] | None:
    """The ids of the top :data:`TOP_K` hits (``[]`` without the bank, ``None`` when the
    engine refuses the query)."""
    if bank is None:
        return []
    try:
        outcome = await engine.recall(bank, query)
    except InvalidInput:
        return None
    return [hit.unit.id for hit in outcome.hits[:TOP_K]]


async def _compare_recall(
    samples: list[tuple[str, str, str, list[tuple[str, str]]]],
    source_store: MemoryStore,
    target_store: MemoryStore,
    engine_factory: EngineFactory,
    dim: int,
    progress: Progress,
) -> list[BankRecall]:
    lite, pg = engine_factory(source_store), engine_factory(target_store)
    if lite.embedder.dim != dim:
        raise MigrationError(
            f"the configured embedder makes {lite.embedder.dim}-dimensional vectors but the "
            f"banks hold {dim}-dimensional ones: set HEED_EMBEDDINGS_* as the source server "
            "had them"
        )
    results: list[BankRecall] = []
    for _ref, tenant, bank_id, units in samples:
        outcome = BankRecall(tenant, bank_id, 0, 0, 0.0)
        results.append(outcome)
        with use_context(RequestContext(tenant=tenant)):
            bank_a = await asyncio.to_thread(source_store.get_bank, tenant, bank_id)
            bank_b = await asyncio.to_thread(target_store.get_bank, tenant, bank_id)
            for unit_id, text in units:
                query = RecallQuery(query=_query_text(text))
                top_a = await _top_ids(lite, bank_a, query)
                if top_a is not None:  # else not a usable query (say, only punctuation)
                    top_b = await _top_ids(pg, bank_b, query) or []
                    outcome.queries += 1
                    if top_a[:1] == top_b[:1]:
                        outcome.top1_same += 1
                    elif len(outcome.differing) < 10:
                        outcome.differing.append(unit_id)
                    widest = max(len(top_a), len(top_b))
                    outcome.top10_overlap_sum += (
                        len(set(top_a) & set(top_b)) / widest if widest else 1.0
                    )
                progress.advance(f"recall {bank_id}", 1)
    return results


def _verify(
    src: _Source,
    dst: PostgresDatabase,
    dim: int,
    queries: int,
    engine_factory: EngineFactory | None,
    progress: Progress,
) -> Verification:
    counts = _count_checks(src, dst)
    recall: list[BankRecall] = []
    samples = _samples(src, queries) if engine_factory is not None else []
    if samples and engine_factory is not None:
        progress.start("verify", sum(len(s[3]) for s in samples))
        source_db = Database(src.path)
        try:
            recall = asyncio.run(
                _compare_recall(
                    samples,
                    SqliteMemoryStore(source_db),
                    PgMemoryStore(dst, dim),
                    engine_factory,
                    dim,
                    progress,
                )
            )
        finally:
            source_db.close()
            progress.finish()
    return Verification(counts, recall)


# -- entry points ---------------------------------------------------------------------------


def engine_factory_for(settings: Any) -> EngineFactory:
    """Engines for the recall check configured by *settings* (a ``heed.settings.Settings``:
    the embedder and reranker the servers use; storage does not import settings, hence
    the loose type). The embedder loads on the first engine, not here."""
    embedders: list[Embedder] = []

    def make(store: MemoryStore) -> MemoryEngine:
        if not embedders:
            embedders.append(build_embedder(settings))
        # Queries run one at a time: one slot per lane, no wait limit.
        lanes = Lanes([Lane("recall", 1, 16), Lane("retain", 1, 16)])
        return build_memory_engine(settings, store, lanes, embedders[0])

    return make


@contextlib.contextmanager
def _opened(
    source: str | Path, target: str, connect_timeout: float
) -> Iterator[tuple[_Source, PostgresDatabase]]:
    path = sqlite_source_path(source)
    src = _Source(path)
    try:
        dst = _open_target(target, connect_timeout)
        try:
            yield src, dst
        finally:
            dst.close()
    finally:
        src.close()


def migrate(
    source: str | Path,
    target: str,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    verify_queries: int = DEFAULT_VERIFY_QUERIES,
    engine_factory: EngineFactory | None = None,
    progress: Progress | None = None,
    connect_timeout: float = 10.0,
) -> MigrationSummary:
    """Copy *source* (a SQLite file or ``sqlite:///`` URL) into *target* (a
    ``postgresql://`` URL), then verify (see the module docstring).

    The recall check needs *engine_factory* (:func:`engine_factory_for`); without one
    only counts are verified. Raises :class:`MigrationError` for a problem the user must
    fix; the summary's ``verification.ok`` says whether the copy checked out.
    """
    if batch_size < 1:
        raise MigrationError(f"the batch size must be at least 1, got {batch_size}")
    sink = progress or _NoProgress()
    started = time.perf_counter()
    with _opened(source, target, connect_timeout) as (src, dst):
        source_dim, target_dim = _source_dim(src), _target_dim(dst)
        if source_dim is not None and target_dim is not None and source_dim != target_dim:
            raise MigrationError(
                f"the target's memory_units holds {target_dim}-dimensional vectors and the "
                f"source's {source_dim}-dimensional ones: migrate into a new database (or "
                "schema), or re-embed one side"
            )
        dim = source_dim or target_dim or DEFAULT_DIM
        _migrate_target(dst, dim)
        copier = _Copier(src, dst, batch_size, sink)
        copier.check_banks()
        total = copier.plan()
        sink.start("copy", total)
        try:
            copier.copy_sessions_and_runs()
            copier.copy_memory()
        finally:
            sink.finish()
        verification = _verify(src, dst, dim, verify_queries, engine_factory, sink)
        return MigrationSummary(
            source=str(src.path),
            target=redact(target),
            dim=dim,
            copied=copier.copied,
            existing=copier.existing,
            left_out=copier.left_out,
            seconds=time.perf_counter() - started,
            verification=verification,
        )


def verify(
    source: str | Path,
    target: str,
    *,
    queries: int = DEFAULT_VERIFY_QUERIES,
    engine_factory: EngineFactory | None = None,
    progress: Progress | None = None,
    connect_timeout: float = 10.0,
) -> Verification:
    """Compare *target* with *source* without copying anything (see the module docstring)."""
    with _opened(source, target, connect_timeout) as (src, dst):
        dim = _source_dim(src) or _target_dim(dst) or DEFAULT_DIM
        return _verify(src, dst, dim, queries, engine_factory, progress or _NoProgress())
