"""The narrow storage interface the memory engine depends on.

:class:`heed.storage.memory_store.SqliteMemoryStore` implements it on the
embedded database; a PostgreSQL + pgvector implementation can implement the
same protocol. All methods block (call them through the offload) and each
write method is one transaction: it commits entirely or not at all.

Units carry two keys: ``seq`` (an integer, the key of the keyword index and
of the in-process vector matrix) and ``id`` (a UUID string, the public id).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from heed.memory.idempotency import LedgerEntry, RetainKey
from heed.memory.models import (
    Bank,
    BankStats,
    Conflict,
    DocumentInfo,
    NotFound,
    PreparedDocument,
    StoredUnit,
)

__all__ = [
    "BankGone",
    "BankTaken",
    "MemoryStore",
    "UnitFilter",
    "VectorChanges",
    "VectorRows",
    "VectorSearchingStore",
    "WriteResult",
]


class BankGone(NotFound):
    """A write found its bank's row gone: another process or instance deleted the bank
    after this one looked it up. The write changed nothing (the check runs inside its
    transaction, before any row is written)."""

    def __init__(self, bank_ref: str) -> None:
        super().__init__("bank not found: it was deleted while this request ran")
        self.bank_ref = bank_ref


class BankTaken(Conflict):
    """Creating a bank found its ``(tenant, bank_id)`` taken: another process or instance
    created it after this one looked. Nothing was written; a retry updates that bank."""

    def __init__(self, bank_id: str) -> None:
        super().__init__(f"bank {bank_id!r} was created by another request meanwhile; retry")


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What one write changed: seqs removed (a replace, a delete) and (seq, id) added, and
    the bank's generation the write made (``None`` when not known)."""

    removed: list[int]
    added: list[tuple[int, str]]
    generation: int | None = None


@dataclass(frozen=True, slots=True)
class VectorRows:
    """A bank's vectors: ``seqs[i]`` is the unit of ``matrix[i]``; ``types[i]`` its fact type.

    ``generation`` is the bank's generation read *before* the rows: the rows hold every
    write up to it (and perhaps some after it)."""

    seqs: np.ndarray
    matrix: np.ndarray
    types: list[str]
    generation: int = 0


@dataclass(frozen=True, slots=True)
class VectorChanges:
    """What changed in a bank's vectors after a generation (see
    :meth:`MemoryStore.vectors_since`): the rows of the units written later (their
    ``generation`` is the bank's, read first), and how many units the bank has now (read
    after them), from which a reader tells whether units were removed."""

    rows: VectorRows
    unit_count: int


@dataclass(frozen=True, slots=True)
class UnitFilter:
    """Filters of ``list_units``; ``None`` means no filter."""

    fact_type: str | None = None
    document_id: str | None = None
    search: str | None = None
    entity_id: str | None = None
    time_field: str | None = None
    start: str | None = None
    end: str | None = None


