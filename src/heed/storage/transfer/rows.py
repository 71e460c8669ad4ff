"""The memory store's part for bank transfers: a whole bank read and written as rows.

:class:`TransferRows` implements :class:`heed.memory.store.TransferStore` on either
database, in the same portable SQL as the rest of the store; what differs is asked of the
database's part (:class:`~.dialect.MemoryDialect`: lists, bulk inserts, seqs, the keyword
index) and, in two places, of the database itself: how a read-only snapshot is opened and
how a unit's keyword text and vector are read back.

**Reading** (:meth:`TransferRows.read_bank`) happens inside one snapshot: on SQLite a
deferred read transaction (WAL: writers go on, the reader keeps seeing the bank as it was),
on PostgreSQL a ``REPEATABLE READ READ ONLY`` transaction. Every section is read by keyset
pages of at most the asked batch (documents by id, units by document and seq, the others
by unit seq), each page one statement through :meth:`SqlDatabase.cancellable`: a cancel
stops a running statement and the next page never starts. Memory holds one page. A unit's
keyword text is the FTS5 body on SQLite; PostgreSQL keeps only its ``tsvector``, so there
it is ``None`` and the reader rebuilds it (:mod:`heed.transfer.archive`).

**Writing** is in short transactions under the bank's lock, each checking the bank's row
first (:class:`~heed.memory.store.BankGone`): a batch of observations, entities, entity
rows or links per call (unit and entity ids resolved to the bank's seqs and entities),
and a document in several: its row and chunks with its seqs reserved (all of them at
once, so its units are consecutive), then its units a batch at a time, each batch written
before the next is asked for, the token checked between them. So a document is whole only
when the call returns: the writes are for a staging bank, discarded whole on failure
(:mod:`heed.transfer.service`). Memories are written differently on each database:

- SQLite: :data:`UNITS_PER_TRANSACTION` a transaction, one after the other. A cancel, which
  writes the run's phase and needs SQLite's one writer, waits for one such transaction.
- PostgreSQL: nearly all of a memory's write is pgvector's HNSW insert, CPU in the server
  (``benchmarks/transfer_pg_costs.py``, a bank of 20,000: 2.7 ms of a memory's 2.8 ms on
  one connection; the GIN keyword index costs too little to measure), which one statement
  does row after row in one server process. So a batch is split among
  :data:`PG_WRITERS` connections at once, each part one transaction of at most
  :data:`PG_UNITS_PER_TRANSACTION` holding the bank's lock *shared* (a delete, which
  takes it whole, waits for the parts or they find the bank gone). Each part runs in
  :meth:`PostgresDatabase.cancellable`: a cancel stops its running statement (a few ms:
  the row being inserted), so a part's size does not bound a cancel's wait. Vectors go
  as binary parameters (:class:`_Vector`), the rows of a part in one ``INSERT``.

Shared values (long tags, metadata, contexts) are stored once per bank as every write does
(:mod:`~.values`; on PostgreSQL each part stores its own at its end, in one order).
:meth:`TransferRows.publish_bank` moves a finished bank to its real ``(tenant, bank_id)``
in one statement.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import json
import sqlite3
import struct
import sys
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from heed.errors import refuse_nul
from heed.memory.entities import canonical
from heed.memory.models import Bank
from heed.memory.store import BankGone, BankTaken
from heed.runtime import raise_if_cancelled, reraise_cancellation
from heed.storage.memory.dialect import MemoryDialect
from heed.storage.memory.rows import (
    DOCUMENT_VALUES,
    UNIT_COLUMNS,
    UNIT_WRITE_COLUMNS,
    bank_token,
    now_iso,
    refuse_nul_in_bank,
    touch_bank,
    unit_from_row,
)
from heed.storage.memory.values import ValueWriter
from heed.storage.memory.writes import (
    BANK_LOCK,
    LINK_COLUMNS,
    MEMBERSHIP_COLUMNS,
    WRITE_BATCH,
    DocumentWrites,
)
from heed.transfer.rows import (
    BankReader,
    BankSelection,
    ChunkRow,
    DocumentRow,
    EntityRow,
    LinkRow,
    MembershipRow,
    UnitRow,
)

if TYPE_CHECKING:
    from heed.storage.database import SqlDatabase

__all__ = ["TransferRows"]

#: Memories one write transaction holds at most on SQLite: what a cancel may wait for (its
#: own write of the run's phase needs SQLite's one writer).
UNITS_PER_TRANSACTION: Final = 32
#: Connections a PostgreSQL write of memories uses at once, each a transaction of its own
#: part of the batch (the calling thread's and helpers'). pgvector's HNSW insert is nearly
#: all of the write's time (2.7 ms of server CPU a memory in a bank of 20,000:
#: ``benchmarks/transfer_pg_costs.py``), and one statement inserts its rows one after the
#: other in one server process, so only more connections make it faster. Two: on the
#: benchmarks' two CPUs, which the server and PostgreSQL share, more gained little.
PG_WRITERS: Final = 2
#: Memories one PostgreSQL transaction holds at most, inserted by one statement (27
#: parameters a row: PostgreSQL takes 65,535). Not a bound on a cancel's wait (a cancel
#: stops the running statement, :meth:`PostgresDatabase.cancellable`), only on what a
#: failed part throws away.
PG_UNITS_PER_TRANSACTION: Final = 256
#: Threads that run PostgreSQL parts beside the calling thread, shared by every write.
_HELPERS: Final = 8

#: A unit's keyword text on SQLite (its FTS5 body), in a ``SELECT ... FROM memory_units``.
_SQLITE_INDEX_TEXT: Final = (
    "(SELECT f.body FROM memory_fts f WHERE f.rowid = memory_units.seq) AS index_text"
)


def _vector_from_pg(data: bytes) -> np.ndarray:
    """A float32 array from pgvector's binary form (dim, unused, big-endian float4s)."""
    dim = int.from_bytes(data[:2], "big")
    return np.frombuffer(data, dtype=">f4", count=dim, offset=4).astype(np.float32)


