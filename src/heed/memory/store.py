"""The narrow storage interface the memory engine depends on.

:class:`heed.storage.memory.SqlMemoryStore` implements it, one class on SQLite and on
PostgreSQL with pgvector. All methods block (call them through the offload) and each write
method is one transaction: it commits entirely or not at all.

Units carry two keys: ``seq`` (an integer, the key of the keyword index and of the vector
index; a document's units have consecutive seqs, in their order) and ``id`` (a UUID
string, the public id).

Rules every method keeps, on every database (tested once for both:
``tests/storage/test_memory_store.py``):

- **Ties**: a ranked answer (a score, a count, a weight, a time) puts the newer unit, the
  larger seq, first among equals.
- **Limits**: ``limit`` 0 answers nothing; a negative ``limit`` (or ``per_entity``) means
  no limit; a negative ``offset`` counts as 0.
- **NUL** (U+0000), which no stored text holds (:class:`heed.errors.InvalidText`): a write
  holding it is refused before anything is written; a read whose id, key or filter holds it
  finds nothing (``None``, an empty page, no hits); in a list of terms, names or ids, one
  holding it matches nothing and the others are still looked up.
- A unit's ``entities`` are its entities' names in the order of the entities' ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from heed.memory.directives.rules import Directive, DirectivePatch
from heed.memory.models import (
    Bank,
    BankStats,
    Conflict,
    DocumentInfo,
    NotFound,
    PreparedDocument,
    PreparedUnit,
    StoredUnit,
    TagsMatch,
)
from heed.memory.retain.idempotency import LedgerEntry, RetainKey
from heed.memory.views.rows import ChunkRow, EntityCount, EntityEdge, TagListCount, UnitLink

__all__ = [
    "BankGone",
    "BankTaken",
    "BrowseStore",
    "DirectiveStore",
    "LearningStore",
    "MemoryStore",
    "ObservationChanges",
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
    """Filters of ``list_units``; ``None`` means no filter. ``tags`` are matched per
    ``tags_match`` by recall's rule (:func:`heed.memory.tags.tags_pass`): without tags,
    only ``exact`` filters (the untagged)."""

    fact_type: str | None = None
    document_id: str | None = None
    search: str | None = None
    entity_id: str | None = None
    chunk_id: str | None = None
    time_field: str | None = None
    start: str | None = None
    end: str | None = None
    consolidation_state: str | None = None
    tags: Sequence[str] | None = None
    tags_match: TagsMatch = "any"


@dataclass(frozen=True, slots=True)
class ObservationChanges:
    """One consolidation round's writes (see :meth:`LearningStore.write_observations`).

    ``created`` are new observation units; ``replaced`` observations whose stored row is
    replaced by the given unit, which keeps the stored one's id (its ``history`` already
    holds the earlier version); ``removed`` the ids of observations merged into another;
    ``done`` and ``failed`` the seqs of the facts the round consolidated or gave up on."""

    created: list[PreparedUnit] = field(default_factory=list)
    replaced: list[PreparedUnit] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    done: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)


class LearningStore(Protocol):
    """What consolidation needs of a store (:mod:`heed.memory.learning.consolidation`); part of
    every :class:`MemoryStore`. Writes are one transaction each and check the bank's row
    first (:class:`BankGone`, nothing written)."""

    def pending_units(self, bank_ref: str, limit: int) -> list[StoredUnit]:
        """The bank's oldest *limit* units waiting for consolidation, oldest first."""
        ...

    def units_by_ids(self, bank_ref: str, ids: Sequence[str]) -> list[StoredUnit]:
        """The bank's units among *ids* (gone ones absent), in seq order."""
        ...

    def write_observations(self, bank_ref: str, changes: ObservationChanges) -> WriteResult:
        """Write a consolidation round (see :class:`ObservationChanges`): ``added`` lists
        the created units, then the replacements, in that order."""
        ...

    def delete_observations(self, bank_ref: str, source_id: str | None) -> WriteResult:
        """Delete the bank's observations (those resting on unit *source_id* when given);
        the facts they rested on become pending again."""
        ...

    def recover_consolidation(self, bank_ref: str) -> int:
        """Make the bank's ``failed`` units ``pending`` again; how many."""
        ...

    def banks_with_pending(self, limit: int) -> list[Bank]:
        """Up to *limit* banks (of every tenant, in ref order) that have units waiting
        for consolidation."""
        ...


