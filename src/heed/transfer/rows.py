"""A whole bank as rows: what a bank transfer reads from one store and writes into another.

An export, an import or a clone (:mod:`heed.transfer.service`) moves every row a bank holds,
in bounded batches, through the store methods of
:class:`heed.memory.store.TransferStore`: :class:`BankReader` streams a bank out of one
consistent snapshot, section by section, and the ``write_*_rows`` methods write rows into
a (staging) bank. The rows are plain data, independent of the archive's JSON
(:mod:`heed.transfer.archive`) and of the tables (:mod:`heed.storage.transfer.rows`).

What a row carries is what the bank holds, nothing derived that the target could not
rebuild the same way: unit ids, chunk ids and entity ids are the source's (the importer
maps them to fresh ones), a unit's vector and its keyword text (``index_text``) travel, so
an import needs no embedding; seqs, generations and shared-value references do not (the
target allocates its own).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from heed.mental_models.values import MentalModelRow

__all__ = [
    "BankReader",
    "BankSelection",
    "ChunkRow",
    "DocumentRow",
    "EntityRow",
    "LinkRow",
    "MembershipRow",
    "MentalModelRow",
    "UnitRow",
]


@dataclass(frozen=True, slots=True)
class ChunkRow:
    """The raw text of one retained item of a document."""

    id: str
    chunk_index: int
    text: str


@dataclass(slots=True)
class DocumentRow:
    """A document with its chunks; ``unit_count`` of its units follow it (in seq order)."""

    document_id: str
    original_text: str
    content_hash: str | None
    metadata: dict[str, Any]
    tags: list[str]
    created_at: str
    updated_at: str
    unit_count: int
    chunks: list[ChunkRow] = field(default_factory=list)


@dataclass(slots=True)
class UnitRow:
    """A memory unit: a document's (``document_id`` set) or an observation (``None``).

    Times are ISO-8601 text in UTC, as the stores keep them. ``index_text`` is what the
    keyword index holds for it (``None`` when the store could not read it back: the
    reader rebuilds it by :mod:`heed.memory.retain.units`' rule). ``vector`` is float32 of the
    store's size, or ``None`` for a unit stored without one.
    """

    id: str
    document_id: str | None
    chunk_id: str | None
    text: str
    index_text: str | None
    fact_type: str
    context: str | None
    occurred_start: str | None
    occurred_end: str | None
    mentioned_at: str | None
    metadata: dict[str, Any]
    tags: list[str]
    created_at: str
    updated_at: str | None
    token_count: int | None
    consolidation_state: str | None
    source_ids: list[str]
    proof_count: int | None
    history: list[dict[str, Any]]
    vector: Any = None  # np.ndarray (dim,), float32, or None


@dataclass(frozen=True, slots=True)
class EntityRow:
    """An entity of the bank (its canonical name is derived from *name*)."""

    id: str
    name: str
    type: str | None


@dataclass(frozen=True, slots=True)
class MembershipRow:
    """Unit *unit_id* names entity *entity_id*."""

    unit_id: str
    entity_id: str


@dataclass(frozen=True, slots=True)
class LinkRow:
    """A graph link between two units of the bank."""

    from_id: str
    to_id: str
    link_type: str
    weight: float


@dataclass(frozen=True, slots=True)
class BankSelection:
    """Which of a bank's rows a reader gives: every document (``document_ids`` ``None``)
    or those named, and the observations or not (never with a document subset). Anything
    but the whole bank carries the entities its units name and the links between its
    units only."""

    document_ids: Sequence[str] | None = None
    observations: bool = True

    @property
    def with_observations(self) -> bool:
        """Whether the observations are selected (a document subset leaves them out)."""
        return self.observations and self.document_ids is None

    @property
    def whole_bank(self) -> bool:
        return self.with_observations


class BankReader(Protocol):
    """One consistent snapshot of a bank, read section by section in batches of at most
    *batch* rows (each batch a list; the active token is checked between batches). Valid
    only inside the ``with`` block that opened it, in the thread that opened it."""

    def count_units(self) -> int:
        """How many units (documents' and observations, as selected) the reader gives."""
        ...

    def documents(self, batch: int) -> Iterator[list[DocumentRow]]:
        """The selected documents by ``document_id``, each with its chunks."""
        ...

    def units(self, batch: int) -> Iterator[list[UnitRow]]:
        """The selected documents' units, by document (in :meth:`documents`' order), each
        document's in seq order."""
        ...

    def observations(self, batch: int) -> Iterator[list[UnitRow]]:
        """The units without a document (observations), in seq order (none when the
        selection leaves them out)."""
        ...

    def entities(self, batch: int) -> Iterator[list[EntityRow]]:
        """The entities: all the bank's for a whole bank, else those the selected units
        name; by id."""
        ...

    def memberships(self, batch: int) -> Iterator[list[MembershipRow]]:
        """The selected units' entity rows."""
        ...

    def links(self, batch: int) -> Iterator[list[LinkRow]]:
        """The links from a selected unit to a selected unit."""
        ...