class _Vector(bytes):
    """A vector in pgvector's binary form (``dim``, an unused 0, big-endian float4s), sent
    as a binary parameter of the ``vector`` type (:func:`_vector_dumper`): the text form
    cost 180 us a vector to write in Python and as much again to parse in the server."""

    __slots__ = ()


def _pg_vector(vector: Any) -> _Vector | None:
    """*vector* (float32) as a :class:`_Vector` (``None`` stays ``None``)."""
    if vector is None:
        return None
    values = np.asarray(vector, dtype=">f4").ravel()
    return _Vector(struct.pack(">HH", values.size, 0) + values.tobytes())


def _vector_dumper(oid: int) -> type[Any]:
    """A psycopg dumper sending a :class:`_Vector` as it is, in binary, as the type *oid*
    (pgvector's ``vector`` in the database: extensions have no fixed oid)."""
    from psycopg.adapt import Dumper
    from psycopg.pq import Format

    class VectorDumper(Dumper):
        format = Format.BINARY

        def dump(self, obj: Any) -> bytes:
            return bytes(obj)

    VectorDumper.oid = oid
    return VectorDumper


class _SortedValues(ValueWriter):
    """A :class:`ValueWriter` storing its values in digest order: parts of one bank written
    at once on several connections then wait for each other's values (a unique key) in one
    order, never in a cycle (a deadlock)."""

    def store(self, conn: Any, bank_ref: str) -> None:
        self._bodies = dict(sorted(self._bodies.items()))
        super().store(conn, bank_ref)


_helper_pool: ThreadPoolExecutor | None = None
_helper_pool_lock = threading.Lock()


def _helpers() -> ThreadPoolExecutor:
    global _helper_pool
    with _helper_pool_lock:
        if _helper_pool is None:
            _helper_pool = ThreadPoolExecutor(_HELPERS, thread_name_prefix="heed-pg-writer")
        return _helper_pool


def _concurrently(jobs: Sequence[Callable[[], None]], writers: int) -> None:
    """Run *jobs* on up to *writers* threads, this one among them, each helper in a copy of
    this thread's context (its token: a cancel stops every job's running statement).
    Returns once no job runs any more; raises the first error, after which no job starts.
    """
    if writers <= 1 or len(jobs) <= 1:
        for job in jobs:
            job()
        return
    pending = iter(jobs)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def drain() -> None:
        while True:
            with lock:
                job = None if errors else next(pending, None)
            if job is None:
                return
            try:
                job()
            except BaseException as exc:  # noqa: BLE001 -- raised by the calling thread below
                with lock:
                    errors.append(exc)
                return

    pool = _helpers()
    helpers = [
        pool.submit(contextvars.copy_context().run, drain)
        for _ in range(min(writers, len(jobs)) - 1)
    ]
    drain()
    for helper in helpers:
        if not helper.cancel():  # one not started yet has nothing left to do
            helper.result()
    if errors:
        raise errors[0]


