"""Curation over the memory engine: edit, invalidate, revert, clear (see the package
docstring).

Every method runs as work on the bank (:meth:`MemoryEngine.track`: a bank delete cancels
it) under a ``retain`` slot and the caller's token: a client that leaves stops the
embedding, and the one transaction that follows is not started or is rolled back. The
bank's vector index follows each committed write.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from heed.memory.curation.rules import CURATED_TYPES, MemoryEdit, parse_when
from heed.memory.curation.store import CurationStore
from heed.memory.engine import MemoryEngine
from heed.memory.models import (
    Bank,
    EntityRef,
    InvalidInput,
    NotFound,
    PreparedUnit,
    RetainItem,
    StoredUnit,
    loose_units,
    refuse_nul,
)
from heed.memory.retain.operations import RetainOperations
from heed.memory.retain.units import index_text
from heed.memory.store import WriteResult
from heed.runs import Run
from heed.runtime import run_in_thread

__all__ = ["CurationResult", "MemoryCuration"]


@dataclass(frozen=True, slots=True)
class CurationResult:
    """A curated fact as it now is, and whether it is invalidated."""

    unit: StoredUnit
    invalidated: bool


@dataclass(eq=False)
class MemoryCuration:
    """Curation of one server's banks (module docstring)."""

    engine: MemoryEngine
    store: CurationStore
    operations: RetainOperations

    async def find(self, bank: Bank, unit_id: str) -> CurationResult:
        """The memory *unit_id*, live or invalidated; :class:`NotFound` when neither."""
        refuse_nul(unit_id, "the memory id")
        live = await run_in_thread(self.store.get_unit, bank.ref, unit_id)
        if live is not None:
            return CurationResult(live, False)
        gone = await run_in_thread(self.store.invalidated_unit, bank.ref, unit_id)
        if gone is None:
            raise NotFound(f"memory {unit_id!r} not found in bank {bank.bank_id!r}")
        return CurationResult(gone, True)

    async def update(self, bank: Bank, unit_id: str, edit: MemoryEdit) -> CurationResult:
        """Apply *edit* to the fact *unit_id*: invalidate it, revert it (with any field
        edits on top), or edit it. Raises :class:`NotFound`, :class:`InvalidInput` (an
        observation; an edit of an invalidated fact without a revert),
        ``OperationCancelled``."""
        engine = self.engine
        async with (
            engine.track(bank),
            engine.retain_lane.slot(),
            engine.bank_gone_is_not_found(bank),
        ):
            found = await self.find(bank, unit_id)
            unit = found.unit
            if unit.fact_type not in CURATED_TYPES:
                raise InvalidInput(
                    f"memory {unit_id!r} is an {unit.fact_type}: observations are derived "
                    "from facts and change when their facts do; curate the facts"
                )
            if found.invalidated:
                if edit.state != "valid":
                    if edit.changes_fields:
                        raise InvalidInput(
                            f"memory {unit_id!r} is invalidated: revert it (state 'valid') "
                            "to edit it"
                        )
                    return found  # already invalidated
                prepared = await self._prepare(bank, unit, edit)
                result = await run_in_thread(self.store.revert_unit, bank.ref, unit, prepared)
                self._apply(bank, result, prepared)
            elif edit.state == "invalidated":
                result = await run_in_thread(
                    self.store.invalidate_unit, bank.ref, unit_id, edit.reason
                )
                self._apply(bank, result, None)
            elif edit.changes_fields:
                prepared = await self._prepare(bank, unit, edit)
                result = await run_in_thread(
                    self.store.replace_unit, bank.ref, unit, prepared, edit.reason
                )
                self._apply(bank, result, prepared)
            else:
                return found  # state 'valid' of a live fact: nothing to do
            if result is None:
                raise NotFound(f"memory {unit_id!r} changed meanwhile in bank {bank.bank_id!r}")
            self._after_write(bank)
            return await self.find(bank, unit_id)

    async def clear(self, bank: Bank, fact_type: str | None) -> int:
        """Delete the bank's memories of *fact_type*, or all of them with their entities,
        chunks and documents (the bank and its settings stay): how many memories went.
        One transaction; a cancel rolls it back."""
        engine = self.engine
        async with (
            engine.track(bank),
            engine.retain_lane.slot(),
            engine.bank_gone_is_not_found(bank),
        ):
            result, count = await run_in_thread(self.store.clear_units, bank.ref, fact_type)
            if fact_type is None:
                engine.indexes.drop(bank.ref)
            else:
                await run_in_thread(engine.indexes.apply, bank.ref, result, None)
            if fact_type != "observation":
                self._after_write(bank)
            return count

    async def retag_document(self, bank: Bank, document_id: str, tags: list[str]) -> None:
        """Give the document and its memories exactly *tags* (``[]`` clears them); the
        observations citing its memories go and its memories are consolidated again
        under their new tags. A no-op when it has those tags. :class:`NotFound`."""
        refuse_nul(document_id, "document_id")
        for tag in tags:
            refuse_nul(tag, "tags")
        tags = list(dict.fromkeys(tags))
        engine = self.engine
        async with (
            engine.track(bank),
            engine.retain_lane.slot(),
            engine.bank_gone_is_not_found(bank),
        ):
            result = await run_in_thread(self.store.retag_document, bank.ref, document_id, tags)
            if result is None:
                raise NotFound(f"document {document_id!r} not found in bank {bank.bank_id!r}")
            if result.generation is not None:
                await run_in_thread(engine.indexes.apply, bank.ref, result, None)
                self._after_write(bank)

    async def reprocess_document(self, bank: Bank, document_id: str) -> tuple[Run, int]:
        """Retain the document's stored text again, in place (``replace``), with the bank's
        settings as they are now (its extraction, its mission): a ``retain`` operation;
        its run and how many items it retains. The text is the document's as stored (its
        items joined); the items' own contexts and dates are not kept apart, so the
        document's memories take its tags and metadata and today's date where the text
        names none.
        :class:`NotFound`."""
        refuse_nul(document_id, "document_id")
        document = await run_in_thread(self.store.get_document, bank.ref, document_id)
        if document is None or document.original_text is None:
            raise NotFound(f"document {document_id!r} not found in bank {bank.bank_id!r}")
        if not document.original_text.strip():
            raise InvalidInput(f"document {document_id!r} keeps no text to retain again")
        items = [
            RetainItem(
                content=document.original_text,
                document_id=document_id,
                metadata={k: str(v) for k, v in document.metadata.items()},
                tags=list(document.tags),
                update_mode="replace",
            )
        ]
        return await self.operations.submit(bank, items, []), len(items)

    async def _prepare(self, bank: Bank, unit: StoredUnit, edit: MemoryEdit) -> PreparedUnit:
        """*unit* with *edit* applied, embedded again; ``pending`` for consolidation when
        the bank keeps observations."""
        text = edit.text if edit.text is not None else unit.text
        context = unit.context if edit.context is None else (edit.context or None)
        start = _when(edit.occurred_start, unit.occurred_start, "occurred_start")
        end = _when(edit.occurred_end, unit.occurred_end, "occurred_end")
        mentioned = _when(edit.mentioned_at, unit.mentioned_at, "mentioned_at")
        names = unit.entities if edit.entities is None else edit.entities
        prepared = PreparedUnit(
            id=unit.id,
            text=text,
            index_text=index_text(text, context, start or mentioned),
            fact_type=edit.fact_type or unit.fact_type,
            context=context,
            chunk_index=0,
            occurred_start=start,
            occurred_end=end,
            mentioned_at=mentioned,
            metadata=dict(unit.metadata),
            tags=list(unit.tags),
            entities=[EntityRef(name) for name in dict.fromkeys(n.strip() for n in names) if name],
            source_ids=list(unit.source_ids),
            history=list(unit.history),
        )
        if self.engine.settings(bank).enable_observations:
            prepared.consolidation_state = "pending"
        document = loose_units([prepared])
        await self.engine.embed(document.units)
        return document.units[0]

    def _apply(self, bank: Bank, result: WriteResult | None, unit: PreparedUnit | None) -> None:
        """Bring the bank's vector index up to a committed write."""
        if result is not None:
            document = loose_units([unit]) if unit is not None else None
            self.engine.indexes.apply(bank.ref, result, document)

    def _after_write(self, bank: Bank) -> None:
        """What follows a write of facts: the hooks a retain runs (consolidation)."""
        for hook in self.engine.after_retain:
            hook(bank)


def _when(given: str | None, stored: str | None, name: str) -> datetime | None:
    """The date a field ends with: *given* (``""`` clears it), else *stored*."""
    return parse_when(stored if given is None else given, name)
