"""The memory store's part for bank transfers: a whole bank read and written as rows.

:class:`TransferRows` implements :class:`heed.transfer.store.TransferStore` on either
database, in the same portable SQL as the rest of the store; what differs is asked of the
database's part (:class:`~heed.storage.memory.dialect.MemoryDialect`: lists, bulk
inserts, seqs, the keyword index, the read snapshot, how vectors are read back, and
whether memories are written on several connections at once).

**Reading** (:meth:`TransferRows.read_bank`): a :class:`~.reader.SnapshotReader` inside
one snapshot, by keyset pages.

**Writing** is in short transactions under the bank's lock, each checking the bank's row
first (:class:`~heed.memory.store.BankGone`): a batch of observations, entities, entity
rows or links per call (unit and entity ids resolved to the bank's seqs and entities),
and a document in several: its row and chunks with its seqs reserved (all of them at
once, so its units are consecutive), then its units a batch at a time, each batch written
before the next is asked for, the token checked between them. So a document is whole only
when the call returns: the writes are for a staging bank, discarded whole on failure
(:mod:`heed.transfer.runs`). Memories are written :data:`UNITS_PER_TRANSACTION` a
transaction, one after the other (SQLite: a cancel, which writes the run's phase and
needs SQLite's one writer, waits for one such transaction), or, where the database's part
has a way (:meth:`MemoryDialect.parallel_unit_writes`: PostgreSQL,
:mod:`heed.storage.transfer.pg_parallel`), on several connections at once.

Shared values (long tags, metadata, contexts) are stored once per bank as every write does
(:mod:`heed.storage.memory.values`). :meth:`TransferRows.publish_bank` moves a finished
bank to its real ``(tenant, bank_id)`` in one statement.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
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
    UNIT_WRITE_COLUMNS,
    bank_token,
    now_iso,
    refuse_nul_in_bank,
    touch_bank,
)
from heed.storage.memory.values import ValueWriter
from heed.storage.memory.writes import (
    LINK_COLUMNS,
    MEMBERSHIP_COLUMNS,
    WRITE_BATCH,
    DocumentWrites,
)
from heed.storage.transfer.reader import SnapshotReader
from heed.transfer.rows import (
    BankReader,
    BankSelection,
    DocumentRow,
    EntityRow,
    LinkRow,
    MembershipRow,
    UnitRow,
)

if TYPE_CHECKING:
    from heed.storage.database import SqlDatabase

__all__ = ["UNITS_PER_TRANSACTION", "TransferRows"]

#: Memories one write transaction holds at most where they are written one transaction
#: after the other (SQLite): what a cancel may wait for (its own write of the run's phase
#: needs SQLite's one writer).
UNITS_PER_TRANSACTION: Final = 32


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
    :class:`heed.transfer.store.TransferStore`), beside the document writes."""

    db: SqlDatabase
    dialect: MemoryDialect
    dim: int

    # -- reading -----------------------------------------------------------------------

    @contextmanager
    def read_bank(self, bank_ref: str, selection: BankSelection) -> Iterator[BankReader]:
        """See :meth:`heed.transfer.store.TransferStore.read_bank`."""
        with self.dialect.read_snapshot() as conn:
            yield SnapshotReader(conn, bank_ref, selection, self.dialect)

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
        self,
        bank_ref: str,
        units: Sequence[UnitRow],
        values: ValueWriter,
        generation: int = 0,
        vector: Callable[[Any], Any] | None = None,
    ) -> list[tuple[Any, ...]]:
        """*units*' rows, built before the transaction: it holds the writer (SQLite) or its
        connection (PostgreSQL) only for the statements; vectors encoded by *vector* (the
        dialect's by default). Written one transaction after the other, their generation,
        known in the transaction, is filled in by :meth:`_insert`."""
        encode = vector or self.dialect.encode_vector
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

    # -- writing, either database ------------------------------------------------------------

    def write_document_rows(
        self, bank_ref: str, document: DocumentRow, units: Iterable[Sequence[UnitRow]]
    ) -> int:
        """See :meth:`heed.transfer.store.TransferStore.write_document_rows`.

        The first transaction writes the document's row and chunks and reserves its seqs:
        it allocates them all and writes a placeholder row on the last one, so no other
        writer takes one (on SQLite a seq is the largest plus one; PostgreSQL's blocks are
        reserved already). Each batch of units is then written before the next is asked
        for, and the part of it holding the last seq replaces the placeholder. A batch
        goes in transactions of :data:`UNITS_PER_TRANSACTION`, which keep SQLite's one
        writer lock free for others: a cancel, which writes the run's phase, waits for one,
        not for a whole document of hundreds of memories; or, on PostgreSQL, split among
        several connections (:meth:`MemoryDialect.parallel_unit_writes`)."""
        refuse_nul(document.document_id, "document_id")
        refuse_nul(document.original_text, f"the text of document {document.document_id!r}")
        for chunk in document.chunks:
            refuse_nul(chunk.text, f"a chunk of document {document.document_id!r}")
        count = document.unit_count
        now = now_iso()
        values = ValueWriter()
        with self.bank_write(bank_ref) as conn:
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
        parallel = self.dialect.parallel_unit_writes()
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
            if parallel is not None:
                raise_if_cancelled()
                mine = seqs[written : written + len(batch)]
                last = seqs[-1] if written + len(batch) == count else None
                parallel.write(self._rows, bank_ref, batch, mine, generation, last)
                written += len(batch)
                continue
            for part in _pieces(batch, UNITS_PER_TRANSACTION):
                raise_if_cancelled()
                values = ValueWriter()
                rows = self._rows(bank_ref, part, values)
                with self.bank_write(bank_ref) as conn:
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
        """See :meth:`heed.transfer.store.TransferStore.write_unit_rows`."""
        for unit in units:
            if unit.document_id is not None:
                raise ValueError(
                    f"memory {unit.id} belongs to document {unit.document_id!r}: "
                    "write it with its document"
                )
        if not units:
            return 0
        parallel = self.dialect.parallel_unit_writes()
        if parallel is not None:
            raise_if_cancelled()
            with self.bank_write(bank_ref) as conn:  # the seqs and the generation, then the parts
                generation = touch_bank(conn, bank_ref, now_iso())
                [seqs] = self.dialect.allocate_seqs(conn, [len(units)])
            parallel.write(self._rows, bank_ref, units, seqs, generation, None)
            return len(units)
        for part in _pieces(units, UNITS_PER_TRANSACTION):
            raise_if_cancelled()
            values = ValueWriter()
            rows = self._rows(bank_ref, part, values)
            with self.bank_write(bank_ref) as conn:
                generation = touch_bank(conn, bank_ref, now_iso())
                [seqs] = self.dialect.allocate_seqs(conn, [len(part)])
                self._insert(conn, bank_ref, part, rows, seqs, generation)
                values.store(conn, bank_ref)
        return len(units)

    def write_entity_rows(self, bank_ref: str, entities: Sequence[EntityRow]) -> int:
        """See :meth:`heed.transfer.store.TransferStore.write_entity_rows`."""
        rows = []
        for entity in entities:
            refuse_nul(entity.id, "an entity id")
            refuse_nul(entity.name, "an entity name")
            refuse_nul(entity.type, "an entity type")
            key = canonical(entity.name)
            if not key:
                raise ValueError(f"entity {entity.id} has no name to match by: {entity.name!r}")
            rows.append((entity.id, bank_ref, key, entity.name, entity.type))
        with self.bank_write(bank_ref) as conn:
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
        """See :meth:`heed.transfer.store.TransferStore.write_membership_rows`."""
        if not memberships:
            return 0
        with self.bank_write(bank_ref) as conn:
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
        """See :meth:`heed.transfer.store.TransferStore.write_link_rows`."""
        if not links:
            return 0
        for link in links:
            refuse_nul(link.link_type, "a link type")
        ends = [i for link in links for i in (link.from_id, link.to_id)]
        with self.bank_write(bank_ref) as conn:
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
        """See :meth:`heed.transfer.store.TransferStore.delete_bank_in_batches`."""
        deleted = 0
        while True:
            with self.bank_write(bank_ref) as conn:
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
        """See :meth:`heed.transfer.store.TransferStore.publish_bank`."""
        refuse_nul_in_bank(bank)
        now = now_iso()
        with self.bank_write(bank.ref) as conn:
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
                if not self.dialect.is_unique_violation(exc):
                    raise
                raise BankTaken(bank.bank_id) from exc  # created by another process meanwhile
            if moved != 1:
                raise BankTaken(bank.bank_id)
        bank.created_at = str(row["created_at"])
        bank.updated_at = now
        return bank
