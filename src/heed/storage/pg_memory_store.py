"""The memory engine's storage on PostgreSQL with pgvector.

Implements :class:`heed.memory.store.VectorSearchingStore` with the same contracts as
:class:`heed.storage.memory_store.SqliteMemoryStore`: the same tables, the same JSON text,
the same ISO timestamp text, the same ordering. What differs is how recall searches, and
that several processes may write at once.

Tables (component ``"memory"``, :func:`pg_memory_migrations`, versions 1-6 as on SQLite):
``memory_banks``, ``memory_documents``, ``memory_chunks``, ``memory_units``,
``memory_entities``, ``memory_unit_entities``, ``memory_links``, ``memory_retain_ledger``,
``memory_values`` (:mod:`heed.storage.memory_values`).
Text that is compared or sorted (ids, timestamps, canonical names) is ``COLLATE "C"``, so
comparisons are bytewise as on SQLite whatever the database's locale. Two columns of
``memory_units`` replace SQLite's side structures:

- ``embedding vector(dim)``: the unit vector, searched in the database through an HNSW
  index (``vector_cosine_ops``, m = 16, ef_construction = 64). No process loads a bank
  into memory, so every process sees every committed write at once. A bank is a filter
  on a table shared by all banks; HNSW applies a filter after walking the graph, so a
  plain index scan could return fewer than *k* rows of a small bank. Each search
  therefore sets, for its own transaction, ``hnsw.iterative_scan = relaxed_order``
  (pgvector 0.8: keep walking until *k* rows pass the filter) and
  ``hnsw.ef_search = max(40, 2k)``; rows come back nearly in order and are sorted here.
  When a bank is a small part of the table the planner reads it through the
  ``(bank_ref, seq)`` index and sorts exactly instead.
- ``keywords tsvector``: written at insert from the unit's index text (config
  ``english``: stemming and stop words, like SQLite's porter tokenizer) plus a
  ``simple`` token naming the bank, so the GIN index intersects a query with the bank's
  postings (SQLite's FTS5 ``bank`` column does the same). :meth:`PgMemoryStore.keyword_search`
  scores Okapi BM25 (k1 = 1.2, b = 0.75, FTS5's idf floor of 1e-6) in one SQL statement:
  idf from the bank's unit count and each term's matching units, term frequency from
  ``ts_rank`` of the term alone scaled so that one occurrence counts 1 (exact for the
  usual single occurrence, saturating a little faster above), document length from the
  lexeme count against the average over the matching units. Scores are positive, higher
  is better: the convention of the SQLite store (``-bm25()``), at about its scale, so the
  blend reranker (which divides by the best) and ``min_keyword`` read them alike. (FTS5
  counts documents over all banks; here a bank's statistics are its own.) In a bank of
  more than :data:`KEYWORD_PRUNE_ABOVE_UNITS` units, words estimated (from the planner's
  lexeme statistics) to match more than :data:`KEYWORD_CANDIDATES` units in all are not
  all scored: the rarest words choose the candidates and every word scores them, since a
  word matching much of a bank has a small idf and mostly reorders what the rare ones find.

Seqs: ``memory_units.seq`` comes from the column's identity sequence, which steps by
:data:`SEQ_BLOCK`; a document takes one value per block of units it writes and numbers
its units from there. A document's units are therefore consecutive even while other
processes write, as recall's neighbour expansion (``seq - 1``, ``seq + 1`` in the same
document) expects.

Writes: each write method is one transaction (:meth:`PostgresDatabase.write`). What
SQLite's single writer made atomic holds a transaction-scoped advisory lock on the bank
(``"bank:" + ref``): a document write (ledger check, document append or replace, entity
upserts, links to the bank's latest units) and the deletes. Writers of different banks
do not wait for each other. Rows go in with ``executemany`` (pipelined by psycopg).

Cancellation: a recall query runs on a connection registered with the active token
(:func:`heed.runtime.current_token`). Cancelling the token asks a small thread pool to
send the server a cancel request for that connection (``cancel_safe``; never in the
cancelling thread, which may be the event loop), repeated every
:data:`CANCEL_RETRY_SECONDS` until the query returns in case the first arrived between
two statements. The server stops the statement with ``QueryCanceled``, which surfaces as
:class:`OperationCancelled` with the token's reason; the connection returns to the pool
idle and usable. A cancel is never sent once the block has released the connection.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import struct
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, Protocol

import numpy as np
import psycopg
import psycopg.errors

from heed.memory.idempotency import KEY_TTL_SECONDS, IdempotencyConflict, LedgerEntry, RetainKey
from heed.memory.models import (
    Bank,
    BankStats,
    DocumentInfo,
    PreparedDocument,
    PreparedUnit,
    StoredUnit,
)
from heed.memory.store import BankGone, UnitFilter, VectorChanges, VectorRows, WriteResult
from heed.runtime import CancellationToken, OperationCancelled, current_token, raise_if_cancelled
from heed.storage.database import Migration
from heed.storage.memory_links import ENTITY_LINKS_PER_ENTITY, first_mentions, plan_links
from heed.storage.memory_rows import (
    DOCUMENT_VALUES,
    LAST_UNITS_OF_DOCUMENT,
    UNIT_COLUMNS,
    bank_from_row,
    document_from_row,
    insert_bank,
    iso,
    join_append,
    now_iso,
    read_generation,
    refuse_nul_in_bank,
    refuse_nul_in_document,
    touch_bank,
    unit_from_row,
)
from heed.storage.memory_store import bank_token
from heed.storage.memory_values import ValueWriter, release
from heed.storage.postgres import Connection, PostgresDatabase

__all__ = [
    "DEFAULT_DIM",
    "PG_MEMORY_MIGRATIONS",
    "SEQ_BLOCK",
    "PgMemoryStore",
    "SchemaMismatch",
    "pg_memory_migrations",
]

log = logging.getLogger(__name__)

#: The embedding size of the default embedder (MiniLM).
DEFAULT_DIM: Final = 384
#: Seqs a document reserves per value of the unit sequence (see the module docstring).
SEQ_BLOCK: Final = 1024
#: Units inserted per ``executemany`` batch; the token is checked between batches.
WRITE_BATCH: Final = 256
#: In a bank of more than this many units, a keyword search whose words are estimated to
#: match more than :data:`KEYWORD_CANDIDATES` units scores only the rarest words' matches.
#: (Measured on a 1M-unit bank, 2 cores: BM25 over every match of a common name took
#: 0.35-1.2 s; over 5,000 candidates recall was p50 36 ms with 33 recalls/s at 8 clients,
#: over 2,000 -- twenty times what the keyword arm returns -- p50 27 ms and 43 recalls/s.)
KEYWORD_PRUNE_ABOVE_UNITS: Final = 50_000
KEYWORD_CANDIDATES: Final = 2_000
#: How long the planner's lexeme statistics and a bank's unit count are reused (seconds).
STATS_SECONDS: Final = 60.0
_LEXEME: Final = re.compile(r"'((?:[^']|'')*)'")
#: BM25 parameters (those of SQLite's FTS5 ``bm25()``).
BM25_K1: Final = 1.2
BM25_B: Final = 0.75
#: HNSW build parameters (pgvector's defaults, written out).
HNSW_M: Final = 16
HNSW_EF_CONSTRUCTION: Final = 64
#: The ``hnsw.ef_search`` floor and pgvector's ceiling.
EF_SEARCH_MIN: Final = 40
EF_SEARCH_MAX: Final = 1000
#: The oldest pgvector with ``hnsw.iterative_scan``.
PGVECTOR_MIN: Final = (0, 8, 0)
#: A cancel request is sent again after this long while the query still runs.
CANCEL_RETRY_SECONDS: Final = 0.2
#: How long cancel requests for one query are sent before giving up.
CANCEL_GIVE_UP_SECONDS: Final = 10.0

_LOCK_PREFIX: Final = "bank:"
_TIME_COLUMNS: Final = {
    "mentioned_at": "mentioned_at",
    "occurred_start": "occurred_start",
    "occurred_end": "occurred_end",
    "created_at": "created_at",
    "updated_at": "updated_at",
}


class SchemaMismatch(RuntimeError):
    """The database's memory schema cannot serve this store (vector size, pgvector version)."""