class _Reader:
    """A :class:`~heed.transfer.rows.BankReader` over an open snapshot *conn*."""

    def __init__(
        self,
        conn: Any,
        bank_ref: str,
        selection: BankSelection,
        dialect: MemoryDialect,
        database: str,
    ) -> None:
        self.conn = conn
        self.bank_ref = bank_ref
        self.selection = selection
        self.dialect = dialect
        self.postgres = database == "postgresql"

    # -- the selection ---------------------------------------------------------------------

    def _units_where(self, table: str) -> tuple[str, tuple[Any, ...]]:
        """The selected units of the bank, as a condition on *table* (a name or alias)."""
        where = f"{table}.bank_ref = ?"
        params: tuple[Any, ...] = (self.bank_ref,)
        ids = self.selection.document_ids
        if ids is not None:
            match, more = self.dialect.any_of(f"{table}.document_id", list(ids), "text")
            where += f" AND {match}"
            params += more
        if not self.selection.with_observations:
            where += f" AND {table}.document_id IS NOT NULL"
        return where, params

    def count_units(self) -> int:
        where, params = self._units_where("memory_units")
        row = self.conn.execute(f"SELECT COUNT(*) FROM memory_units WHERE {where}", params)
        return int(row.fetchone()[0])

    # -- documents ---------------------------------------------------------------------------

    def documents(self, batch: int) -> Iterator[list[DocumentRow]]:
        where = "d.bank_ref = ?"
        params: tuple[Any, ...] = (self.bank_ref,)
        if self.selection.document_ids is not None:
            match, more = self.dialect.any_of(
                "d.document_id", list(self.selection.document_ids), "text"
            )
            where += f" AND {match}"
            params += more
        after = ""
        while True:
            raise_if_cancelled()
            rows = self.conn.execute(
                f"SELECT d.*, {DOCUMENT_VALUES},"
                " (SELECT COUNT(*) FROM memory_units u WHERE u.bank_ref = d.bank_ref"
                " AND u.document_id = d.document_id) AS n"
                f" FROM memory_documents d WHERE {where} AND d.document_id > ?"
                " ORDER BY d.document_id LIMIT ?",
                (*params, after, batch),
            ).fetchall()
            if not rows:
                return
            page = {
                r["document_id"]: DocumentRow(
                    document_id=r["document_id"],
                    original_text=r["original_text"],
                    content_hash=r["content_hash"],
                    metadata=json.loads(r["metadata_json"]),
                    tags=json.loads(r["tags_json"]),
                    created_at=r["created_at"],
                    updated_at=r["updated_at"],
                    unit_count=int(r["n"]),
                )
                for r in rows
            }
            match, ids = self.dialect.any_of("document_id", list(page), "text")
            for chunk in self.conn.execute(
                "SELECT id, document_id, chunk_index, text FROM memory_chunks"
                f" WHERE bank_ref = ? AND {match} ORDER BY document_id, chunk_index, id",
                (self.bank_ref, *ids),
            ).fetchall():
                page[chunk["document_id"]].chunks.append(
                    ChunkRow(chunk["id"], int(chunk["chunk_index"]), chunk["text"])
                )
            yield list(page.values())
            after = rows[-1]["document_id"]

    # -- units -------------------------------------------------------------------------------

    def _unit_page(self, where: str, params: Sequence[Any]) -> tuple[list[UnitRow], int]:
        """The units of ``SELECT seq FROM memory_units WHERE`` *where* (with its order and
        limit), in that order, with their keyword text (SQLite) and vectors. The page's
        seqs come first, by an index alone, and only its rows are read whole: selecting the
        whole rows with the order made SQLite build every row of the bank before sorting."""
        seqs = [
            int(r[0])
            for r in self.conn.execute(
                f"SELECT seq FROM memory_units WHERE {where}", tuple(params)
            ).fetchall()
        ]
        if not seqs:
            return [], 0
        index = _SQLITE_INDEX_TEXT if not self.postgres else "NULL AS index_text"
        match, seq_params = self.dialect.any_of("seq", seqs, "bigint")
        rows = {
            int(r["seq"]): r
            for r in self.conn.execute(
                f"SELECT {UNIT_COLUMNS}, {index} FROM memory_units WHERE {match}", seq_params
            ).fetchall()
        }
        vectors = self._vectors(seqs)
        out = []
        for seq in seqs:
            r = rows[seq]
            stored = unit_from_row(r)
            out.append(
                UnitRow(
                    id=stored.id,
                    document_id=stored.document_id,
                    chunk_id=stored.chunk_id,
                    text=stored.text,
                    index_text=r["index_text"],
                    fact_type=stored.fact_type,
                    context=stored.context,
                    occurred_start=stored.occurred_start,
                    occurred_end=stored.occurred_end,
                    mentioned_at=stored.mentioned_at,
                    metadata=stored.metadata,
                    tags=stored.tags,
                    created_at=stored.created_at,
                    updated_at=stored.updated_at,
                    token_count=stored.token_count,
                    consolidation_state=stored.consolidation_state,
                    source_ids=stored.source_ids,
                    proof_count=stored.proof_count,
                    history=stored.history,
                    vector=vectors.get(seq),
                )
            )
        return out, seqs[-1]

    def _vectors(self, seqs: list[int]) -> dict[int, np.ndarray]:
        match, params = self.dialect.any_of("seq", seqs, "bigint")
        sql = f"SELECT seq, embedding FROM memory_units WHERE {match} AND embedding IS NOT NULL"
        if self.postgres:  # pgvector's binary form: no text to parse
            return {int(r[0]): _vector_from_pg(r[1]) for r in self.conn.binary(sql, params)}
        return {
            int(r[0]): np.frombuffer(r[1], dtype=np.float32).copy()
            for r in self.conn.execute(sql, params).fetchall()
        }

    def units(self, batch: int) -> Iterator[list[UnitRow]]:
        where, params = self._units_where("memory_units")
        document, seq = "", 0
        while True:
            raise_if_cancelled()
            page, last = self._unit_page(
                f"{where} AND document_id IS NOT NULL AND (document_id, seq) > (?, ?)"
                " ORDER BY document_id, seq LIMIT ?",
                (*params, document, seq, batch),
            )
            if not page:
                return
            yield page
            document, seq = str(page[-1].document_id), last

    def observations(self, batch: int) -> Iterator[list[UnitRow]]:
        if not self.selection.with_observations:
            return
        seq = 0
        while True:
            raise_if_cancelled()
            page, last = self._unit_page(
                "bank_ref = ? AND document_id IS NULL AND seq > ? ORDER BY seq LIMIT ?",
                (self.bank_ref, seq, batch),
            )
            if not page:
                return
            yield page
            seq = last

    # -- entities and the graph ----------------------------------------------------------------

    def entities(self, batch: int) -> Iterator[list[EntityRow]]:
        where = "e.bank_ref = ?"
        params: tuple[Any, ...] = (self.bank_ref,)
        if not self.selection.whole_bank:
            units, more = self._units_where("u")
            where += (
                " AND EXISTS (SELECT 1 FROM memory_unit_entities ue JOIN memory_units u"
                f" ON u.seq = ue.unit_seq WHERE ue.entity_id = e.id AND {units})"
            )
            params += more
        after = ""
        while True:
            raise_if_cancelled()
            rows = self.conn.execute(
                f"SELECT e.id, e.name, e.type FROM memory_entities e WHERE {where}"
                " AND e.id > ? ORDER BY e.id LIMIT ?",
                (*params, after, batch),
            ).fetchall()
            if not rows:
                return
            yield [EntityRow(r["id"], r["name"], r["type"]) for r in rows]
            after = rows[-1]["id"]

    def _unit_ids(self, batch: int) -> Iterator[dict[int, str]]:
        """The selected units' ``seq -> id``, by seq, in pages."""
        where, params = self._units_where("memory_units")
        seq = 0
        while True:
            raise_if_cancelled()
            rows = self.conn.execute(
                f"SELECT seq, id FROM memory_units WHERE {where} AND seq > ? ORDER BY seq LIMIT ?",
                (*params, seq, batch),
            ).fetchall()
            if not rows:
                return
            yield {int(r[0]): str(r[1]) for r in rows}
            seq = int(rows[-1][0])

    def memberships(self, batch: int) -> Iterator[list[MembershipRow]]:
        for ids in self._unit_ids(batch):
            match, params = self.dialect.any_of("unit_seq", list(ids), "bigint")
            rows = self.conn.execute(
                f"SELECT unit_seq, entity_id FROM memory_unit_entities WHERE {match}"
                " ORDER BY unit_seq, entity_id",
                params,
            ).fetchall()
            if rows:
                yield [MembershipRow(ids[int(r[0])], str(r[1])) for r in rows]

    def links(self, batch: int) -> Iterator[list[LinkRow]]:
        targets, target_params = self._units_where("t")
        for ids in self._unit_ids(batch):
            match, params = self.dialect.any_of("l.from_seq", list(ids), "bigint")
            # CROSS JOIN: the links of the page first, then their targets by key (with a
            # plain join SQLite walked the whole bank's units for every page).
            rows = self.conn.execute(
                "SELECT l.from_seq, t.id, l.link_type, l.weight FROM memory_links l"
                f" CROSS JOIN memory_units t WHERE t.seq = l.to_seq AND {match} AND {targets}"
                " ORDER BY l.from_seq, l.to_seq, l.link_type",
                (*params, *target_params),
            ).fetchall()
            if rows:
                yield [LinkRow(ids[int(r[0])], str(r[1]), str(r[2]), float(r[3])) for r in rows]