class MemoryStore(Protocol):
    """Banks, documents, units, entities, links and the keyword index of all tenants."""

    def migrate(self) -> None:
        """Bring the schema to the current version (idempotent)."""
        ...

    # banks
    def get_bank(self, tenant: str, bank_id: str) -> Bank | None: ...
    def list_banks(
        self, tenant: str, limit: int, offset: int
    ) -> tuple[list[tuple[Bank, int]], int]: ...
    def save_bank(self, bank: Bank) -> Bank:
        """Create *bank* (``created_at`` empty) or update it. Raises :class:`BankGone` when
        updating a bank whose row is gone, :class:`BankTaken` when creating a bank whose
        ``(tenant, bank_id)`` another bank holds."""
        ...

    def delete_bank(self, bank_ref: str) -> int: ...
    def bank_stats(self, bank_ref: str) -> BankStats: ...

    # retain
    def write_document(
        self,
        bank_ref: str,
        document: PreparedDocument,
        ledger: tuple[RetainKey, int] | None = None,
    ) -> WriteResult:
        """Write one document; with *ledger* (key, document index) also its ledger entry, in
        the same transaction. Raises ``IdempotencyConflict`` when that entry exists already
        (a concurrent retry of the same key), :class:`BankGone` (writing nothing) when the
        bank's row is gone."""
        ...

    def retain_ledger(self, bank_ref: str, key: str) -> list[LedgerEntry]:
        """The documents already written under *key* (expired keys are forgotten first)."""
        ...

    # recall
    def bank_generation(self, bank_ref: str) -> int | None:
        """The bank's generation: a counter every write that adds or removes units bumps,
        in the write's transaction (``None`` when the bank does not exist). A primary-key
        read, cheap enough for every recall."""
        ...

    def load_vectors(self, bank_ref: str) -> VectorRows:
        """Every unit vector of the bank, with the generation they hold."""
        ...

    def vectors_since(self, bank_ref: str, generation: int) -> VectorChanges | None:
        """The vectors of the units written after *generation* and the bank's unit count
        (``None`` when the bank does not exist)."""
        ...

    def unit_seqs(self, bank_ref: str) -> np.ndarray:
        """The seqs of every unit of the bank (int64)."""
        ...

    def keyword_search(
        self, bank_ref: str, terms: Sequence[str], limit: int
    ) -> list[tuple[int, float]]: ...
    def units_by_entities(
        self, bank_ref: str, canonical_names: Sequence[str], limit: int
    ) -> list[tuple[int, float]]: ...
    def linked_units(
        self, bank_ref: str, seqs: Sequence[int], limit: int
    ) -> list[tuple[int, float]]: ...
    def units_in_window(
        self, bank_ref: str, start: str, end: str, limit: int
    ) -> list[tuple[int, str]]: ...
    def fetch_units(self, bank_ref: str, seqs: Sequence[int]) -> dict[int, StoredUnit]: ...
    def fetch_chunks(
        self, bank_ref: str, chunk_ids: Sequence[str]
    ) -> dict[str, dict[str, Any]]: ...
    def entity_states(
        self, bank_ref: str, canonical_names: Sequence[str], per_entity: int
    ) -> dict[str, dict[str, Any]]: ...

    # memories and documents
    def list_units(
        self, bank_ref: str, flt: UnitFilter, limit: int, offset: int
    ) -> tuple[list[StoredUnit], int]: ...
    def get_unit(self, bank_ref: str, unit_id: str) -> StoredUnit | None: ...
    def delete_unit(self, bank_ref: str, unit_id: str) -> WriteResult | None:
        """Delete one unit; ``None`` when the bank has no unit *unit_id*."""
        ...

    def list_documents(
        self, bank_ref: str, search: str | None, limit: int, offset: int
    ) -> tuple[list[DocumentInfo], int]: ...
    def get_document(self, bank_ref: str, document_id: str) -> DocumentInfo | None: ...
    def delete_document(self, bank_ref: str, document_id: str) -> WriteResult | None:
        """Delete a document and its units; ``None`` when the bank has no such document."""
        ...


class VectorSearchingStore(MemoryStore, Protocol):
    """A store that searches vectors itself (PostgreSQL with pgvector). The engine uses
    it instead of loading the bank into an in-process index when ``searches_vectors``
    is true; ``load_vectors`` then serves only tools such as ``heed migrate``."""

    searches_vectors: bool

    def vector_search(
        self, bank_ref: str, query: np.ndarray, k: int, types: Sequence[str] | None
    ) -> list[tuple[int, float]]:
        """The *k* units of the bank most similar to *query* (unit length) as
        (seq, cosine), best first; only units of *types* when given."""
        ...

    def unit_vectors(self, bank_ref: str, seqs: Sequence[int]) -> dict[int, np.ndarray]:
        """The stored vectors of *seqs* in the bank (those still present)."""
        ...