def pg_memory_migrations(dim: int = DEFAULT_DIM) -> list[Migration]:
    """The memory component's PostgreSQL migrations for *dim*-dimensional embeddings.

    The versions mirror :data:`heed.storage.memory_store.MEMORY_MIGRATIONS`: version *n*
    holds the same tables and columns on both databases.
    """
    if dim < 1:
        raise ValueError(f"embedding dimension must be positive, got {dim}")
    return [
        Migration(
            "memory",
            1,
            f"""
            CREATE EXTENSION IF NOT EXISTS vector;
            CREATE TABLE memory_banks (
                ref TEXT COLLATE "C" PRIMARY KEY,
                tenant TEXT COLLATE "C" NOT NULL,
                bank_id TEXT COLLATE "C" NOT NULL,
                name TEXT NOT NULL DEFAULT '',
                mission TEXT NOT NULL DEFAULT '',
                background TEXT,
                disposition TEXT NOT NULL,
                config TEXT NOT NULL,
                created_at TEXT COLLATE "C" NOT NULL,
                updated_at TEXT COLLATE "C" NOT NULL,
                last_write_at TEXT COLLATE "C",
                UNIQUE (tenant, bank_id)
            );
            CREATE TABLE memory_documents (
                bank_ref TEXT COLLATE "C" NOT NULL
                    REFERENCES memory_banks (ref) ON DELETE CASCADE,
                document_id TEXT COLLATE "C" NOT NULL,
                original_text TEXT NOT NULL,
                content_hash TEXT,
                metadata TEXT NOT NULL,
                tags TEXT NOT NULL,
                created_at TEXT COLLATE "C" NOT NULL,
                updated_at TEXT COLLATE "C" NOT NULL,
                PRIMARY KEY (bank_ref, document_id)
            );
            CREATE TABLE memory_chunks (
                id TEXT COLLATE "C" PRIMARY KEY,
                bank_ref TEXT COLLATE "C" NOT NULL
                    REFERENCES memory_banks (ref) ON DELETE CASCADE,
                document_id TEXT COLLATE "C" NOT NULL,
                chunk_index INTEGER NOT NULL,
                text TEXT NOT NULL
            );
            CREATE INDEX memory_chunks_doc ON memory_chunks (bank_ref, document_id);
            CREATE TABLE memory_units (
                seq BIGINT GENERATED BY DEFAULT AS IDENTITY (INCREMENT BY {SEQ_BLOCK})
                    PRIMARY KEY,
                id TEXT COLLATE "C" NOT NULL UNIQUE,
                bank_ref TEXT COLLATE "C" NOT NULL
                    REFERENCES memory_banks (ref) ON DELETE CASCADE,
                document_id TEXT COLLATE "C",
                chunk_id TEXT COLLATE "C",
                text TEXT NOT NULL,
                fact_type TEXT COLLATE "C" NOT NULL,
                context TEXT,
                occurred_start TEXT COLLATE "C",
                occurred_end TEXT COLLATE "C",
                mentioned_at TEXT COLLATE "C",
                metadata TEXT NOT NULL,
                tags TEXT NOT NULL,
                embedding vector({dim}),
                keywords tsvector NOT NULL,
                created_at TEXT COLLATE "C" NOT NULL,
                updated_at TEXT COLLATE "C"
            );
            -- A unit row (text, tsvector, a 1.5 KB vector) is a little over the 2 KB at
            -- which PostgreSQL starts moving values out of line, which would make every
            -- scan and re-rank fetch them from TOAST. Keep rows whole up to a page; past
            -- that, the vector is the last value to leave.
            ALTER TABLE memory_units SET (toast_tuple_target = 8160);
            ALTER TABLE memory_units ALTER COLUMN embedding SET STORAGE MAIN;
            CREATE INDEX memory_units_bank ON memory_units (bank_ref, seq);
            CREATE INDEX memory_units_doc ON memory_units (bank_ref, document_id);
            CREATE INDEX memory_units_occurred ON memory_units (bank_ref, occurred_start);
            CREATE INDEX memory_units_keywords ON memory_units USING gin (keywords);
            CREATE INDEX memory_units_embedding ON memory_units
                USING hnsw (embedding vector_cosine_ops)
                WITH (m = {HNSW_M}, ef_construction = {HNSW_EF_CONSTRUCTION});
            CREATE TABLE memory_entities (
                id TEXT COLLATE "C" PRIMARY KEY,
                bank_ref TEXT COLLATE "C" NOT NULL
                    REFERENCES memory_banks (ref) ON DELETE CASCADE,
                canonical TEXT COLLATE "C" NOT NULL,
                name TEXT NOT NULL,
                type TEXT,
                UNIQUE (bank_ref, canonical)
            );
            CREATE TABLE memory_unit_entities (
                unit_seq BIGINT NOT NULL REFERENCES memory_units (seq) ON DELETE CASCADE,
                entity_id TEXT COLLATE "C" NOT NULL
                    REFERENCES memory_entities (id) ON DELETE CASCADE,
                PRIMARY KEY (unit_seq, entity_id)
            );
            CREATE INDEX memory_unit_entities_entity
                ON memory_unit_entities (entity_id, unit_seq);
            CREATE TABLE memory_links (
                from_seq BIGINT NOT NULL REFERENCES memory_units (seq) ON DELETE CASCADE,
                to_seq BIGINT NOT NULL REFERENCES memory_units (seq) ON DELETE CASCADE,
                link_type TEXT COLLATE "C" NOT NULL,
                weight DOUBLE PRECISION NOT NULL,
                PRIMARY KEY (from_seq, to_seq, link_type)
            );
            CREATE INDEX memory_links_to ON memory_links (to_seq);
            """,
        ),
        Migration(
            "memory",
            2,
            """
            ALTER TABLE memory_units ADD COLUMN token_count INTEGER;
            """,
        ),
        Migration(
            "memory",
            3,
            """
            CREATE TABLE memory_retain_ledger (
                bank_ref TEXT COLLATE "C" NOT NULL
                    REFERENCES memory_banks (ref) ON DELETE CASCADE,
                idempotency_key TEXT COLLATE "C" NOT NULL,
                document_index INTEGER NOT NULL,
                document_id TEXT NOT NULL,
                units INTEGER NOT NULL,
                fingerprint TEXT NOT NULL,
                created_at DOUBLE PRECISION NOT NULL,
                PRIMARY KEY (bank_ref, idempotency_key, document_index)
            );
            CREATE INDEX memory_retain_ledger_age ON memory_retain_ledger (created_at);
            """,
        ),
        Migration(
            "memory",
            4,
            # As on SQLite; nothing here reads the units' generations (no process holds
            # vectors), but the columns keep the two schemas alike for heed migrate.
            """
            ALTER TABLE memory_banks ADD COLUMN generation BIGINT NOT NULL DEFAULT 0;
            ALTER TABLE memory_units ADD COLUMN generation BIGINT NOT NULL DEFAULT 0;
            CREATE INDEX memory_units_generation ON memory_units (bank_ref, generation);
            """,
        ),
        Migration(
            "memory",
            5,
            # As on SQLite: heed.storage.memory_values.
            """
            CREATE TABLE memory_values (
                bank_ref TEXT COLLATE "C" NOT NULL
                    REFERENCES memory_banks (ref) ON DELETE CASCADE,
                digest TEXT COLLATE "C" NOT NULL,
                body TEXT NOT NULL,
                PRIMARY KEY (bank_ref, digest)
            );
            ALTER TABLE memory_units ADD COLUMN tags_ref TEXT COLLATE "C";
            ALTER TABLE memory_units ADD COLUMN metadata_ref TEXT COLLATE "C";
            ALTER TABLE memory_documents ADD COLUMN tags_ref TEXT COLLATE "C";
            ALTER TABLE memory_documents ADD COLUMN metadata_ref TEXT COLLATE "C";
            CREATE INDEX memory_units_tags_ref ON memory_units (bank_ref, tags_ref)
                WHERE tags_ref IS NOT NULL;
            CREATE INDEX memory_units_metadata_ref ON memory_units (bank_ref, metadata_ref)
                WHERE metadata_ref IS NOT NULL;
            CREATE INDEX memory_documents_tags_ref ON memory_documents (bank_ref, tags_ref)
                WHERE tags_ref IS NOT NULL;
            CREATE INDEX memory_documents_metadata_ref
                ON memory_documents (bank_ref, metadata_ref) WHERE metadata_ref IS NOT NULL;
            """,
        ),
        Migration(
            "memory",
            6,
            """
            ALTER TABLE memory_units ADD COLUMN context_ref TEXT COLLATE "C";
            CREATE INDEX memory_units_context_ref ON memory_units (bank_ref, context_ref)
                WHERE context_ref IS NOT NULL;
            """,
        ),
    ]