def _placeholder(document_id: str, now: str) -> UnitRow:
    """The row that holds a document's last seq until its last memory is written (see
    :meth:`TransferRows.write_document_rows`): no text, no vector."""
    return UnitRow(
        id=f"reserved-{uuid.uuid4()}",
        document_id=document_id,
        chunk_id=None,
        text="",
        index_text="",
        fact_type="world",
        context=None,
        occurred_start=None,
        occurred_end=None,
        mentioned_at=None,
        metadata={},
        tags=[],
        created_at=now,
        updated_at=None,
        token_count=None,
        consolidation_state=None,
        source_ids=[],
        proof_count=None,
        history=[],
    )


def _unique_violation(exc: Exception) -> bool:
    """Whether *exc* is the database refusing a duplicate key (either database's driver)."""
    if isinstance(exc, sqlite3.IntegrityError):
        return True
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(exc, psycopg.errors.UniqueViolation)


def _refuse_nul_in_unit(unit: UnitRow) -> None:
    refuse_nul(unit.id, "a memory's id")
    refuse_nul(unit.text, "a memory's text")
    refuse_nul(unit.index_text, "a memory's index text")
    refuse_nul(unit.context, "context")
    refuse_nul(unit.fact_type, "fact_type")
    for text in (*unit.tags, *unit.metadata, *(str(v) for v in unit.metadata.values())):
        refuse_nul(text, "a memory's tags or metadata")


def _pieces(units: Sequence[UnitRow], size: int) -> Iterator[Sequence[UnitRow]]:
    """*units* in slices of at most *size*."""
    for start in range(0, len(units), size):
        yield units[start : start + size]


