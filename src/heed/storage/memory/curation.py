"""The memory store's part for curation: a fact edited, invalidated or reverted, and a
bank's memories cleared (:class:`heed.memory.curation.store.CurationStore`).

**Derived data follows.** Every write here that removes or changes a fact also removes
the observations citing it and marks their other sources ``pending``, so consolidation
derives them again from what is left (:meth:`DocumentWrites.drop_derived`); an
observation that rested on that fact alone is gone for good. Each write also sets the
bank's ``last_write_at``, which is what makes its mental models stale.

**Invalidation moves the row** to ``memory_invalidated_units`` (schema version 11): the
unit as JSON (its fields and entity names, not its vector), the reason and when. Recall,
consolidation and the graph therefore need no state predicate: an invalidated fact is
simply not among the units. A revert moves it back under the same id (the caller embeds
it again), a document's delete or replace drops its invalidated units with it.

Each method is one transaction under the bank's lock, checking the token between
batches: a cancel rolls it back whole.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from heed.memory.models import PreparedUnit, StoredUnit
from heed.memory.retain.links import first_mentions
from heed.memory.store import WriteResult
from heed.runtime import raise_if_cancelled
from heed.storage.memory.learning import OBSERVATION, LearningWrites
from heed.storage.memory.rows import holds_nul, now_iso, touch_bank
from heed.storage.memory.values import ValueWriter, release

__all__ = ["CurationWrites"]

#: Units deleted per statement when a bank's memories are cleared (the token is checked
#: between batches).
_CLEAR_BATCH = 2_000


class CurationWrites(LearningWrites):
    """Curation's reads and writes (see the module docstring)."""

    if TYPE_CHECKING:  # the store's unit reader (SqlMemoryStore._units)

        def _units(self, conn: Any, where: str, params: Iterable[Any]) -> list[StoredUnit]: ...

    def replace_unit(
        self, bank_ref: str, stored: StoredUnit, unit: PreparedUnit, reason: str | None
    ) -> WriteResult | None:
        """Replace the fact *stored* by *unit* (same id, its vector computed), keeping its
        document, chunk and creation time and adding its old text to its ``history``;
        ``None`` when the fact is gone meanwhile."""
        if holds_nul(unit.id):
            return None
        now = now_iso()
        entry = {"text": stored.text, "changed_at": now, "reason": reason, "state": "edited"}
        unit.history = [*stored.history, entry]
        values = ValueWriter()
        row = self._fact_row(bank_ref, stored, unit, now, values)
        with self.bank_write(bank_ref) as conn:
            generation = touch_bank(conn, bank_ref, now)
            removed, released = self._remove_fact(conn, bank_ref, unit.id)
            if not removed:
                return None
            gone, more = self.drop_derived(conn, bank_ref, [unit.id])
            added = self._insert_linked(
                conn, bank_ref, [unit], [row], generation, first_mentions([unit])
            )
            values.store(conn, bank_ref)
            release(conn, bank_ref, [*released, *more])
        return WriteResult(sorted([*removed, *gone]), added, generation)

    def invalidate_unit(
        self, bank_ref: str, unit_id: str, reason: str | None
    ) -> WriteResult | None:
        """Move the fact *unit_id* to the invalidated units (module docstring); ``None``
        when the bank has no such live fact."""
        if holds_nul(unit_id):
            return None
        now = now_iso()
        with self.bank_write(bank_ref) as conn:
            found = self._units(conn, "bank_ref = ? AND id = ?", (bank_ref, unit_id))
            if not found or found[0].fact_type == OBSERVATION:
                return None
            stored = found[0]
            generation = touch_bank(conn, bank_ref, now)
            removed, released = self._remove_fact(conn, bank_ref, unit_id)
            gone, more = self.drop_derived(conn, bank_ref, [unit_id])
            conn.execute(
                "INSERT INTO memory_invalidated_units (bank_ref, id, fact_type, document_id,"
                " unit, reason, invalidated_at) VALUES (?,?,?,?,?,?,?)",
                (
                    bank_ref,
                    unit_id,
                    stored.fact_type,
                    stored.document_id,
                    json.dumps(asdict(stored)),
                    reason,
                    now,
                ),
            )
            release(conn, bank_ref, [*released, *more])
        return WriteResult(sorted([*removed, *gone]), [], generation)

    def invalidated_unit(self, bank_ref: str, unit_id: str) -> StoredUnit | None:
        """The invalidated fact *unit_id* as it was (its ``history`` ending with the
        invalidation), or ``None``."""
        if holds_nul(unit_id):
            return None
        with self.db.read() as conn:
            row = conn.execute(
                "SELECT unit, reason, invalidated_at FROM memory_invalidated_units"
                " WHERE bank_ref = ? AND id = ?",
                (bank_ref, unit_id),
            ).fetchone()
        if row is None:
            return None
        unit = StoredUnit(**json.loads(row["unit"]))
        unit.history = [
            *unit.history,
            {
                "text": unit.text,
                "changed_at": row["invalidated_at"],
                "reason": row["reason"],
                "state": "invalidated",
            },
        ]
        return unit

    def revert_unit(
        self, bank_ref: str, stored: StoredUnit, unit: PreparedUnit
    ) -> WriteResult | None:
        """Move the invalidated fact *stored* back as *unit* (its vector computed anew),
        with the invalidation kept in its ``history``; ``None`` when it is no longer
        invalidated."""
        now = now_iso()
        unit.history = [*stored.history[:-1], {**stored.history[-1], "reverted_at": now}]
        values = ValueWriter()
        row = self._fact_row(bank_ref, stored, unit, now, values)
        with self.bank_write(bank_ref) as conn:
            generation = touch_bank(conn, bank_ref, now)
            moved = conn.execute(
                "DELETE FROM memory_invalidated_units WHERE bank_ref = ? AND id = ?",
                (bank_ref, unit.id),
            ).rowcount
            if moved != 1:
                return None
            if (
                stored.chunk_id is not None
                and not conn.execute(
                    "SELECT 1 FROM memory_chunks WHERE bank_ref = ? AND id = ?",
                    (bank_ref, stored.chunk_id),
                ).fetchone()
            ):  # its chunk went with a document replaced meanwhile
                row = self._fact_row(bank_ref, replace(stored, chunk_id=None), unit, now, values)
            added = self._insert_linked(
                conn, bank_ref, [unit], [row], generation, first_mentions([unit])
            )
            values.store(conn, bank_ref)
        return WriteResult([], added, generation)

    def clear_units(self, bank_ref: str, fact_type: str | None) -> tuple[WriteResult, int]:
        """Delete the bank's memories (see :meth:`heed.memory.curation.store.CurationStore
        .clear_units`): the write and the number of memories deleted."""
        now = now_iso()
        with self.bank_write(bank_ref) as conn:
            generation = touch_bank(conn, bank_ref, now)
            if fact_type is None:
                return WriteResult([], [], generation), self._clear_all(conn, bank_ref)
            ids = [
                str(r[0])
                for r in conn.execute(
                    "SELECT id FROM memory_units WHERE bank_ref = ? AND fact_type = ?",
                    (bank_ref, fact_type),
                ).fetchall()
            ]
            removed: list[int] = []
            released: list[str | None] = []
            for start in range(0, len(ids), _CLEAR_BATCH):
                raise_if_cancelled()
                seqs, refs = self._remove_units(
                    conn, bank_ref, ids[start : start + _CLEAR_BATCH], fact_type
                )
                removed.extend(seqs)
                released.extend(refs)
            archived = conn.execute(
                "DELETE FROM memory_invalidated_units WHERE bank_ref = ? AND fact_type = ?",
                (bank_ref, fact_type),
            ).rowcount
            if fact_type != OBSERVATION:
                gone, more = self.drop_derived(conn, bank_ref, ids)
                removed.extend(gone)
                released.extend(more)
            self._drop_orphan_entities(conn, bank_ref)
            release(conn, bank_ref, released)
            raise_if_cancelled()
        return WriteResult(sorted(removed), [], generation), len(ids) + max(0, archived)

    def retag_document(
        self, bank_ref: str, document_id: str, tags: list[str]
    ) -> WriteResult | None:
        """Give the document and each of its units exactly *tags*; the observations citing
        its units go and its units are consolidated again (their scope may follow their
        tags). ``None`` when there is no such document; a write that changes nothing
        (the same tags) when it has them already."""
        if holds_nul(document_id) or any(holds_nul(t) for t in tags):
            return None
        now = now_iso()
        values = ValueWriter()
        tags_value = values.encode(tags)
        with self.bank_write(bank_ref) as conn:
            row = conn.execute(
                "SELECT tags_ref, tags FROM memory_documents"
                " WHERE bank_ref = ? AND document_id = ?",
                (bank_ref, document_id),
            ).fetchone()
            if row is None:
                return None
            current = self._document_tags(conn, bank_ref, row)
            if current == tags:
                return WriteResult([], [])
            generation = touch_bank(conn, bank_ref, now)
            units = conn.execute(
                "SELECT id, tags_ref FROM memory_units WHERE bank_ref = ? AND document_id = ?",
                (bank_ref, document_id),
            ).fetchall()
            released: list[str | None] = [row[0], *(u[1] for u in units)]
            conn.execute(
                "UPDATE memory_documents SET tags = ?, tags_ref = ?, updated_at = ?"
                " WHERE bank_ref = ? AND document_id = ?",
                (*tags_value, now, bank_ref, document_id),
            )
            conn.execute(
                "UPDATE memory_units SET tags = ?, tags_ref = ?, updated_at = ?"
                " WHERE bank_ref = ? AND document_id = ?",
                (*tags_value, now, bank_ref, document_id),
            )
            ids = [str(u[0]) for u in units]
            removed, more = self.drop_derived(conn, bank_ref, ids)
            self._mark_pending(conn, bank_ref, ids)
            values.store(conn, bank_ref)
            release(conn, bank_ref, [*released, *more])
        return WriteResult(removed, [], generation)

    # -- helpers -----------------------------------------------------------------------

    def _fact_row(
        self, bank_ref: str, stored: StoredUnit, unit: PreparedUnit, now: str, values: ValueWriter
    ) -> tuple[Any, ...]:
        """The row of *unit* written in the place of *stored*: its document, chunk and
        creation time kept, updated *now*."""
        return self._unit_row(
            bank_ref,
            stored.document_id,
            unit,
            {unit.chunk_index: stored.chunk_id} if stored.chunk_id else {},
            now,
            values,
            created_at=stored.created_at,
            updated_at=now,
        )

    @staticmethod
    def _document_tags(conn: Any, bank_ref: str, row: Any) -> list[str]:
        """A document row's tags, inline or shared (:mod:`heed.storage.memory.values`)."""
        if row[0] is None:
            return list(json.loads(row[1]))
        shared = conn.execute(
            "SELECT body FROM memory_values WHERE bank_ref = ? AND digest = ?", (bank_ref, row[0])
        ).fetchone()
        return list(json.loads(shared[0])) if shared else []

    def _remove_fact(
        self, conn: Any, bank_ref: str, unit_id: str
    ) -> tuple[list[int], list[str | None]]:
        """Delete the live fact *unit_id* (not an observation) in the caller's transaction."""
        row = conn.execute(
            "DELETE FROM memory_units WHERE bank_ref = ? AND id = ? AND fact_type <> ?"
            " RETURNING seq, tags_ref, metadata_ref, context_ref",
            (bank_ref, unit_id, OBSERVATION),
        ).fetchone()
        if row is None:
            return [], []
        self.dialect.drop_keywords(conn, [int(row[0])])
        return [int(row[0])], [row[1], row[2], row[3]]

    def _clear_all(self, conn: Any, bank_ref: str) -> int:
        """Every unit, invalidated unit, entity, chunk and document of the bank, in the
        caller's transaction (the bank, its settings, directives and mental models stay):
        the number of memories deleted."""
        count = int(
            conn.execute(
                "SELECT (SELECT COUNT(*) FROM memory_units WHERE bank_ref = ?)"
                " + (SELECT COUNT(*) FROM memory_invalidated_units WHERE bank_ref = ?)",
                (bank_ref, bank_ref),
            ).fetchone()[0]
        )
        self.empty_bank(conn, bank_ref)
        return count

    @staticmethod
    def _drop_orphan_entities(conn: Any, bank_ref: str) -> None:
        """Delete the bank's entities no unit names any more."""
        conn.execute(
            "DELETE FROM memory_entities WHERE bank_ref = ? AND NOT EXISTS"
            " (SELECT 1 FROM memory_unit_entities ue WHERE ue.entity_id = memory_entities.id)",
            (bank_ref,),
        )