#: The migrations for the default embedder's vectors.
PG_MEMORY_MIGRATIONS: Final = pg_memory_migrations(DEFAULT_DIM)


# -- values --------------------------------------------------------------------------------


def _text(value: str) -> str:
    """*value* as a parameter PostgreSQL accepts: NUL replaced by U+FFFD. Writes refuse
    NUL before they begin (:func:`~heed.storage.memory_rows.refuse_nul_in_document`), so
    this serves lookups and search terms, and keeps the writes' parameters safe."""
    return value.replace("\x00", "\ufffd") if "\x00" in value else value


def _opt_text(value: str | None) -> str | None:
    return _text(value) if value is not None else None


def _vector_literal(vector: Any) -> str:
    """A pgvector text literal (``'[x,y,...]'``) that round-trips float32 exactly."""
    values = np.asarray(vector, dtype=np.float32).ravel().tolist()
    return "[" + ",".join(map(repr, values)) + "]"


def _vector_from_binary(data: bytes) -> np.ndarray:
    """A float32 array from pgvector's binary form (dim, unused, big-endian float4s)."""
    (dim,) = struct.unpack_from(">H", data)
    return np.frombuffer(data, dtype=">f4", count=dim, offset=4).astype(np.float32)


def _scalar(cursor: Any) -> Any:
    """The first column of a query's one row."""
    row = cursor.fetchone()
    assert row is not None, "an aggregate query returned no row"
    return row[0]


def _limit(limit: int) -> int | None:
    """SQLite reads a negative LIMIT as none; PostgreSQL spells that ``LIMIT NULL``."""
    return None if limit < 0 else limit


def _version(text: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in text.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


# -- cancellation --------------------------------------------------------------------------

_cancel_pool: ThreadPoolExecutor | None = None
_cancel_pool_lock = threading.Lock()


def _cancel_executor() -> ThreadPoolExecutor:
    global _cancel_pool
    with _cancel_pool_lock:
        if _cancel_pool is None:
            _cancel_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="heed-pg-cancel")
        return _cancel_pool