class DirectiveStore(Protocol):
    """A bank's directives (:mod:`heed.memory.directives.rules`); part of every
    :class:`MemoryStore`. Each write is one transaction that checks the bank's row first
    (:class:`BankGone`, nothing written); deleting a bank deletes its directives. Reads of
    an id holding NUL find nothing."""

    def create_directive(self, directive: Directive, limit: int) -> Directive | None:
        """Insert *directive* (``created_at`` and ``updated_at`` are set here) into its bank,
        unless the bank holds *limit* directives already: then ``None``, nothing written."""
        ...

    def list_directives(self, bank_ref: str) -> list[Directive]:
        """Every directive of the bank, in :func:`heed.memory.directives.rules.in_order`."""
        ...

    def get_directive(self, bank_ref: str, directive_id: str) -> Directive | None:
        """The bank's directive *directive_id*."""
        ...

    def update_directive(
        self, bank_ref: str, directive_id: str, patch: DirectivePatch
    ) -> Directive | None:
        """Apply the sent fields of *patch* to the bank's directive in one statement (and
        set ``updated_at``); ``None`` when the bank has no such directive."""
        ...

    def delete_directive(self, bank_ref: str, directive_id: str) -> bool:
        """Delete the bank's directive; whether there was one."""
        ...


class BrowseStore(Protocol):
    """The memory store's reads for the views of a bank (:mod:`heed.memory.views.service`): its
    entities and their co-occurrence, the links among units, its tag lists and its
    chunks. Tag filters (*tags*, *tags_match*) keep the units :func:`heed.memory.tags.tags_pass`
    keeps, as :meth:`MemoryStore.list_units` does."""

    def entity_counts(
        self,
        bank_ref: str,
        tags: Sequence[str] | None,
        tags_match: TagsMatch,
        limit: int,
        offset: int,
        *,
        entity_id: str | None = None,
        min_count: int = 1,
    ) -> tuple[list[EntityCount], int]:
        """A page of the bank's entities named by at least *min_count* of the units passing
        the tag filter (only *entity_id* when given), with those units' count and dates,
        the most named first, then by canonical name; and how many entities qualify."""
        ...

    def entity_edges(
        self,
        bank_ref: str,
        entity_ids: Sequence[str],
        tags: Sequence[str] | None,
        tags_match: TagsMatch,
    ) -> list[EntityEdge]:
        """Each pair of *entity_ids* named together by units passing the tag filter, with
        how many, the heaviest pair first (then by ids)."""
        ...

    def unit_links(self, bank_ref: str, unit_ids: Sequence[str]) -> list[UnitLink]:
        """The stored links between two of the bank's units among *unit_ids*, each pair
        and type once (``source`` < ``target``)."""
        ...

    def tag_lists(
        self, bank_ref: str, source: str, fact_type: str | None = None
    ) -> list[TagListCount]:
        """Each distinct tag list the bank's units (of *fact_type* when given; *source*
        ``memories``) or mental models (*source* ``mental_models``) carry, with how many
        carry it; in no particular order."""
        ...

    def document_chunks(
        self, bank_ref: str, document_id: str, limit: int, offset: int
    ) -> tuple[list[ChunkRow], int] | None:
        """A page of the document's chunks by index, and how many it has; ``None`` when the
        bank has no document *document_id*."""
        ...

    def find_chunk(self, tenant: str, chunk_id: str) -> ChunkRow | None:
        """The chunk *chunk_id* of any bank of *tenant* (chunk ids are unique)."""
        ...