class TransferRows(DocumentWrites):
    """A bank's rows read and written in batches (see the module docstring and
    :class:`heed.memory.store.TransferStore`), beside the document writes."""

    db: SqlDatabase
    dialect: MemoryDialect
    dim: int

    # -- reading -----------------------------------------------------------------------

    @contextmanager
    def read_bank(self, bank_ref: str, selection: BankSelection) -> Iterator[BankReader]:
        """See :meth:`heed.memory.store.TransferStore.read_bank`."""
        with self._snapshot() as conn:
            yield _Reader(conn, bank_ref, selection, self.dialect, self.db.dialect)

    @contextmanager
    def _snapshot(self) -> Iterator[Any]:
        """A cancellable read connection inside one read-only snapshot."""
        if self.db.dialect == "postgresql":
            from heed.storage.postgres import PostgresDatabase

            assert isinstance(self.db, PostgresDatabase)
            with self.db.cancellable(transaction=True) as statements:
                statements.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY", ())
                yield statements
            return
        with self.db.cancellable() as conn:
            conn.execute("BEGIN")  # deferred: the first read fixes the snapshot
            try:
                yield conn
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")  # read only: nothing to keep

    # -- writing -----------------------------------------------------------------------

    def _row(
        self,
        bank_ref: str,
        unit: UnitRow,
        generation: int,
        values: ValueWriter,
        vector: Callable[[Any], Any],
    ) -> tuple[Any, ...]:
        """*unit*'s ``memory_units`` row (:data:`UNIT_WRITE_COLUMNS`, in order; its seq,
        known in the transaction, is filled in by :meth:`_insert`), its vector encoded by
        *vector*."""
        _refuse_nul_in_unit(unit)
        if unit.vector is not None and np.size(unit.vector) != self.dim:
            raise ValueError(
                f"memory {unit.id} has a {np.size(unit.vector)}-dimensional vector; "
                f"this store holds {self.dim}-dimensional vectors"
            )
        context, context_ref = values.encode_text(unit.context)
        metadata, metadata_ref = values.encode(unit.metadata)
        tags, tags_ref = values.encode(unit.tags)
        by_column = {
            "seq": 0,
            "id": unit.id,
            "bank_ref": bank_ref,
            "document_id": unit.document_id,
            "chunk_id": unit.chunk_id,
            "text": unit.text,
            "fact_type": unit.fact_type,
            "context": context,
            "context_ref": context_ref,
            "occurred_start": unit.occurred_start,
            "occurred_end": unit.occurred_end,
            "mentioned_at": unit.mentioned_at,
            "metadata": metadata,
            "metadata_ref": metadata_ref,
            "tags": tags,
            "tags_ref": tags_ref,
            "embedding": vector(unit.vector),
            "created_at": unit.created_at,
            "updated_at": unit.updated_at,
            "token_count": unit.token_count,
            "consolidation_state": unit.consolidation_state,
            "source_ids": json.dumps(unit.source_ids) if unit.source_ids else None,
            "proof_count": unit.proof_count,
            "history": json.dumps(unit.history) if unit.history else None,
            "generation": generation,
        }
        return tuple(by_column[column] for column in UNIT_WRITE_COLUMNS)

    def _rows(
        self, bank_ref: str, units: Sequence[UnitRow], values: ValueWriter, generation: int = 0
    ) -> list[tuple[Any, ...]]:
        """*units*' rows, built before the transaction: it holds the writer (SQLite) or its
        connection (PostgreSQL) only for the statements. On SQLite their generation, known
        in the transaction, is filled in by :meth:`_insert`."""
        if self.db.dialect == "postgresql":
            return [self._row(bank_ref, unit, generation, values, _pg_vector) for unit in units]
        encode = self.dialect.encode_vector
        return [self._row(bank_ref, unit, generation, values, encode) for unit in units]

    def _insert(
        self,
        conn: Any,
        bank_ref: str,
        units: Sequence[UnitRow],
        rows: Sequence[tuple[Any, ...]],
        seqs: Sequence[int],
        generation: int,
    ) -> None:
        """Insert *units* (their *rows* from :meth:`_rows`) on *seqs*, with their keyword
        text, in the caller's transaction."""
        token = bank_token(bank_ref)
        for start in range(0, len(units), WRITE_BATCH):
            raise_if_cancelled()
            end = start + WRITE_BATCH
            ready = [
                (seq, *row[1:-1], generation)
                for seq, row in zip(seqs[start:end], rows[start:end], strict=True)
            ]
            keywords = [(token, unit.index_text or unit.text) for unit in units[start:end]]
            self.dialect.insert_units(conn, ready, keywords)

    # -- PostgreSQL: memories written on several connections at once ---------------------

    def _vector_type(self) -> type[Any]:
        """The dumper of :class:`_Vector` for this database (its ``vector`` oid, read once)."""
        dumper: type[Any] | None = self.__dict__.get("_pg_vector_dumper")
        if dumper is None:
            with self.db.read() as conn:
                oid = int(conn.execute("SELECT 'vector'::regtype::oid").fetchone()[0])
            dumper = self.__dict__["_pg_vector_dumper"] = _vector_dumper(oid)
        return dumper

    def _pg_write(
        self,
        bank_ref: str,
        units: Sequence[UnitRow],
        seqs: Sequence[int],
        generation: int,
        placeholder: int | None,
    ) -> None:
        """Write *units* on their reserved *seqs* in parts, on up to :data:`PG_WRITERS`
        connections at once, each part a transaction of its own (:meth:`_pg_part`); the
        part holding the seq *placeholder* replaces the placeholder's row. Returns once
        every part is written; the first part that failed is raised (a cancel stops each
        running part's statement: see the module docstring)."""
        dumper = self._vector_type()
        size = min(PG_UNITS_PER_TRANSACTION, -(-len(units) // PG_WRITERS))
        jobs: list[Callable[[], None]] = []
        for start in range(0, len(units), size):
            part = units[start : start + size]
            values = _SortedValues()
            rows = self._rows(bank_ref, part, values, generation)
            mine = seqs[start : start + size]
            replaces = placeholder if placeholder in mine else None
            jobs.append(
                functools.partial(
                    self._pg_part, bank_ref, part, rows, mine, generation, values, replaces, dumper
                )
            )
        _concurrently(jobs, PG_WRITERS)

    def _pg_part(
        self,
        bank_ref: str,
        units: Sequence[UnitRow],
        rows: Sequence[tuple[Any, ...]],
        seqs: Sequence[int],
        generation: int,
        values: ValueWriter,
        placeholder: int | None,
        dumper: type[Any],
    ) -> None:
        """One part of :meth:`_pg_write`: a cancellable transaction holding the bank's lock
        shared (the bank's other parts write beside it; a delete, which takes it whole,
        waits for them or they find the bank gone). The bank's generation is not bumped
        here: its row lock would make the parts wait for each other (the transaction that
        reserved the seqs bumped it, and on PostgreSQL no process keeps a bank's vectors by
        generation: they are searched in the database)."""
        from heed.storage.memory.postgres import INSERT_UNITS, UNIT_VALUES
        from heed.storage.postgres import PostgresDatabase

        assert isinstance(self.db, PostgresDatabase)
        with self.db.cancellable(transaction=True) as statements:
            statements.execute(
                "SELECT pg_advisory_xact_lock_shared(hashtextextended(?, 0))",
                (BANK_LOCK + bank_ref,),
            )
            if (
                statements.execute("SELECT 1 FROM memory_banks WHERE ref = ?", (bank_ref,))
            ).fetchone() is None:
                raise BankGone(bank_ref)
            statements.conn.raw.adapters.register_dumper(_Vector, dumper)
            if placeholder is not None:
                statements.execute("DELETE FROM memory_units WHERE seq = ?", (placeholder,))
            token = bank_token(bank_ref)
            params: list[Any] = []
            for seq, row, unit in zip(seqs, rows, units, strict=True):
                params += (seq, *row[1:-1], generation, token, unit.index_text or unit.text)
            # One statement (a pipelined executemany, stopped by a cancel, made psycopg
            # log a warning on every cancelled part).
            statements.execute(INSERT_UNITS + ",".join([UNIT_VALUES] * len(rows)), params)
            raise_if_cancelled()
            values.store(statements.conn, bank_ref)

    # -- writing, either database ------------------------------------------------------------

    def write_document_rows(
        self, bank_ref: str, document: DocumentRow, units: Iterable[Sequence[UnitRow]]
    ) -> int:
        """See :meth:`heed.memory.store.TransferStore.write_document_rows`.

        The first transaction writes the document's row and chunks and reserves its seqs:
        it allocates them all and writes a placeholder row on the last one, so no other
        writer takes one (on SQLite a seq is the largest plus one; PostgreSQL's blocks are
        reserved already). Each batch of units is then written before the next is asked
        for, and the part of it holding the last seq replaces the placeholder. On SQLite a
        batch goes in transactions of :data:`UNITS_PER_TRANSACTION`, which keep SQLite's one
        writer lock free for others: a cancel, which writes the run's phase, waits for one,
        not for a whole document of hundreds of memories. On PostgreSQL a batch is split
        among :data:`PG_WRITERS` connections (:meth:`_pg_write`)."""
        refuse_nul(document.document_id, "document_id")
        refuse_nul(document.original_text, f"the text of document {document.document_id!r}")
        for chunk in document.chunks:
            refuse_nul(chunk.text, f"a chunk of document {document.document_id!r}")
        count = document.unit_count
        now = now_iso()
        values = ValueWriter()
        with self.db.write() as conn:
            self.lock_bank(conn, bank_ref)
            generation = touch_bank(conn, bank_ref, now)
            taken = conn.execute(
                "SELECT 1 FROM memory_documents WHERE bank_ref = ? AND document_id = ?",
                (bank_ref, document.document_id),
            ).fetchone()
            if taken is not None:
                raise ValueError(f"document {document.document_id!r} is in the bank already")
            conn.execute(
                "INSERT INTO memory_documents (bank_ref, document_id, original_text,"
                " content_hash, metadata, metadata_ref, tags, tags_ref, created_at, updated_at)"
                " VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    bank_ref,
                    document.document_id,
                    document.original_text,
                    hashlib.sha256(document.original_text.encode()).hexdigest(),
                    *values.encode(document.metadata),
                    *values.encode(document.tags),
                    document.created_at,
                    document.updated_at,
                ),
            )
            if document.chunks:
                conn.executemany(
                    "INSERT INTO memory_chunks (id, bank_ref, document_id, chunk_index, text)"
                    " VALUES (?,?,?,?,?)",
                    [
                        (c.id, bank_ref, document.document_id, c.chunk_index, c.text)
                        for c in document.chunks
                    ],
                )
            [seqs] = self.dialect.allocate_seqs(conn, [count])
            if count:
                reserve = [_placeholder(document.document_id, now)]
                rows = [self._row(bank_ref, reserve[0], 0, values, self.dialect.encode_vector)]
                self._insert(conn, bank_ref, reserve, rows, seqs[-1:], generation)
            values.store(conn, bank_ref)
        postgres = self.db.dialect == "postgresql"
        written = 0
        for batch in units:
            if not batch:
                continue
            if written + len(batch) > count:
                raise ValueError(
                    f"document {document.document_id!r} has more memories than its "
                    f"unit_count ({count})"
                )
            for unit in batch:
                if unit.document_id != document.document_id:
                    raise ValueError(
                        f"memory {unit.id} belongs to document {unit.document_id!r}, "
                        f"not {document.document_id!r}"
                    )
            if postgres:
                raise_if_cancelled()
                mine = seqs[written : written + len(batch)]
                last = seqs[-1] if written + len(batch) == count else None
                self._pg_write(bank_ref, batch, mine, generation, last)
                written += len(batch)
                continue
            for part in _pieces(batch, UNITS_PER_TRANSACTION):
                raise_if_cancelled()
                values = ValueWriter()
                rows = self._rows(bank_ref, part, values)
                with self.db.write() as conn:
                    self.lock_bank(conn, bank_ref)
                    generation = touch_bank(conn, bank_ref, now)
                    if written + len(part) == count:  # the last part takes the placeholder's
                        conn.execute("DELETE FROM memory_units WHERE seq = ?", (seqs[-1],))
                        self.dialect.drop_keywords(conn, seqs[-1:])
                    mine = seqs[written : written + len(part)]
                    self._insert(conn, bank_ref, part, rows, mine, generation)
                    values.store(conn, bank_ref)
                written += len(part)
        if written != count:
            raise ValueError(
                f"document {document.document_id!r} has {written} memories, "
                f"not its unit_count ({count})"
            )
        return written

    def write_unit_rows(self, bank_ref: str, units: Sequence[UnitRow]) -> int:
        """See :meth:`heed.memory.store.TransferStore.write_unit_rows`."""
        for unit in units:
            if unit.document_id is not None:
                raise ValueError(
                    f"memory {unit.id} belongs to document {unit.document_id!r}: "
                    "write it with its document"
                )
        if not units:
            return 0
        if self.db.dialect == "postgresql":
            raise_if_cancelled()
            with self.db.write() as conn:  # the seqs and the generation, then the parts
                self.lock_bank(conn, bank_ref)
                generation = touch_bank(conn, bank_ref, now_iso())
                [seqs] = self.dialect.allocate_seqs(conn, [len(units)])
            self._pg_write(bank_ref, units, seqs, generation, None)
            return len(units)
        for part in _pieces(units, UNITS_PER_TRANSACTION):
            raise_if_cancelled()
            values = ValueWriter()
            rows = self._rows(bank_ref, part, values)
            with self.db.write() as conn:
                self.lock_bank(conn, bank_ref)
                generation = touch_bank(conn, bank_ref, now_iso())
                [seqs] = self.dialect.allocate_seqs(conn, [len(part)])
                self._insert(conn, bank_ref, part, rows, seqs, generation)
                values.store(conn, bank_ref)
        return len(units)

    def write_entity_rows(self, bank_ref: str, entities: Sequence[EntityRow]) -> int:
        """See :meth:`heed.memory.store.TransferStore.write_entity_rows`."""
        rows = []
        for entity in entities:
            refuse_nul(entity.id, "an entity id")
            refuse_nul(entity.name, "an entity name")
            refuse_nul(entity.type, "an entity type")
            key = canonical(entity.name)
            if not key:
                raise ValueError(f"entity {entity.id} has no name to match by: {entity.name!r}")
            rows.append((entity.id, bank_ref, key, entity.name, entity.type))
        with self.db.write() as conn:
            self.lock_bank(conn, bank_ref)
            touch_bank(conn, bank_ref)
            for start in range(0, len(rows), WRITE_BATCH):
                raise_if_cancelled()
                conn.executemany(
                    "INSERT INTO memory_entities (id, bank_ref, canonical, name, type)"
                    " VALUES (?,?,?,?,?)",
                    rows[start : start + WRITE_BATCH],
                )
        return len(rows)

    def _seqs_of(self, conn: Any, bank_ref: str, unit_ids: Iterable[str]) -> dict[str, int]:
        """The bank's seqs of *unit_ids* (those it holds). By the unique index on ``id``
        alone: with ``bank_ref`` in the condition SQLite walked the whole bank instead."""
        wanted = list(dict.fromkeys(unit_ids))
        out: dict[str, int] = {}
        step = self.dialect.list_max
        for start in range(0, len(wanted), step):
            match, params = self.dialect.any_of("id", wanted[start : start + step], "text")
            for unit_id, seq, ref in conn.execute(
                f"SELECT id, seq, bank_ref FROM memory_units WHERE {match}", params
            ).fetchall():
                if ref == bank_ref:
                    out[str(unit_id)] = int(seq)
        return out

    def _missing(self, found: dict[str, int], wanted: Iterable[str], what: str) -> None:
        for unit_id in wanted:
            if unit_id not in found:
                raise ValueError(f"{what} names memory {unit_id}, which the bank does not hold")

    def write_membership_rows(self, bank_ref: str, memberships: Sequence[MembershipRow]) -> int:
        """See :meth:`heed.memory.store.TransferStore.write_membership_rows`."""
        if not memberships:
            return 0
        with self.db.write() as conn:
            self.lock_bank(conn, bank_ref)
            touch_bank(conn, bank_ref)
            seqs = self._seqs_of(conn, bank_ref, (m.unit_id for m in memberships))
            self._missing(seqs, (m.unit_id for m in memberships), "an entity row")
            entity_ids = list(dict.fromkeys(m.entity_id for m in memberships))
            known: set[str] = set()
            step = self.dialect.list_max
            for start in range(0, len(entity_ids), step):
                match, params = self.dialect.any_of("id", entity_ids[start : start + step], "text")
                known.update(
                    str(r[0])
                    for r in conn.execute(
                        f"SELECT id FROM memory_entities WHERE bank_ref = ? AND {match}",
                        (bank_ref, *params),
                    ).fetchall()
                )
            for entity_id in entity_ids:
                if entity_id not in known:
                    raise ValueError(f"an entity row names entity {entity_id}, not the bank's")
            return self.dialect.insert_rows(
                conn,
                "memory_unit_entities",
                MEMBERSHIP_COLUMNS,
                [(seqs[m.unit_id], m.entity_id) for m in memberships],
            )

    def write_link_rows(self, bank_ref: str, links: Sequence[LinkRow]) -> int:
        """See :meth:`heed.memory.store.TransferStore.write_link_rows`."""
        if not links:
            return 0
        for link in links:
            refuse_nul(link.link_type, "a link type")
        ends = [i for link in links for i in (link.from_id, link.to_id)]
        with self.db.write() as conn:
            self.lock_bank(conn, bank_ref)
            touch_bank(conn, bank_ref)
            seqs = self._seqs_of(conn, bank_ref, ends)
            self._missing(seqs, ends, "a link")
            return self.dialect.insert_rows(
                conn,
                "memory_links",
                LINK_COLUMNS,
                [(seqs[k.from_id], seqs[k.to_id], k.link_type, float(k.weight)) for k in links],
            )

    def delete_bank_in_batches(self, bank_ref: str, batch: int) -> int:
        """See :meth:`heed.memory.store.TransferStore.delete_bank_in_batches`."""
        deleted = 0
        while True:
            with self.db.write() as conn:
                self.lock_bank(conn, bank_ref)
                seqs = [
                    int(r[0])
                    for r in conn.execute(
                        "SELECT seq FROM memory_units WHERE bank_ref = ? ORDER BY seq LIMIT ?",
                        (bank_ref, max(1, batch)),
                    ).fetchall()
                ]
                if not seqs:
                    break
                self.dialect.drop_keywords(conn, seqs)
                for table, column in (
                    ("memory_links", "from_seq"),
                    ("memory_links", "to_seq"),
                    ("memory_unit_entities", "unit_seq"),
                    ("memory_units", "seq"),
                ):
                    match, params = self.dialect.any_of(column, seqs, "bigint")
                    conn.execute(f"DELETE FROM {table} WHERE {match}", params)
            deleted += len(seqs)
        self.delete_bank(bank_ref)  # what is left: documents, chunks, entities, the row
        return deleted

    def publish_bank(self, bank: Bank) -> Bank:
        """See :meth:`heed.memory.store.TransferStore.publish_bank`."""
        refuse_nul_in_bank(bank)
        now = now_iso()
        with self.db.write() as conn:
            self.lock_bank(conn, bank.ref)
            row = conn.execute(
                f"SELECT created_at FROM memory_banks WHERE ref = ?{self.db.for_update}",
                (bank.ref,),
            ).fetchone()
            if row is None:
                raise BankGone(bank.ref)
            try:
                moved = conn.execute(
                    "UPDATE memory_banks SET tenant = ?, bank_id = ?, name = ?, mission = ?,"
                    " background = ?, disposition = ?, config = ?, updated_at = ?"
                    " WHERE ref = ? AND NOT EXISTS (SELECT 1 FROM memory_banks o"
                    " WHERE o.tenant = ? AND o.bank_id = ? AND o.ref <> ?)",
                    (
                        bank.tenant,
                        bank.bank_id,
                        bank.name,
                        bank.mission,
                        bank.background,
                        json.dumps(bank.disposition),
                        json.dumps(bank.config),
                        now,
                        bank.ref,
                        bank.tenant,
                        bank.bank_id,
                        bank.ref,
                    ),
                ).rowcount
            except Exception as exc:
                reraise_cancellation(exc)
                if not _unique_violation(exc):
                    raise
                raise BankTaken(bank.bank_id) from exc  # created by another process meanwhile
            if moved != 1:
                raise BankTaken(bank.bank_id)
        bank.created_at = str(row["created_at"])
        bank.updated_at = now
        return bank
