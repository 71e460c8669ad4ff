"""The memory store's part for memory that learns: consolidation's reads and writes.

Observations are units of fact type ``observation`` without a document; their provenance
(``source_ids``, the facts they rest on), support (``proof_count``) and earlier versions
(``history``) are columns of the unit (:mod:`heed.storage.memory.schema`, version 7). A
unit waiting for consolidation has ``consolidation_state = 'pending'``, found through a
partial index, so a round reads its batch without scanning the bank.

A round's writes (:meth:`LearningWrites.write_observations`) are one transaction under
the bank's lock, like a document's: the bank's row is checked first (a deleted bank is
:class:`~heed.memory.store.BankGone` and nothing is written), then replaced and merged
observations are removed, new rows inserted with their keyword index, entities and links,
and the facts' states set. An observation that is updated keeps its id: its row is replaced
by one with a new seq (the search structures follow the seq), its old text in ``history``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from heed.memory.models import Bank, StoredUnit
from heed.memory.retain.links import first_mentions
from heed.memory.store import ObservationChanges, WriteResult
from heed.storage.memory.rows import (
    bank_from_row,
    holds_nul,
    now_iso,
    row_limit,
    touch_bank,
)
from heed.storage.memory.values import ValueWriter, release
from heed.storage.memory.writes import OBSERVATION, DocumentWrites

__all__ = ["OBSERVATION", "LearningWrites"]


class LearningWrites(DocumentWrites):
    """Consolidation's reads and writes (see the module docstring and
    :class:`heed.memory.store.LearningStore`), beside the document writes."""

    if TYPE_CHECKING:  # the store's unit reader (SqlMemoryStore._units)

        def _units(self, conn: Any, where: str, params: Iterable[Any]) -> list[StoredUnit]: ...

    def pending_units(self, bank_ref: str, limit: int) -> list[StoredUnit]:
        if limit == 0:
            return []
        with self.db.read() as conn:
            return self._units(
                conn,
                "bank_ref = ? AND consolidation_state = 'pending' ORDER BY seq LIMIT ?",
                (bank_ref, limit if limit > 0 else 2**62),
            )

    def units_by_ids(self, bank_ref: str, ids: Sequence[str]) -> list[StoredUnit]:
        wanted = [i for i in dict.fromkeys(ids) if not holds_nul(i)]
        out: list[StoredUnit] = []
        with self.db.read() as conn:
            for start in range(0, len(wanted), self.dialect.list_max):
                match, params = self.dialect.any_of(
                    "id", wanted[start : start + self.dialect.list_max], "text"
                )
                out.extend(self._units(conn, f"bank_ref = ? AND {match}", (bank_ref, *params)))
        return sorted(out, key=lambda u: u.seq)

    def write_observations(self, bank_ref: str, changes: ObservationChanges) -> WriteResult:
        units = [*changes.created, *changes.replaced]
        self._check_vectors(units)
        now = now_iso()
        values = ValueWriter()
        rows = [self._unit_row(bank_ref, None, unit, {}, now, values) for unit in units]
        first = first_mentions(units)
        with self.bank_write(bank_ref) as conn:
            generation = touch_bank(conn, bank_ref, now)
            gone = [u.id for u in changes.replaced] + list(changes.removed)
            removed, released = self._remove_units(conn, bank_ref, gone, OBSERVATION)
            added = self._insert_linked(conn, bank_ref, units, rows, generation, first)
            self._set_state(conn, bank_ref, changes.done, "done")
            self._set_state(conn, bank_ref, changes.failed, "failed")
            values.store(conn, bank_ref)
            release(conn, bank_ref, released)
        return WriteResult(removed=removed, added=added, generation=generation)

    def delete_observations(self, bank_ref: str, source_id: str | None) -> WriteResult:
        if source_id is not None and holds_nul(source_id):
            return WriteResult([], [])
        with self.bank_write(bank_ref) as conn:
            if source_id is not None:
                removed, released = self.drop_derived(conn, bank_ref, [source_id])
                if source_id and removed:
                    self._mark_pending(conn, bank_ref, [source_id])
            else:
                rows = conn.execute(
                    "SELECT id, source_ids FROM memory_units WHERE bank_ref = ? AND fact_type = ?",
                    (bank_ref, OBSERVATION),
                ).fetchall()
                sources = {s for r in rows for s in (json.loads(r[1]) if r[1] else [])}
                removed, released = self._remove_units(
                    conn, bank_ref, [str(r[0]) for r in rows], OBSERVATION
                )
                self._mark_pending(conn, bank_ref, [s for s in sources if not holds_nul(s)])
            if not removed:
                return WriteResult([], [])
            generation = touch_bank(conn, bank_ref)
            release(conn, bank_ref, released)
        return WriteResult(removed, [], generation)

    def recover_consolidation(self, bank_ref: str) -> int:
        with self.db.write() as conn:
            return int(
                conn.execute(
                    "UPDATE memory_units SET consolidation_state = 'pending'"
                    " WHERE bank_ref = ? AND consolidation_state = 'failed'",
                    (bank_ref,),
                ).rowcount
            )

    def banks_with_pending(self, limit: int) -> list[Bank]:
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT b.* FROM memory_banks b WHERE EXISTS (SELECT 1 FROM memory_units u"
                " WHERE u.bank_ref = b.ref AND u.consolidation_state = 'pending')"
                " ORDER BY b.ref LIMIT ?",
                (row_limit(limit),),
            ).fetchall()
        return [bank_from_row(row) for row in rows]

    # -- helpers -----------------------------------------------------------------------

    def _set_state(self, conn: Any, bank_ref: str, seqs: Sequence[int], state: str) -> None:
        for start in range(0, len(seqs), self.dialect.list_max):
            match, params = self.dialect.any_of(
                "seq", list(seqs[start : start + self.dialect.list_max]), "bigint"
            )
            conn.execute(
                f"UPDATE memory_units SET consolidation_state = ? WHERE bank_ref = ? AND {match}",
                (state, bank_ref, *params),
            )