class _Canceller:
    """Sends cancel requests for one connection's running query while the query runs.

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
            _cancel_executor().submit(self._cancel)

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


class _Executor(Protocol):
    def execute(self, sql: str, params: Sequence[Any] | None = None) -> Any: ...


class _Statements:
    """A connection whose every statement is preceded by a token check."""

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
        cursor.execute(sql.replace("?", "%s"), params)
        return cursor.fetchall()


# -- the store -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _KeywordPlan:
    """How :meth:`PgMemoryStore.keyword_search` prunes a search of a large bank."""

    selective: set[str]
    estimates: dict[str, float]
    bank_size: int


class PgMemoryStore:
    """See the module docstring and :class:`heed.memory.store.VectorSearchingStore`."""

    searches_vectors = True

    def __init__(self, database: PostgresDatabase, dim: int = DEFAULT_DIM) -> None:
        if dim < 1:
            raise ValueError(f"embedding dimension must be positive, got {dim}")
        self.db = database
        self.dim = dim
        #: See :data:`KEYWORD_PRUNE_ABOVE_UNITS` and :data:`KEYWORD_CANDIDATES`.
        self.keyword_prune_above_units = KEYWORD_PRUNE_ABOVE_UNITS
        self.keyword_candidates = KEYWORD_CANDIDATES
        self._lexemes: tuple[float, dict[str, float]] | None = None
        self._bank_sizes: dict[str, tuple[float, int]] = {}

    # -- schema ------------------------------------------------------------------------------

    def migrate(self) -> None:
        """Apply the memory component's migrations, then check the schema fits this store.

        Raises :class:`SchemaMismatch` when the stored vectors have another size than
        *dim* (the embedder changed) or pgvector is older than 0.8.
        """
        self.db.migrate(pg_memory_migrations(self.dim))
        with self.db.read() as conn:
            row = conn.execute(
                "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
            ).fetchone()
            stored = conn.execute(
                "SELECT a.atttypmod FROM pg_attribute a"
                " WHERE a.attrelid = 'memory_units'::regclass AND a.attname = 'embedding'"
            ).fetchone()
        if row is None or _version(str(row[0])) < PGVECTOR_MIN:
            found = "not installed" if row is None else f"version {row[0]}"
            raise SchemaMismatch(
                f"pgvector is {found}; the memory store needs pgvector 0.8 or later "
                "(hnsw.iterative_scan)"
            )
        if stored is None or int(stored[0]) != self.dim:
            size = "no" if stored is None else f"{int(stored[0])}-dimensional"
            raise SchemaMismatch(
                f"memory_units.embedding holds {size} vectors but the embedder makes "
                f"{self.dim}-dimensional ones: use the embedder the banks were written "
                "with, or a new database"
            )

    def _lock_bank(self, conn: Connection, bank_ref: str) -> None:
        self.db.lock(conn, _LOCK_PREFIX + bank_ref)

    @contextmanager
    def _cancellable(self, *, transaction: bool = False) -> Iterator[_Statements]:
        """A read connection whose queries stop when the active token is cancelled.

        See the module docstring. ``QueryCanceled`` caused by the token surfaces as
        :class:`OperationCancelled`; other errors (and a ``statement_timeout``) pass.
        """
        token = current_token()
        if token is not None:
            token.raise_if_cancelled()
        with self.db.read() as conn:
            if token is None:
                if transaction:
                    with conn.raw.transaction():
                        yield _Statements(conn, None)
                else:
                    yield _Statements(conn, None)
                return
            canceller = _Canceller(conn.raw)
            handle = token.on_cancel(canceller.request)
            try:
                if transaction:
                    with conn.raw.transaction():
                        yield _Statements(conn, token)
                else:
                    yield _Statements(conn, token)
            except psycopg.errors.QueryCanceled as exc:
                if token.cancelled:
                    raise OperationCancelled(token.reason or "cancelled") from exc
                raise
            finally:
                handle.remove()
                canceller.close()

    # -- banks -------------------------------------------------------------------------------

    def get_bank(self, tenant: str, bank_id: str) -> Bank | None:
        with self.db.read() as conn:
            row = conn.execute(
                "SELECT * FROM memory_banks WHERE tenant = ? AND bank_id = ?",
                (_text(tenant), _text(bank_id)),
            ).fetchone()
        return bank_from_row(row) if row else None

    def list_banks(
        self, tenant: str, limit: int, offset: int
    ) -> tuple[list[tuple[Bank, int]], int]:
        with self.db.read() as conn:
            total = _scalar(
                conn.execute("SELECT COUNT(*) FROM memory_banks WHERE tenant = ?", (tenant,))
            )
            rows = conn.execute(
                "SELECT b.*, (SELECT COUNT(*) FROM memory_units u WHERE u.bank_ref = b.ref) AS n"
                " FROM memory_banks b WHERE tenant = ? ORDER BY bank_id LIMIT ? OFFSET ?",
                (tenant, _limit(limit), max(0, offset)),
            ).fetchall()
        return [(bank_from_row(r), int(r["n"])) for r in rows], int(total)

    def save_bank(self, bank: Bank) -> Bank:
        refuse_nul_in_bank(bank)
        now = now_iso()
        with self.db.write() as conn:
            row = conn.execute(
                "SELECT created_at FROM memory_banks WHERE ref = ? FOR UPDATE", (bank.ref,)
            ).fetchone()
            if row is None:
                if bank.created_at:
                    raise BankGone(bank.ref)  # read as existing, deleted since
                insert_bank(
                    conn,
                    bank,
                    (
                        bank.ref,
                        _text(bank.tenant),
                        _text(bank.bank_id),
                        _text(bank.name),
                        _text(bank.mission),
                        _opt_text(bank.background),
                        json.dumps(bank.disposition),
                        json.dumps(bank.config),
                        now,
                        now,
                    ),
                )
                bank.created_at = bank.updated_at = now
            else:
                bank.updated_at = now
                bank.created_at = row["created_at"]
                conn.execute(
                    "UPDATE memory_banks SET name = ?, mission = ?, background = ?,"
                    " disposition = ?, config = ?, updated_at = ? WHERE ref = ?",
                    (
                        _text(bank.name),
                        _text(bank.mission),
                        _opt_text(bank.background),
                        json.dumps(bank.disposition),
                        json.dumps(bank.config),
                        now,
                        bank.ref,
                    ),
                )
        return bank

    def delete_bank(self, bank_ref: str) -> int:
        with self.db.write() as conn:
            self._lock_bank(conn, bank_ref)
            count = _scalar(
                conn.execute("SELECT COUNT(*) FROM memory_units WHERE bank_ref = ?", (bank_ref,))
            )
            # Set-based deletes first; the cascades then find nothing left to do row by row.
            conn.execute(
                "DELETE FROM memory_links l USING memory_units u"
                " WHERE u.bank_ref = ? AND l.from_seq = u.seq",
                (bank_ref,),
            )
            conn.execute(
                "DELETE FROM memory_unit_entities ue USING memory_units u"
                " WHERE u.bank_ref = ? AND ue.unit_seq = u.seq",
                (bank_ref,),
            )
            conn.execute("DELETE FROM memory_units WHERE bank_ref = ?", (bank_ref,))
            conn.execute("DELETE FROM memory_entities WHERE bank_ref = ?", (bank_ref,))
            conn.execute("DELETE FROM memory_chunks WHERE bank_ref = ?", (bank_ref,))
            conn.execute("DELETE FROM memory_documents WHERE bank_ref = ?", (bank_ref,))
            conn.execute("DELETE FROM memory_retain_ledger WHERE bank_ref = ?", (bank_ref,))
            conn.execute("DELETE FROM memory_values WHERE bank_ref = ?", (bank_ref,))
            conn.execute("DELETE FROM memory_banks WHERE ref = ?", (bank_ref,))
        return int(count)

    def bank_stats(self, bank_ref: str) -> BankStats:
        with self.db.read() as conn:
            by_type = {
                str(r[0]): int(r[1])
                for r in conn.execute(
                    "SELECT fact_type, COUNT(*) FROM memory_units WHERE bank_ref = ?"
                    " GROUP BY fact_type",
                    (bank_ref,),
                ).fetchall()
            }
            links = {
                str(r[0]): int(r[1])
                for r in conn.execute(
                    "SELECT l.link_type, COUNT(*) FROM memory_links l JOIN memory_units u"
                    " ON u.seq = l.from_seq WHERE u.bank_ref = ? GROUP BY l.link_type",
                    (bank_ref,),
                ).fetchall()
            }
            docs = _scalar(
                conn.execute(
                    "SELECT COUNT(*) FROM memory_documents WHERE bank_ref = ?", (bank_ref,)
                )
            )
            last = conn.execute(
                "SELECT last_write_at FROM memory_banks WHERE ref = ?", (bank_ref,)
            ).fetchone()
        return BankStats(
            units_by_type=by_type,
            links_by_type=links,
            documents=int(docs),
            last_write_at=last[0] if last else None,
        )

    # -- retain ------------------------------------------------------------------------------

    @staticmethod
    def _remove_document(
        conn: Connection, bank_ref: str, document_id: str
    ) -> tuple[list[int], list[str | None]]:
        """Delete a document's units (their links and entity rows cascade), chunks and row:
        the seqs removed, and the shared values the removed rows referenced (for
        :func:`~heed.storage.memory_values.release`)."""
        rows = conn.execute(
            "DELETE FROM memory_units WHERE bank_ref = ? AND document_id = ?"
            " RETURNING seq, tags_ref, metadata_ref, context_ref",
            (bank_ref, document_id),
        ).fetchall()
        refs: list[str | None] = [ref for r in rows for ref in (r[1], r[2], r[3])]
        conn.execute(
            "DELETE FROM memory_chunks WHERE bank_ref = ? AND document_id = ?",
            (bank_ref, document_id),
        )
        for row in conn.execute(
            "DELETE FROM memory_documents WHERE bank_ref = ? AND document_id = ?"
            " RETURNING tags_ref, metadata_ref",
            (bank_ref, document_id),
        ).fetchall():
            refs.extend(row)
        return sorted(int(r[0]) for r in rows), refs

    def retain_ledger(self, bank_ref: str, key: str) -> list[LedgerEntry]:
        with self.db.write() as conn:
            conn.execute(
                "DELETE FROM memory_retain_ledger WHERE created_at < ?",
                (time.time() - KEY_TTL_SECONDS,),
            )
            rows = conn.execute(
                "SELECT document_index, document_id, units, fingerprint FROM memory_retain_ledger"
                " WHERE bank_ref = ? AND idempotency_key = ? ORDER BY document_index",
                (bank_ref, _text(key)),
            ).fetchall()
        return [LedgerEntry(int(r[0]), r[1], int(r[2]), r[3]) for r in rows]

    def write_document(
        self,
        bank_ref: str,
        document: PreparedDocument,
        ledger: tuple[RetainKey, int] | None = None,
    ) -> WriteResult:
        """Write one document's chunks, units, entities and links in one transaction."""
        refuse_nul_in_document(document, ledger[0].key if ledger is not None else None)
        for unit in document.units:
            if unit.embedding is not None and np.size(unit.embedding) != self.dim:
                raise ValueError(
                    f"unit {unit.id} has a {np.size(unit.embedding)}-dimensional embedding; "
                    f"this store holds {self.dim}-dimensional vectors"
                )
        now = now_iso()
        document_id = _text(document.document_id)
        values = ValueWriter()
        released: list[str | None] = []  # shared values of rows replaced or overwritten
        with self.db.write() as conn:
            self._lock_bank(conn, bank_ref)
            generation = touch_bank(conn, bank_ref, now)  # under the lock delete_bank takes
            if ledger is not None:
                self._record_ledger(conn, bank_ref, document, *ledger)
            removed: list[int] = []
            existing = conn.execute(
                "SELECT original_text, created_at, tags_ref, metadata_ref FROM memory_documents"
                " WHERE bank_ref = ? AND document_id = ?",
                (bank_ref, document_id),
            ).fetchone()
            text = _text(document.original_text)
            created_at = now
            first_chunk = 0
            units = list(document.units)
            if existing is not None and document.replace:
                removed, released = self._remove_document(conn, bank_ref, document_id)
            elif existing is not None:
                released = [existing["tags_ref"], existing["metadata_ref"]]
                if units:
                    units = self._join_stored_last(conn, bank_ref, document_id, units)
                text = existing["original_text"] + "\n" + text
                created_at = existing["created_at"]
                first_chunk = _scalar(
                    conn.execute(
                        "SELECT COALESCE(MAX(chunk_index) + 1, 0) FROM memory_chunks"
                        " WHERE bank_ref = ? AND document_id = ?",
                        (bank_ref, document_id),
                    )
                )
            conn.execute(
                "INSERT INTO memory_documents (bank_ref, document_id, original_text, content_hash,"
                " metadata, metadata_ref, tags, tags_ref, created_at, updated_at)"
                " VALUES (?,?,?,?,?,?,?,?,?,?)"
                " ON CONFLICT (bank_ref, document_id) DO UPDATE SET"
                " original_text = excluded.original_text,"
                " content_hash = excluded.content_hash, metadata = excluded.metadata,"
                " metadata_ref = excluded.metadata_ref, tags = excluded.tags,"
                " tags_ref = excluded.tags_ref, updated_at = excluded.updated_at",
                (
                    bank_ref,
                    document_id,
                    text,
                    hashlib.sha256(text.encode()).hexdigest(),
                    *values.encode(document.metadata),
                    *values.encode(document.tags),
                    created_at,
                    now,
                ),
            )
            if document.chunks:
                conn.executemany(
                    "INSERT INTO memory_chunks (id, bank_ref, document_id, chunk_index, text)"
                    " VALUES (?,?,?,?,?)",
                    [
                        (c.id, bank_ref, document_id, first_chunk + c.index, _text(c.text))
                        for c in document.chunks
                    ],
                )
            chunk_ids = {c.index: c.id for c in document.chunks}
            seqs = self._allocate_seqs(conn, len(units))
            token = bank_token(bank_ref)
            for start in range(0, len(document.units), WRITE_BATCH):
                raise_if_cancelled()  # inside the transaction: a cancel rolls back everything
                conn.executemany(
                    "INSERT INTO memory_units (seq, id, bank_ref, document_id, chunk_id, text,"
                    " fact_type, context, context_ref, occurred_start, occurred_end, mentioned_at,"
                    " metadata, metadata_ref, tags, tags_ref, embedding, keywords, created_at,"
                    " token_count, generation) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?::vector,"
                    " to_tsvector('simple', ?) || to_tsvector('english', ?),?,?,?)",
                    [
                        (
                            *self._unit_row(
                                seq, bank_ref, document_id, unit, chunk_ids, token, now, values
                            ),
                            generation,
                        )
                        for seq, unit in zip(
                            seqs[start : start + WRITE_BATCH],
                            units[start : start + WRITE_BATCH],
                            strict=True,
                        )
                    ],
                )
            raise_if_cancelled()
            self._link(conn, bank_ref, seqs, units)
            values.store(conn, bank_ref)
            release(conn, bank_ref, released)
        return WriteResult(
            removed=removed,
            added=[(s, u.id) for s, u in zip(seqs, units, strict=True)],
            generation=generation,
        )

    @staticmethod
    def _join_stored_last(
        conn: Connection, bank_ref: str, document_id: str, units: list[PreparedUnit]
    ) -> list[PreparedUnit]:
        """Index an append's first units and the document's stored last units with each
        other's text, as neighbours within one retain are (see :mod:`heed.memory.units`)."""
        last = conn.execute(LAST_UNITS_OF_DOCUMENT, (bank_ref, document_id)).fetchall()
        updates, joined = join_append(last, units)
        for seq, texts in updates:
            addition = _text("\n".join(texts))
            conn.execute(
                "UPDATE memory_units SET keywords = keywords || to_tsvector('simple', ?)"
                " || to_tsvector('english', ?) WHERE seq = ?",
                (addition, addition, seq),
            )
        return joined

    @staticmethod
    def _allocate_seqs(conn: Connection, n: int) -> list[int]:
        """*n* seqs, consecutive within each block of :data:`SEQ_BLOCK` (see the docstring)."""
        if n == 0:
            return []
        blocks = -(-n // SEQ_BLOCK)
        starts = [
            int(r[0])
            for r in conn.execute(
                "SELECT nextval(pg_get_serial_sequence('memory_units', 'seq'))"
                " FROM generate_series(1, ?)",
                (blocks,),
            ).fetchall()
        ]
        seqs = [start + i for start in starts for i in range(SEQ_BLOCK)]
        return seqs[:n]

    @staticmethod
    def _unit_row(
        seq: int,
        bank_ref: str,
        document_id: str,
        unit: PreparedUnit,
        chunk_ids: dict[int, str],
        token: str,
        now: str,
        values: ValueWriter,
    ) -> tuple[Any, ...]:
        return (
            seq,
            unit.id,
            bank_ref,
            document_id,
            chunk_ids.get(unit.chunk_index),
            _text(unit.text),
            unit.fact_type,
            *values.encode_text(unit.context),
            iso(unit.occurred_start),
            iso(unit.occurred_end),
            iso(unit.mentioned_at),
            *values.encode(unit.metadata),
            *values.encode(unit.tags),
            _vector_literal(unit.embedding) if unit.embedding is not None else None,
            token,
            _text(unit.index_text),
            now,
            unit.token_count,
        )

    @staticmethod
    def _record_ledger(
        conn: Connection,
        bank_ref: str,
        document: PreparedDocument,
        key: RetainKey,
        index: int,
    ) -> None:
        try:
            conn.execute(
                "INSERT INTO memory_retain_ledger (bank_ref, idempotency_key, document_index,"
                " document_id, units, fingerprint, created_at) VALUES (?,?,?,?,?,?,?)",
                (
                    bank_ref,
                    _text(key.key),
                    index,
                    _text(document.document_id),
                    len(document.units),
                    key.fingerprint,
                    time.time(),
                ),
            )
        except psycopg.errors.UniqueViolation as exc:
            raise IdempotencyConflict(
                f"a retain under Idempotency-Key {key.key!r} is already running; retry it "
                "after that one finishes"
            ) from exc

    @staticmethod
    def _link(
        conn: Connection, bank_ref: str, seqs: Sequence[int], units: Sequence[PreparedUnit]
    ) -> None:
        """Entities, memberships and links of a document's new units, as on SQLite (see
        :mod:`heed.storage.memory_links`). Entities are created on first mention (first
        name wins; another process's concurrent creation is kept)."""
        first = first_mentions(units)
        entity_ids: dict[str, str] = {}
        recent: dict[str, list[int]] = {}
        if first:
            conn.executemany(
                "INSERT INTO memory_entities (id, bank_ref, canonical, name, type)"
                " VALUES (?,?,?,?,?) ON CONFLICT (bank_ref, canonical) DO NOTHING",
                [
                    (str(uuid.uuid4()), bank_ref, _text(key), _text(name), _opt_text(kind))
                    for key, (name, kind) in first.items()
                ],
            )
            by_canonical = {_text(key): key for key in first}
            for row in conn.execute(
                "SELECT canonical, id FROM memory_entities"
                " WHERE bank_ref = ? AND canonical = ANY(?::text[])",
                (bank_ref, list(by_canonical)),
            ).fetchall():
                entity_ids[by_canonical[row[0]]] = str(row[1])
            for row in conn.execute(
                "SELECT e.id, x.unit_seq FROM unnest(?::text[]) AS e(id)"
                " CROSS JOIN LATERAL (SELECT unit_seq FROM memory_unit_entities"
                " WHERE entity_id = e.id ORDER BY unit_seq DESC LIMIT ?) x"
                " ORDER BY e.id, x.unit_seq DESC",
                (list(entity_ids.values()), ENTITY_LINKS_PER_ENTITY),
            ).fetchall():
                recent.setdefault(str(row[0]), []).append(int(row[1]))
        memberships, links = plan_links(seqs, units, entity_ids, recent)
        raise_if_cancelled()
        if memberships:
            conn.execute(
                "INSERT INTO memory_unit_entities (unit_seq, entity_id)"
                " SELECT * FROM unnest(?::bigint[], ?::text[]) ON CONFLICT DO NOTHING",
                ([m[0] for m in memberships], [m[1] for m in memberships]),
            )
        if links:
            conn.execute(
                "INSERT INTO memory_links (from_seq, to_seq, link_type, weight)"
                " SELECT * FROM unnest(?::bigint[], ?::bigint[], ?::text[], ?::float8[])"
                " ON CONFLICT DO NOTHING",
                tuple(list(column) for column in zip(*links, strict=True)),
            )

    # -- recall ------------------------------------------------------------------------------

    def bank_generation(self, bank_ref: str) -> int | None:
        with self.db.read() as conn:
            return read_generation(conn, bank_ref)

    def load_vectors(self, bank_ref: str) -> VectorRows:
        with self._cancellable() as q:
            generation = read_generation(q, bank_ref) or 0  # first: see VectorRows
            return self._vector_rows(q, bank_ref, generation, None)

    def vectors_since(self, bank_ref: str, generation: int) -> VectorChanges | None:
        with self._cancellable() as q:
            now = read_generation(q, bank_ref)
            if now is None:
                return None
            rows = self._vector_rows(q, bank_ref, now, generation)
            count = _scalar(
                q.execute("SELECT COUNT(*) FROM memory_units WHERE bank_ref = ?", (bank_ref,))
            )
        return VectorChanges(rows, int(count))

    def unit_seqs(self, bank_ref: str) -> np.ndarray:
        with self._cancellable() as q:
            rows = q.execute(
                "SELECT seq FROM memory_units WHERE bank_ref = ?", (bank_ref,)
            ).fetchall()
        return np.asarray([int(r[0]) for r in rows], dtype=np.int64)

    @staticmethod
    def _vector_rows(
        q: _Statements, bank_ref: str, generation: int, since: int | None
    ) -> VectorRows:
        """The bank's vectors (of the units written after generation *since*, if given)."""
        later = "" if since is None else " AND generation > ?"
        params = (bank_ref,) if since is None else (bank_ref, since)
        rows = q.binary(
            "SELECT seq, embedding, fact_type FROM memory_units"
            f" WHERE bank_ref = ?{later} AND embedding IS NOT NULL ORDER BY seq",
            params,
        )
        if not rows:
            empty = np.zeros((0, 0), dtype=np.float32)
            return VectorRows(np.zeros(0, dtype=np.int64), empty, [], generation)
        matrix = np.stack([_vector_from_binary(r[1]) for r in rows])
        return VectorRows(
            np.asarray([int(r[0]) for r in rows], dtype=np.int64),
            matrix,
            [str(r[2]) for r in rows],
            generation,
        )

    def vector_search(
        self, bank_ref: str, query: np.ndarray, k: int, types: Sequence[str] | None
    ) -> list[tuple[int, float]]:
        """The *k* nearest units by cosine through the HNSW index (see the module docstring)."""
        if k <= 0 or (types is not None and not types):
            return []
        if np.size(query) != self.dim:
            raise ValueError(
                f"the query vector has {np.size(query)} dimensions; the store holds {self.dim}"
            )
        ef_search = min(EF_SEARCH_MAX, max(EF_SEARCH_MIN, 2 * k))
        where = "bank_ref = ? AND embedding IS NOT NULL"
        params: list[Any] = [_vector_literal(query), bank_ref]
        if types is not None:
            where += " AND fact_type = ANY(?::text[])"
            params.append(list(types))
        with self._cancellable(transaction=True) as q:
            q.execute(
                "SELECT set_config('hnsw.ef_search', ?, true),"
                " set_config('hnsw.iterative_scan', 'relaxed_order', true)",
                (str(ef_search),),
            )
            rows = q.execute(
                f"SELECT seq, embedding <=> ?::vector AS distance FROM memory_units"
                f" WHERE {where} ORDER BY distance LIMIT ?",
                (*params, k),
            ).fetchall()
        hits = []
        for seq, distance in rows:
            score = 1.0 - float(distance)
            hits.append((int(seq), 0.0 if math.isnan(score) else score))
        hits.sort(key=lambda hit: (-hit[1], hit[0]))  # relaxed order: nearly sorted
        return hits

    def unit_vectors(self, bank_ref: str, seqs: Sequence[int]) -> dict[int, np.ndarray]:
        if not seqs:
            return {}
        with self._cancellable() as q:
            rows = q.binary(
                "SELECT seq, embedding FROM memory_units WHERE bank_ref = ?"
                " AND seq = ANY(?::bigint[]) AND embedding IS NOT NULL",
                (bank_ref, [int(s) for s in seqs]),
            )
        return {int(r[0]): _vector_from_binary(r[1]) for r in rows}

    def keyword_search(
        self, bank_ref: str, terms: Sequence[str], limit: int
    ) -> list[tuple[int, float]]:
        """BM25 over the bank's units matching any of *terms* (see the module docstring).

        Each term is parsed with ``plainto_tsquery`` (any text is safe: quotes and
        operators are only punctuation there); stop words and empty terms drop out.
        In a large bank, when the terms are estimated to match more than
        :data:`KEYWORD_CANDIDATES` units, only the units matching the rarest of them are
        scored (:meth:`_keyword_plan`).
        """
        words = list(dict.fromkeys(_text(t) for t in terms if t and t.strip()))
        if not words or limit == 0:
            return []
        plan = self._keyword_plan(bank_ref, words)
        if plan is not None:
            return self._pruned_keyword_search(bank_ref, words, plan, limit)
        with self._cancellable() as q:
            rows = q.execute(
                f"""
                WITH words AS (
                    SELECT DISTINCT plainto_tsquery('english', w) AS q
                    FROM unnest(?::text[]) AS w
                ), terms AS (
                    SELECT q, row_number() OVER () AS i FROM words WHERE numnode(q) > 0
                ), matched AS (
                    SELECT u.seq, u.keywords, length(u.keywords)::float8 AS dl
                    FROM memory_units u
                    WHERE u.bank_ref = ? AND u.keywords @@ (
                        plainto_tsquery('simple', ?)
                        && (SELECT string_agg('(' || q::text || ')', ' | ')::tsquery FROM terms)
                    )
                ), hits AS (
                    SELECT m.seq, m.dl, t.i,
                        ts_rank(m.keywords, t.q)::float8
                        / ts_rank('x:1'::tsvector, 'x'::tsquery)::float8 AS tf
                    FROM matched m JOIN terms t ON m.keywords @@ t.q
                ), df AS (
                    SELECT i, COUNT(*)::float8 AS n FROM hits GROUP BY i
                ), stats AS (
                    SELECT (SELECT COUNT(*) FROM memory_units WHERE bank_ref = ?)::float8 AS n,
                        (SELECT AVG(dl) FROM matched) AS avgdl
                )
                SELECT h.seq, SUM(
                    GREATEST(LN((s.n - df.n + 0.5) / (df.n + 0.5)), 1e-6)
                    * h.tf * {BM25_K1 + 1}
                    / (h.tf + {BM25_K1} * (1 - {BM25_B} + {BM25_B} * h.dl / s.avgdl))
                ) AS score
                FROM hits h JOIN df USING (i) CROSS JOIN stats s
                GROUP BY h.seq ORDER BY score DESC, h.seq LIMIT ?
                """,
                (words, bank_ref, bank_token(bank_ref), bank_ref, _limit(limit)),
            ).fetchall()
        return [(int(r[0]), float(r[1])) for r in rows]

    # -- keyword search on large banks ------------------------------------------------

    def _lexeme_frequencies(self) -> dict[str, float]:
        """The share of units holding each of the most common lexemes, from the planner's
        statistics of ``memory_units.keywords`` (``ANALYZE``); read again each minute."""
        cached = self._lexemes
        if cached is not None and time.monotonic() - cached[0] < STATS_SECONDS:
            return cached[1]
        with self._cancellable() as q:
            row = q.execute(
                "SELECT most_common_elems::text::text[], most_common_elem_freqs FROM pg_stats"
                " WHERE schemaname = current_schema() AND tablename = 'memory_units'"
                " AND attname = 'keywords'"
            ).fetchone()
        freqs = dict(zip(row[0], row[1], strict=False)) if row and row[0] else {}
        self._lexemes = (time.monotonic(), freqs)
        return freqs

    def _bank_size(self, bank_ref: str) -> int:
        """The bank's unit count, read again after :data:`STATS_SECONDS`."""
        cached = self._bank_sizes.get(bank_ref)
        if cached is not None and time.monotonic() - cached[0] < STATS_SECONDS:
            return cached[1]
        with self._cancellable() as q:
            n = int(
                _scalar(
                    q.execute("SELECT COUNT(*) FROM memory_units WHERE bank_ref = ?", (bank_ref,))
                )
            )
        if len(self._bank_sizes) > 10_000:
            self._bank_sizes.clear()
        self._bank_sizes[bank_ref] = (time.monotonic(), n)
        return n

    def _keyword_plan(self, bank_ref: str, words: list[str]) -> _KeywordPlan | None:
        """Which words' matches to score, when scoring every match would be slow; ``None``
        for a bank of at most :attr:`keyword_prune_above_units` units, or words estimated
        to match at most :attr:`keyword_candidates` units.

        A word matching a large share of a bank has a small idf: it reorders the units the
        rare words find more than it finds units of its own. So the rarest words (in
        ascending estimated matches, while their sum stays within the bound; at least
        one) choose the candidates, every word scores them, and the common words' df is
        their estimate. The estimates are the planner's lexeme statistics (a word absent
        from them is rare); a bank without statistics yet is scored exactly.
        """
        freqs = self._lexeme_frequencies()
        if not freqs:
            return None
        size = self._bank_size(bank_ref)
        if size <= self.keyword_prune_above_units:
            return None
        with self._cancellable() as q:
            parsed = q.execute(
                "SELECT w, plainto_tsquery('english', w)::text FROM unnest(?::text[]) AS w",
                (words,),
            ).fetchall()
        estimates: dict[str, float] = {}
        for word, query in parsed:
            lexemes = [m.replace("''", "'") for m in _LEXEME.findall(query or "")]
            if lexemes:
                estimates[word] = min(float(freqs.get(x, 0.0)) for x in lexemes) * size
        bound = self.keyword_candidates
        if sum(estimates.values()) <= bound:
            return None
        chosen: set[str] = set()
        total = 0.0
        for word in sorted(estimates, key=estimates.__getitem__):
            if chosen and total + estimates[word] > bound:
                break
            chosen.add(word)
            total += estimates[word]
        return _KeywordPlan(selective=chosen, estimates=estimates, bank_size=size)

    def _pruned_keyword_search(
        self, bank_ref: str, words: list[str], plan: _KeywordPlan, limit: int
    ) -> list[tuple[int, float]]:
        """BM25 over the units matching the plan's selective words (at most
        :attr:`keyword_candidates` of them), every word counting in the score."""
        kept = [w for w in words if w in plan.estimates]
        with self._cancellable() as q:
            rows = q.execute(
                f"""
                WITH terms AS (
                    SELECT plainto_tsquery('english', w) AS q, sel, est,
                        row_number() OVER () AS i
                    FROM unnest(?::text[], ?::boolean[], ?::float8[]) AS x (w, sel, est)
                ), matched AS (
                    SELECT u.seq, u.keywords, length(u.keywords)::float8 AS dl
                    FROM memory_units u
                    WHERE u.bank_ref = ? AND u.keywords @@ (
                        plainto_tsquery('simple', ?)
                        && (SELECT string_agg('(' || q::text || ')', ' | ')::tsquery
                            FROM terms WHERE sel)
                    )
                    LIMIT {int(self.keyword_candidates)}
                ), hits AS (
                    SELECT m.seq, m.dl, t.i,
                        ts_rank(m.keywords, t.q)::float8
                        / ts_rank('x:1'::tsvector, 'x'::tsquery)::float8 AS tf
                    FROM matched m JOIN terms t ON m.keywords @@ t.q
                ), df AS (
                    SELECT t.i, CASE WHEN t.sel THEN COUNT(h.seq)::float8
                        ELSE GREATEST(t.est, COUNT(h.seq)::float8) END AS n
                    FROM terms t LEFT JOIN hits h USING (i) GROUP BY t.i, t.sel, t.est
                ), stats AS (
                    SELECT ?::float8 AS n, (SELECT AVG(dl) FROM matched) AS avgdl
                )
                SELECT h.seq, SUM(
                    GREATEST(LN((s.n - df.n + 0.5) / (df.n + 0.5)), 1e-6)
                    * h.tf * {BM25_K1 + 1}
                    / (h.tf + {BM25_K1} * (1 - {BM25_B} + {BM25_B} * h.dl / s.avgdl))
                ) AS score
                FROM hits h JOIN df USING (i) CROSS JOIN stats s
                GROUP BY h.seq ORDER BY score DESC, h.seq LIMIT ?
                """,
                (
                    kept,
                    [w in plan.selective for w in kept],
                    [plan.estimates[w] for w in kept],
                    bank_ref,
                    bank_token(bank_ref),
                    float(plan.bank_size),
                    _limit(limit),
                ),
            ).fetchall()
        return [(int(r[0]), float(r[1])) for r in rows]

    def units_by_entities(
        self, bank_ref: str, canonical_names: Sequence[str], limit: int
    ) -> list[tuple[int, float]]:
        if not canonical_names:
            return []
        with self._cancellable() as q:
            rows = q.execute(
                "SELECT ue.unit_seq, COUNT(*) AS hits FROM memory_entities e"
                " JOIN memory_unit_entities ue ON ue.entity_id = e.id"
                " WHERE e.bank_ref = ? AND e.canonical = ANY(?::text[])"
                " GROUP BY ue.unit_seq ORDER BY hits DESC, ue.unit_seq DESC LIMIT ?",
                (bank_ref, [_text(n) for n in canonical_names], _limit(limit)),
            ).fetchall()
        return [(int(r[0]), float(r[1])) for r in rows]

    def linked_units(
        self, bank_ref: str, seqs: Sequence[int], limit: int
    ) -> list[tuple[int, float]]:
        if not seqs:
            return []
        with self._cancellable() as q:
            rows = q.execute(
                "SELECT to_seq, SUM(weight) AS w FROM memory_links"
                " WHERE from_seq = ANY(?::bigint[])"
                " GROUP BY to_seq ORDER BY w DESC, to_seq LIMIT ?",
                ([int(s) for s in seqs], _limit(limit)),
            ).fetchall()
        return [(int(r[0]), float(r[1])) for r in rows]

    def units_in_window(
        self, bank_ref: str, start: str, end: str, limit: int
    ) -> list[tuple[int, str]]:
        with self._cancellable() as q:
            rows = q.execute(
                "SELECT seq, occurred_start FROM memory_units WHERE bank_ref = ?"
                " AND occurred_start <= ? AND COALESCE(occurred_end, occurred_start) >= ?"
                " ORDER BY occurred_start DESC, seq DESC LIMIT ?",
                (bank_ref, end, start, _limit(limit)),
            ).fetchall()
        return [(int(r[0]), str(r[1])) for r in rows]

    @staticmethod
    def _units(conn: _Executor, where: str, params: Iterable[Any]) -> list[StoredUnit]:
        rows = conn.execute(
            f"SELECT {UNIT_COLUMNS} FROM memory_units WHERE {where}",
            tuple(params),
        ).fetchall()
        units = [unit_from_row(r) for r in rows]
        if units:
            by_seq = {u.seq: u for u in units}
            for seq, name in conn.execute(
                "SELECT ue.unit_seq, e.name FROM memory_unit_entities ue"
                " JOIN memory_entities e ON e.id = ue.entity_id"
                " WHERE ue.unit_seq = ANY(?::bigint[]) ORDER BY ue.unit_seq, ue.entity_id",
                (list(by_seq),),
            ).fetchall():
                by_seq[int(seq)].entities.append(str(name))
        return units

    def fetch_units(self, bank_ref: str, seqs: Sequence[int]) -> dict[int, StoredUnit]:
        if not seqs:
            return {}
        with self._cancellable() as q:
            units = self._units(
                q,
                "bank_ref = ? AND seq = ANY(?::bigint[]) ORDER BY seq",
                (bank_ref, [int(s) for s in seqs]),
            )
        return {unit.seq: unit for unit in units}

    def fetch_chunks(self, bank_ref: str, chunk_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        if not chunk_ids:
            return {}
        with self._cancellable() as q:
            rows = q.execute(
                "SELECT id, chunk_index, text FROM memory_chunks WHERE bank_ref = ?"
                " AND id = ANY(?::text[]) ORDER BY id",
                (bank_ref, [_text(c) for c in chunk_ids]),
            ).fetchall()
        return {
            r["id"]: {"id": r["id"], "chunk_index": r["chunk_index"], "text": r["text"]}
            for r in rows
        }

    def entity_states(
        self, bank_ref: str, canonical_names: Sequence[str], per_entity: int
    ) -> dict[str, dict[str, Any]]:
        if not canonical_names:
            return {}
        out: dict[str, dict[str, Any]] = {}
        with self._cancellable() as q:
            rows = q.execute(
                "SELECT e.id, e.name, f.text, f.mentioned_at FROM memory_entities e"
                " LEFT JOIN LATERAL (SELECT u.text, u.mentioned_at, ue.unit_seq"
                " FROM memory_unit_entities ue JOIN memory_units u ON u.seq = ue.unit_seq"
                " WHERE ue.entity_id = e.id ORDER BY ue.unit_seq DESC LIMIT ?) f ON true"
                " WHERE e.bank_ref = ? AND e.canonical = ANY(?::text[])"
                " ORDER BY e.canonical, f.unit_seq DESC",
                (max(0, per_entity), bank_ref, [_text(n) for n in canonical_names]),
            ).fetchall()
        for entity_id, name, text, mentioned_at in rows:
            state = out.setdefault(
                name, {"entity_id": entity_id, "canonical_name": name, "observations": []}
            )
            if text is not None:
                state["observations"].append({"text": text, "mentioned_at": mentioned_at})
        return out

    # -- memories and documents ------------------------------------------------------------

    def list_units(
        self, bank_ref: str, flt: UnitFilter, limit: int, offset: int
    ) -> tuple[list[StoredUnit], int]:
        where = ["bank_ref = ?"]
        params: list[Any] = [bank_ref]
        if flt.fact_type:
            where.append("fact_type = ?")
            params.append(_text(flt.fact_type))
        if flt.document_id:
            where.append("document_id = ?")
            params.append(_text(flt.document_id))
        if flt.search:
            where.append("LOWER(text) LIKE ? ESCAPE ''")
            params.append(f"%{_text(flt.search).lower()}%")
        if flt.entity_id:
            where.append("seq IN (SELECT unit_seq FROM memory_unit_entities WHERE entity_id = ?)")
            params.append(_text(flt.entity_id))
        order = "seq DESC"
        if flt.time_field:
            column = _TIME_COLUMNS[flt.time_field]
            where.append(f"{column} IS NOT NULL")
            if flt.start:
                where.append(f"{column} >= ?")
                params.append(_text(flt.start))
            if flt.end:
                where.append(f"{column} < ?")
                params.append(_text(flt.end))
            order = f"{column} DESC, seq DESC"
        clause = " AND ".join(where)
        with self.db.read() as conn:
            total = _scalar(
                conn.execute(f"SELECT COUNT(*) FROM memory_units WHERE {clause}", params)
            )
            units = self._units(
                conn,
                f"{clause} ORDER BY {order} LIMIT ? OFFSET ?",
                (*params, _limit(limit), max(0, offset)),
            )
        return units, int(total)

    def get_unit(self, bank_ref: str, unit_id: str) -> StoredUnit | None:
        with self.db.read() as conn:
            units = self._units(conn, "bank_ref = ? AND id = ?", (bank_ref, _text(unit_id)))
        return units[0] if units else None

    def delete_unit(self, bank_ref: str, unit_id: str) -> WriteResult | None:
        with self.db.write() as conn:
            self._lock_bank(conn, bank_ref)
            row = conn.execute(
                "DELETE FROM memory_units WHERE bank_ref = ? AND id = ?"
                " RETURNING seq, tags_ref, metadata_ref, context_ref",
                (bank_ref, _text(unit_id)),
            ).fetchone()
            if row is None:
                return None
            release(conn, bank_ref, [row[1], row[2], row[3]])
            return WriteResult([int(row[0])], [], touch_bank(conn, bank_ref))

    def list_documents(
        self, bank_ref: str, search: str | None, limit: int, offset: int
    ) -> tuple[list[DocumentInfo], int]:
        where = "d.bank_ref = ?"
        params: list[Any] = [bank_ref]
        if search:
            where += (
                " AND (LOWER(d.document_id) LIKE ? ESCAPE ''"
                " OR LOWER(d.original_text) LIKE ? ESCAPE '')"
            )
            params += [f"%{_text(search).lower()}%"] * 2
        with self.db.read() as conn:
            total = _scalar(
                conn.execute(f"SELECT COUNT(*) FROM memory_documents d WHERE {where}", params)
            )
            rows = conn.execute(
                f"SELECT d.*, {DOCUMENT_VALUES}, (SELECT COUNT(*) FROM memory_units u"
                " WHERE u.bank_ref = d.bank_ref"
                f" AND u.document_id = d.document_id) AS n FROM memory_documents d WHERE {where}"
                " ORDER BY d.updated_at DESC, d.document_id LIMIT ? OFFSET ?",
                (*params, _limit(limit), max(0, offset)),
            ).fetchall()
        return [document_from_row(r, False) for r in rows], int(total)

    def get_document(self, bank_ref: str, document_id: str) -> DocumentInfo | None:
        document_id = _text(document_id)
        with self.db.read() as conn:
            row = conn.execute(
                f"SELECT d.*, {DOCUMENT_VALUES}, (SELECT COUNT(*) FROM memory_units u"
                " WHERE u.bank_ref = d.bank_ref"
                " AND u.document_id = d.document_id) AS n FROM memory_documents d"
                " WHERE d.bank_ref = ? AND d.document_id = ?",
                (bank_ref, document_id),
            ).fetchone()
            if row is None:
                return None
            info = document_from_row(row, True)
            info.units_by_type = {
                str(r[0]): int(r[1])
                for r in conn.execute(
                    "SELECT fact_type, COUNT(*) FROM memory_units"
                    " WHERE bank_ref = ? AND document_id = ? GROUP BY fact_type",
                    (bank_ref, document_id),
                ).fetchall()
            }
        return info

    def delete_document(self, bank_ref: str, document_id: str) -> WriteResult | None:
        document_id = _text(document_id)
        with self.db.write() as conn:
            self._lock_bank(conn, bank_ref)
            exists = conn.execute(
                "SELECT 1 FROM memory_documents WHERE bank_ref = ? AND document_id = ?",
                (bank_ref, document_id),
            ).fetchone()
            if exists is None:
                return None
            generation = touch_bank(conn, bank_ref)
            seqs, refs = self._remove_document(conn, bank_ref, document_id)
            release(conn, bank_ref, refs)
            return WriteResult(seqs, [], generation)
