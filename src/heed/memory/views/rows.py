"""What the read-only views of a bank read from the memory store (entities, their
co-occurrence, memory links, tags, chunks, observation scopes): plain rows, shared by
:class:`heed.memory.store.BrowseStore` (which returns them), its SQL implementation
(:mod:`heed.storage.memory.browse`) and :mod:`heed.memory.views.service` (which pages and shapes
them)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ChunkRow", "EntityCount", "EntityEdge", "TagListCount", "UnitLink"]


@dataclass(frozen=True, slots=True)
class EntityCount:
    """An entity with the units naming it: ``mention_count`` of them, the earliest and
    latest of their ``mentioned_at`` (else ``created_at``)."""

    id: str
    name: str
    type: str | None
    mention_count: int
    first_seen: str | None
    last_seen: str | None


@dataclass(frozen=True, slots=True)
class EntityEdge:
    """Two entities named together by ``weight`` units (``source`` < ``target`` by id), the
    latest of those units' ``mentioned_at`` (else ``created_at``)."""

    source: str
    target: str
    weight: int
    last_cooccurred: str | None


@dataclass(frozen=True, slots=True)
class UnitLink:
    """A stored link between two units (by id), of ``link_type`` with its ``weight``."""

    source: str
    target: str
    link_type: str
    weight: float


@dataclass(frozen=True, slots=True)
class TagListCount:
    """A tag list, exactly as rows carry it, and how many rows carry it."""

    tags: tuple[str, ...]
    count: int


@dataclass(frozen=True, slots=True)
class ChunkRow:
    """A stored chunk of a document: its place and text; ``created_at`` is its document's
    (a chunk is written with its document and never changed)."""

    id: str
    bank_id: str
    document_id: str
    chunk_index: int
    text: str
    created_at: str
