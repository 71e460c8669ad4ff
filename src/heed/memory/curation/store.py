"""What curation needs of storage (implemented by :mod:`heed.storage.memory.curation`)."""

from __future__ import annotations

from typing import Protocol

from heed.memory.models import DocumentInfo, PreparedUnit, StoredUnit
from heed.memory.store import WriteResult

__all__ = ["CurationStore"]


class CurationStore(Protocol):
    """Curation's writes. Each is one transaction under the bank's lock that removes the
    observations citing a changed or removed fact and queues their other sources for
    consolidation; each sets the bank's ``last_write_at`` (its mental models become
    stale). Blocking; a cancel (checked between batches) rolls a write back whole."""

    def get_unit(self, bank_ref: str, unit_id: str) -> StoredUnit | None:
        """The live unit *unit_id*, or ``None``."""
        ...

    def replace_unit(
        self, bank_ref: str, stored: StoredUnit, unit: PreparedUnit, reason: str | None
    ) -> WriteResult | None:
        """Replace the live fact *stored* by *unit* (same id; *stored*'s text joins its
        history); ``None`` when it is gone meanwhile."""
        ...

    def invalidate_unit(
        self, bank_ref: str, unit_id: str, reason: str | None
    ) -> WriteResult | None:
        """Move the live fact *unit_id* out of the units, kept for a revert; ``None``
        when there is no such live fact."""
        ...

    def invalidated_unit(self, bank_ref: str, unit_id: str) -> StoredUnit | None:
        """The invalidated fact *unit_id* (its history ending with the invalidation)."""
        ...

    def revert_unit(
        self, bank_ref: str, stored: StoredUnit, unit: PreparedUnit
    ) -> WriteResult | None:
        """Bring the invalidated fact *stored* back as *unit*; ``None`` when it is not
        invalidated any more."""
        ...

    def retag_document(
        self, bank_ref: str, document_id: str, tags: list[str]
    ) -> WriteResult | None:
        """Give the document and its units exactly *tags*; the observations citing its
        units go and its units are consolidated again. ``None``: no such document."""
        ...

    def get_document(self, bank_ref: str, document_id: str) -> DocumentInfo | None:
        """The document with its text, or ``None``."""
        ...

    def clear_units(self, bank_ref: str, fact_type: str | None) -> tuple[WriteResult, int]:
        """Delete the bank's memories of *fact_type* (live and invalidated), or, with
        ``None``, every memory, entity, chunk and document of the bank (its settings,
        directives and mental models stay): the write and how many memories went."""
        ...
