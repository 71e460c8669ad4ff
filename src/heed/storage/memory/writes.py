"""The memory store's writes of documents and units, on either database.

A document is written in **one transaction**: the bank's row is checked and its generation
bumped first (a bank another process deleted is :class:`~heed.memory.store.BankGone` and
nothing is written), then the ledger entry, the document row, its chunks, its units in
bulk inserts of :data:`WRITE_BATCH` (a document's units: the dialect's ``unit_batch``;
the token checked between batches: a cancel rolls the whole document back), the entities,
memberships and links planned by :mod:`heed.memory.retain.links`, and the shared values
(:mod:`heed.storage.memory.values`). The units' rows are built before the transaction
begins. On PostgreSQL, where several processes write at once, the transaction holds the
bank's lock (``"bank:" + ref``, as the deletes do): writers of one bank take turns,
writers of different banks do not wait. On SQLite the file's writer lock already does.

The lock is held for the whole document, not released between batches: a document is whole
or absent, and a recall never sees half of one. What keeps other writers (a session being
created) from waiting long is that the work under the lock is linear in the document's rows
(docs/performance.md, "Memory").
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final

import numpy as np

from heed.memory.models import PreparedDocument, PreparedUnit
from heed.memory.retain.idempotency import (
    KEY_TTL_SECONDS,
    IdempotencyConflict,
    LedgerEntry,
    RetainKey,
)
from heed.memory.retain.links import ENTITY_LINKS_PER_ENTITY, first_mentions, plan_links
from heed.memory.store import WriteResult
from heed.runtime import raise_if_cancelled
from heed.storage.database import SqlDatabase
from heed.storage.memory.dialect import Column, MemoryDialect
from heed.storage.memory.rows import (
    LAST_UNITS_OF_DOCUMENT,
    bank_token,
    holds_nul,
    iso,
    join_append,
    now_iso,
    refuse_nul_in_document,
    touch_bank,
)
from heed.storage.memory.values import ValueWriter, release

__all__ = ["BANK_LOCK", "LINK_COLUMNS", "MEMBERSHIP_COLUMNS", "WRITE_BATCH", "DocumentWrites"]

#: Rows inserted per bulk insert (a document's units: its database's ``unit_batch``); the
#: token is checked between batches.
WRITE_BATCH: Final = 256
#: The fact type of a unit consolidation derived (it has sources, not a document).
OBSERVATION: Final = "observation"
#: The lock a bank's writes and deletes hold (see the module docstring).
BANK_LOCK: Final = "bank:"
#: ``memory_unit_entities`` and ``memory_links`` as bulk inserts write them.
MEMBERSHIP_COLUMNS: Final[tuple[Column, ...]] = (("unit_seq", "bigint"), ("entity_id", "text"))
LINK_COLUMNS: Final[tuple[Column, ...]] = (
    ("from_seq", "bigint"),
    ("to_seq", "bigint"),
    ("link_type", "text"),
    ("weight", "float8"),
)
#: A write's entities with their ids and latest units: per entity the bank knows among the
#: canonical names (a list to append, ``{names}``), ``canonical, id`` and its latest
#: :data:`ENTITY_LINKS_PER_ENTITY` unit seqs, newest first (``NULL`` past its last). Scalar
#: subqueries: one statement however many entities, each an index range read backwards, no
#: sort (a write's entities can be hundreds; it beat one query per entity and a ``UNION``).
_ENTITIES_WITH_LATEST_UNITS: Final = (
    "SELECT e.canonical, e.id, "
    + ", ".join(
        "(SELECT unit_seq FROM memory_unit_entities WHERE entity_id = e.id"
        f" ORDER BY unit_seq DESC LIMIT 1 OFFSET {i})"
        for i in range(ENTITY_LINKS_PER_ENTITY)
    )
    + " FROM memory_entities e WHERE e.bank_ref = ? AND {names}"
)


class DocumentWrites:
    """Writes and removals of documents and units (see the module docstring): the write
    half of :class:`~heed.storage.memory.store.SqlMemoryStore`, which sets its database,
    its database's part and the size of its vectors."""

    db: SqlDatabase
    dialect: MemoryDialect
    dim: int

    def lock_bank(self, conn: Any, bank_ref: str) -> None:
        """Hold the bank's lock until the write transaction ends."""
        self.db.lock(conn, BANK_LOCK + bank_ref)

    @contextmanager
    def bank_write(self, bank_ref: str) -> Iterator[Any]:
        """A write transaction holding the bank's lock (:meth:`lock_bank`) from its start."""
        with self.db.write() as conn:
            self.lock_bank(conn, bank_ref)
            yield conn

    def write_document(
        self,
        bank_ref: str,
        document: PreparedDocument,
        ledger: tuple[RetainKey, int] | None = None,
    ) -> WriteResult:
        """See :meth:`heed.memory.store.MemoryStore.write_document`."""
        refuse_nul_in_document(document, ledger[0].key if ledger is not None else None)
        self._check_vectors(document.units)
        now = now_iso()
        values = ValueWriter()
        chunk_ids = {c.index: c.id for c in document.chunks}
        rows = [
            self._unit_row(bank_ref, document.document_id, unit, chunk_ids, now, values)
            for unit in document.units
        ]
        first = first_mentions(document.units)
        released: list[str | None] = []  # shared values of rows replaced or overwritten
        with self.bank_write(bank_ref) as conn:
            generation = touch_bank(conn, bank_ref, now)
            if ledger is not None:
                self._record_ledger(conn, bank_ref, document, *ledger)
            removed: list[int] = []
            existing = conn.execute(
                "SELECT original_text, created_at, tags_ref, metadata_ref FROM memory_documents"
                " WHERE bank_ref = ? AND document_id = ?",
                (bank_ref, document.document_id),
            ).fetchone()
            text = document.original_text
            created_at = now
            first_chunk = 0
            units = list(document.units)
            if existing is not None and document.replace:
                removed, released = self.remove_document(conn, bank_ref, document.document_id)
            elif existing is not None:
                released = [existing["tags_ref"], existing["metadata_ref"]]
                if units:
                    units = self._join_stored_last(conn, bank_ref, document.document_id, units)
                text = existing["original_text"] + "\n" + text
                created_at = existing["created_at"]
                first_chunk = int(
                    conn.execute(
                        "SELECT COALESCE(MAX(chunk_index) + 1, 0) FROM memory_chunks"
                        " WHERE bank_ref = ? AND document_id = ?",
                        (bank_ref, document.document_id),
                    ).fetchone()[0]
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
                    document.document_id,
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
                        (c.id, bank_ref, document.document_id, first_chunk + c.index, c.text)
                        for c in document.chunks
                    ],
                )
            added = self._insert_linked(conn, bank_ref, units, rows, generation, first)
            values.store(conn, bank_ref)
            release(conn, bank_ref, released)
        return WriteResult(removed=removed, added=added, generation=generation)

    def _insert_linked(
        self,
        conn: Any,
        bank_ref: str,
        units: Sequence[PreparedUnit],
        rows: Sequence[tuple[Any, ...]],
        generation: int,
        first: dict[str, tuple[str, str | None]],
    ) -> list[tuple[int, str]]:
        """Insert *units* (their *rows* from :meth:`_unit_row`) with their keyword index,
        then their links (:meth:`_link`; *first*: each entity's first mention,
        :func:`~heed.memory.retain.links.first_mentions`), in the caller's transaction, in
        batches that each check the token first (a cancel rolls back everything): the
        (seq, id) added, in order."""
        [allocated] = self.dialect.allocate_seqs(conn, [len(units)])
        seqs = list(allocated)
        token = bank_token(bank_ref)
        batch = self.dialect.unit_batch
        for start in range(0, len(units), batch):
            raise_if_cancelled()
            end = start + batch
            self.dialect.insert_units(
                conn,
                [
                    (seq, *row, generation)
                    for seq, row in zip(seqs[start:end], rows[start:end], strict=True)
                ],
                [(token, unit.index_text) for unit in units[start:end]],
            )
        raise_if_cancelled()
        self._link(conn, bank_ref, seqs, units, first)
        return [(seq, unit.id) for seq, unit in zip(seqs, units, strict=True)]

    def _check_vectors(self, units: Sequence[PreparedUnit]) -> None:
        for unit in units:
            if unit.embedding is not None and np.size(unit.embedding) != self.dim:
                raise ValueError(
                    f"unit {unit.id} has a {np.size(unit.embedding)}-dimensional embedding; "
                    f"this store holds {self.dim}-dimensional vectors"
                )

    def _unit_row(
        self,
        bank_ref: str,
        document_id: str | None,
        unit: PreparedUnit,
        chunk_ids: dict[int, str],
        now: str,
        values: ValueWriter,
        *,
        created_at: str | None = None,
        updated_at: str | None = None,
    ) -> tuple[Any, ...]:
        """A ``memory_units`` row of *unit* (``UNIT_WRITE_COLUMNS``) without its seq and
        generation, which the transaction knows; created *now* unless *created_at* says."""
        return (
            unit.id,
            bank_ref,
            document_id,
            chunk_ids.get(unit.chunk_index),
            unit.text,
            unit.fact_type,
            *values.encode_text(unit.context),
            iso(unit.occurred_start),
            iso(unit.occurred_end),
            iso(unit.mentioned_at),
            *values.encode(unit.metadata),
            *values.encode(unit.tags),
            self.dialect.encode_vector(unit.embedding),
            created_at or now,
            updated_at,
            unit.token_count,
            unit.consolidation_state,
            json.dumps(unit.source_ids) if unit.source_ids else None,
            unit.proof_count,
            json.dumps(unit.history) if unit.history else None,
        )

    def _join_stored_last(
        self, conn: Any, bank_ref: str, document_id: str, units: list[PreparedUnit]
    ) -> list[PreparedUnit]:
        """Index an append's first units and the document's stored last units with each
        other's text, as neighbours within one retain are (see :mod:`heed.memory.retain.units`)."""
        last = conn.execute(LAST_UNITS_OF_DOCUMENT, (bank_ref, document_id)).fetchall()
        updates, joined = join_append(last, units)
        for seq, texts in updates:
            self.dialect.add_keywords(conn, seq, texts)
        return joined

    @staticmethod
    def _record_ledger(
        conn: Any, bank_ref: str, document: PreparedDocument, key: RetainKey, index: int
    ) -> None:
        inserted = conn.execute(
            "INSERT INTO memory_retain_ledger (bank_ref, idempotency_key, document_index,"
            " document_id, units, fingerprint, created_at) VALUES (?,?,?,?,?,?,?)"
            " ON CONFLICT DO NOTHING",
            (
                bank_ref,
                key.key,
                index,
                document.document_id,
                len(document.units),
                key.fingerprint,
                time.time(),
            ),
        ).rowcount
        if inserted != 1:
            raise IdempotencyConflict(
                f"a retain under Idempotency-Key {key.key!r} is already running; retry it "
                "after that one finishes"
            )

    def _link(
        self,
        conn: Any,
        bank_ref: str,
        seqs: Sequence[int],
        units: Sequence[PreparedUnit],
        first: dict[str, tuple[str, str | None]],
    ) -> None:
        """Entities (created on first mention: the first name wins, and another process's
        creation is kept), memberships and links of the new units (see
        :mod:`heed.memory.retain.links`), in bulk."""
        entity_ids: dict[str, str] = {}
        recent: dict[str, list[int]] = {}
        if first:
            conn.executemany(
                "INSERT INTO memory_entities (id, bank_ref, canonical, name, type)"
                " VALUES (?,?,?,?,?) ON CONFLICT (bank_ref, canonical) DO NOTHING",
                [
                    (str(uuid.uuid4()), bank_ref, key, name, kind)
                    for key, (name, kind) in first.items()
                ],
            )
            keys = list(first)
            step = self.dialect.list_max
            for start in range(0, len(keys), step):
                part = keys[start : start + step]
                names, params = self.dialect.any_of("e.canonical", part, "text")
                for key, entity_id, *latest in conn.execute(
                    _ENTITIES_WITH_LATEST_UNITS.format(names=names), (bank_ref, *params)
                ).fetchall():
                    entity_ids[str(key)] = str(entity_id)
                    recent[str(entity_id)] = [int(seq) for seq in latest if seq is not None]
        memberships, links = plan_links(seqs, units, entity_ids, recent)
        raise_if_cancelled()
        self.dialect.insert_rows(conn, "memory_unit_entities", MEMBERSHIP_COLUMNS, memberships)
        self.dialect.insert_rows(conn, "memory_links", LINK_COLUMNS, links)

    # -- removals ------------------------------------------------------------------------

    def remove_document(
        self, conn: Any, bank_ref: str, document_id: str
    ) -> tuple[list[int], list[str | None]]:
        """Delete a document's units (their links and entity rows cascade), the observations
        citing them (:meth:`drop_derived`), its invalidated units, chunks and row, in the
        caller's transaction: the seqs removed (ascending), and the shared values the
        removed rows referenced (for :func:`~heed.storage.memory.values.release`)."""
        rows = conn.execute(
            "DELETE FROM memory_units WHERE bank_ref = ? AND document_id = ?"
            " RETURNING seq, tags_ref, metadata_ref, context_ref, id",
            (bank_ref, document_id),
        ).fetchall()
        seqs = [int(r[0]) for r in rows]
        self.dialect.drop_keywords(conn, sorted(seqs))
        refs: list[str | None] = [ref for r in rows for ref in (r[1], r[2], r[3])]
        if rows:
            gone, more = self.drop_derived(conn, bank_ref, [str(r[4]) for r in rows])
            seqs.extend(gone)
            refs.extend(more)
        seqs.sort()
        for table in ("memory_chunks", "memory_invalidated_units"):
            conn.execute(
                f"DELETE FROM {table} WHERE bank_ref = ? AND document_id = ?",
                (bank_ref, document_id),
            )
        for row in conn.execute(
            "DELETE FROM memory_documents WHERE bank_ref = ? AND document_id = ?"
            " RETURNING tags_ref, metadata_ref",
            (bank_ref, document_id),
        ).fetchall():
            refs.extend(row)
        return seqs, refs

    def delete_document(self, bank_ref: str, document_id: str) -> WriteResult | None:
        """See :meth:`heed.memory.store.MemoryStore.delete_document`."""
        if holds_nul(document_id):
            return None
        with self.bank_write(bank_ref) as conn:
            exists = conn.execute(
                "SELECT 1 FROM memory_documents WHERE bank_ref = ? AND document_id = ?",
                (bank_ref, document_id),
            ).fetchone()
            if exists is None:
                return None
            generation = touch_bank(conn, bank_ref, now_iso())
            seqs, refs = self.remove_document(conn, bank_ref, document_id)
            release(conn, bank_ref, refs)
            return WriteResult(seqs, [], generation)

    def delete_unit(self, bank_ref: str, unit_id: str) -> WriteResult | None:
        """See :meth:`heed.memory.store.MemoryStore.delete_unit`."""
        if holds_nul(unit_id):
            return None
        with self.bank_write(bank_ref) as conn:
            row = conn.execute(
                "DELETE FROM memory_units WHERE bank_ref = ? AND id = ?"
                " RETURNING seq, tags_ref, metadata_ref, context_ref",
                (bank_ref, unit_id),
            ).fetchone()
            if row is None:
                return None
            self.dialect.drop_keywords(conn, [int(row[0])])
            gone, more = self.drop_derived(conn, bank_ref, [unit_id])
            release(conn, bank_ref, [row[1], row[2], row[3], *more])
            generation = touch_bank(conn, bank_ref, now_iso())
            return WriteResult(sorted([int(row[0]), *gone]), [], generation)

    def drop_derived(
        self, conn: Any, bank_ref: str, source_ids: Sequence[str]
    ) -> tuple[list[int], list[str | None]]:
        """Delete the bank's observations that cite any of *source_ids* (facts removed or
        changed) and mark their other sources ``pending``, so consolidation derives them
        again from what is left, in the caller's transaction: the seqs removed and the
        shared values the removed rows referenced."""
        wanted = set(source_ids)
        doomed: list[str] = []
        others: set[str] = set()
        for row in conn.execute(
            "SELECT id, source_ids FROM memory_units WHERE bank_ref = ? AND fact_type = ?"
            " AND source_ids IS NOT NULL",
            (bank_ref, OBSERVATION),
        ).fetchall():
            cited = json.loads(row[1])
            if wanted.intersection(cited):
                doomed.append(str(row[0]))
                others.update(cited)
        if not doomed:
            return [], []
        removed, released = self._remove_units(conn, bank_ref, doomed, OBSERVATION)
        self._mark_pending(conn, bank_ref, [s for s in others - wanted if not holds_nul(s)])
        return removed, released

    def _mark_pending(self, conn: Any, bank_ref: str, ids: Sequence[str]) -> None:
        """Set the consolidation state of the bank's units among *ids* that consolidation
        took before (a state is set) back to ``pending``."""
        for start in range(0, len(ids), self.dialect.list_max):
            match, params = self.dialect.any_of(
                "id", list(ids[start : start + self.dialect.list_max]), "text"
            )
            conn.execute(
                "UPDATE memory_units SET consolidation_state = 'pending'"
                f" WHERE bank_ref = ? AND consolidation_state IS NOT NULL AND {match}",
                (bank_ref, *params),
            )

    def _remove_units(
        self, conn: Any, bank_ref: str, ids: Sequence[str], fact_type: str
    ) -> tuple[list[int], list[str | None]]:
        """Delete the bank's units of *fact_type* among *ids* in the caller's transaction:
        the seqs removed and the shared values their rows referenced."""
        seqs: list[int] = []
        refs: list[str | None] = []
        for start in range(0, len(ids), self.dialect.list_max):
            match, params = self.dialect.any_of(
                "id", list(ids[start : start + self.dialect.list_max]), "text"
            )
            for row in conn.execute(
                f"DELETE FROM memory_units WHERE bank_ref = ? AND fact_type = ? AND {match}"
                " RETURNING seq, tags_ref, metadata_ref, context_ref",
                (bank_ref, fact_type, *params),
            ).fetchall():
                seqs.append(int(row[0]))
                refs.extend((row[1], row[2], row[3]))
        seqs.sort()
        self.dialect.drop_keywords(conn, seqs)
        return seqs, refs

    def delete_bank(self, bank_ref: str) -> int:
        """See :meth:`heed.memory.store.MemoryStore.delete_bank`."""
        with self.bank_write(bank_ref) as conn:
            count = int(
                conn.execute(
                    "SELECT COUNT(*) FROM memory_units WHERE bank_ref = ?", (bank_ref,)
                ).fetchone()[0]
            )
            self.empty_bank(conn, bank_ref)
            conn.execute("DELETE FROM memory_banks WHERE ref = ?", (bank_ref,))
        return count

    def empty_bank(self, conn: Any, bank_ref: str) -> None:
        """Delete every unit, invalidated unit, entity, chunk, document, retain key and
        shared value of the bank in the caller's transaction (its row, settings,
        directives and mental models stay). Set-based deletes first: the cascades then
        find nothing left to do row by row; the token is checked between them."""
        self.dialect.drop_bank_keywords(conn, bank_ref)
        for table, column in (("memory_links", "from_seq"), ("memory_unit_entities", "unit_seq")):
            conn.execute(
                f"DELETE FROM {table} WHERE {column} IN"
                " (SELECT seq FROM memory_units WHERE bank_ref = ?)",
                (bank_ref,),
            )
        raise_if_cancelled()
        conn.execute("DELETE FROM memory_units WHERE bank_ref = ?", (bank_ref,))
        for table in (
            "memory_invalidated_units",
            "memory_entities",
            "memory_chunks",
            "memory_documents",
            "memory_retain_ledger",
            "memory_values",  # only units and documents reference shared values
        ):
            conn.execute(f"DELETE FROM {table} WHERE bank_ref = ?", (bank_ref,))

    def retain_ledger(self, bank_ref: str, key: str) -> list[LedgerEntry]:
        """See :meth:`heed.memory.store.MemoryStore.retain_ledger`."""
        if holds_nul(key):
            return []
        with self.db.write() as conn:
            conn.execute(
                "DELETE FROM memory_retain_ledger WHERE created_at < ?",
                (time.time() - KEY_TTL_SECONDS,),
            )
            rows = conn.execute(
                "SELECT document_index, document_id, units, fingerprint FROM memory_retain_ledger"
                " WHERE bank_ref = ? AND idempotency_key = ? ORDER BY document_index",
                (bank_ref, key),
            ).fetchall()
        return [LedgerEntry(int(r[0]), r[1], int(r[2]), r[3]) for r in rows]