class MemoryStore(LearningStore, DirectiveStore, BrowseStore, Protocol):
    """Banks, documents, units, entities, links and the keyword index of all tenants (see
    the module docstring for the rules every method keeps)."""

    def migrate(self) -> None:
        """Bring the schema to the current version (idempotent)."""
        ...

    # banks
    def get_bank(self, tenant: str, bank_id: str) -> Bank | None:
        """The bank *bank_id* of *tenant* (``None`` when it has none)."""
        ...

    def list_banks(
        self, tenant: str, limit: int, offset: int, search: str | None = None
    ) -> tuple[list[tuple[Bank, int]], int]:
        """A page of *tenant*'s banks by ``bank_id``, each with its unit count, and how many
        banks the tenant has; with *search*, only those whose id, name or an alias holds
        it (case-insensitively)."""
        ...

    def save_bank(self, bank: Bank) -> Bank:
        """Create *bank* (``created_at`` empty) or update it. Raises :class:`BankGone` when
        updating a bank whose row is gone, :class:`BankTaken` when creating a bank whose
        ``(tenant, bank_id)`` another bank holds."""
        ...

    def delete_bank(self, bank_ref: str) -> int:
        """Delete the bank and everything in it; returns how many units it held (0 when it
        is gone already)."""
        ...

    def bank_stats(self, bank_ref: str) -> BankStats:
        """Units by fact type, links by type, documents, and the time of the last write."""
        ...

    def units_per_time_prefix(
        self, bank_ref: str, *, time_field: str, chars: int, since: str
    ) -> list[tuple[str, str, int]]:
        """``(prefix, fact_type, count)``: the bank's units grouped by the first *chars*
        characters of their *time_field* (one of
        :data:`heed.memory.views.timeseries.TIME_FIELDS`; ``created_at`` where a unit has none)
        and fact type, for prefixes ``>= since``."""
        ...

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
        bank's row is gone, ``ValueError`` for a vector of another size than the store
        holds. A document replaces a stored one of its id (``replace``) or is appended to
        it: then the stored last units and the new first ones are indexed with each other's
        text, as if the document had been retained whole (:mod:`heed.memory.retain.units`).
        Entities and links follow :mod:`heed.memory.retain.links`."""
        ...

    def retain_ledger(self, bank_ref: str, key: str) -> list[LedgerEntry]:
        """The documents already written under *key*, by document index (expired keys are
        forgotten first)."""
        ...

    # recall
    def bank_generation(self, bank_ref: str) -> int | None:
        """The bank's generation: a counter every write that adds or removes units bumps,
        in the write's transaction (``None`` when the bank does not exist). A primary-key
        read, cheap enough for every recall."""
        ...

    def load_vectors(self, bank_ref: str) -> VectorRows:
        """Every unit vector of the bank in seq order, with the generation they hold."""
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
    ) -> list[tuple[int, float]]:
        """BM25 over the bank's units matching any of *terms*, stemmed (blank terms count
        not at all, repeats once; PostgreSQL's English configuration also drops stop words):
        (seq, score), score positive, best first."""
        ...

    def units_by_entities(
        self, bank_ref: str, canonical_names: Sequence[str], limit: int
    ) -> list[tuple[int, float]]:
        """The bank's units naming any of the entities (canonical names), as (seq, how many
        of them it names), most first."""
        ...

    def linked_units(
        self, bank_ref: str, seqs: Sequence[int], limit: int
    ) -> list[tuple[int, float]]:
        """The units linked from any of *seqs*, as (seq, summed link weight), most first."""
        ...

    def units_in_window(
        self, bank_ref: str, start: str, end: str, limit: int
    ) -> list[tuple[int, str]]:
        """The units whose occurrence overlaps [*start*, *end*] (ISO text), as (seq,
        ``occurred_start``), latest first."""
        ...

    def fetch_units(self, bank_ref: str, seqs: Sequence[int]) -> dict[int, StoredUnit]:
        """The bank's units among *seqs* (a seq of another bank, or gone, is absent)."""
        ...

    def fetch_chunks(self, bank_ref: str, chunk_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The bank's chunks among *chunk_ids*: id -> ``{id, chunk_index, text}``."""
        ...

    def entity_states(
        self, bank_ref: str, canonical_names: Sequence[str], per_entity: int
    ) -> dict[str, dict[str, Any]]:
        """Per entity the bank knows among *canonical_names*, by name: ``{entity_id,
        canonical_name, observations}``, the observations being the text and
        ``mentioned_at`` of its latest *per_entity* units, newest first (none when its units
        are gone)."""
        ...

    # memories and documents
    def list_units(
        self, bank_ref: str, flt: UnitFilter, limit: int, offset: int
    ) -> tuple[list[StoredUnit], int]:
        """A page of the bank's units passing *flt*, and how many pass. ``search`` finds
        the text anywhere, case-folded (``%`` and ``_`` are wildcards); ``time_field``
        keeps the units with that time in [``start``, ``end``) and orders by it, latest
        first; otherwise the newest unit comes first."""
        ...

    def get_unit(self, bank_ref: str, unit_id: str) -> StoredUnit | None:
        """The bank's unit *unit_id*."""
        ...

    def delete_unit(self, bank_ref: str, unit_id: str) -> WriteResult | None:
        """Delete one unit with its links and entity rows (its entities stay); ``None``
        when the bank has no unit *unit_id*."""
        ...

    def list_documents(
        self, bank_ref: str, search: str | None, limit: int, offset: int
    ) -> tuple[list[DocumentInfo], int]:
        """A page of the bank's documents (without their text), the latest updated first,
        then by id; *search* finds the id or the text anywhere, case-folded."""
        ...

    def get_document(self, bank_ref: str, document_id: str) -> DocumentInfo | None:
        """The bank's document with its text and its units by fact type."""
        ...

    def delete_document(self, bank_ref: str, document_id: str) -> WriteResult | None:
        """Delete a document, its chunks and its units; ``None`` when the bank has no such
        document."""
        ...


class VectorSearchingStore(MemoryStore, Protocol):
    """A store that can search vectors itself. The engine uses :meth:`vector_search`
    instead of loading the bank into an in-process index when ``searches_vectors`` is true
    (PostgreSQL with pgvector); on SQLite the methods answer too, exactly, but recall keeps
    its in-process index."""

    searches_vectors: bool

    def vector_search(
        self, bank_ref: str, query: np.ndarray, k: int, types: Sequence[str] | None
    ) -> list[tuple[int, float]]:
        """The *k* units of the bank most similar to *query* (unit length) as
        (seq, cosine), best first; only units of *types* when given. ``ValueError`` for a
        query of another size than the store holds."""
        ...

    def unit_vectors(self, bank_ref: str, seqs: Sequence[int]) -> dict[int, np.ndarray]:
        """The stored vectors of *seqs* in the bank (those still present)."""
        ...
