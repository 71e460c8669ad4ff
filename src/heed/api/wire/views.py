"""The JSON of the bank views (entities, the entity and memory graphs, tags, observation
scopes, chunks), shaped like ``hindsight-client``'s models (``EntityListResponse``,
``EntityDetailResponse``, ``EntityGraphResponse``, ``GraphDataResponse``,
``ListTagsResponse``, ``ObservationScopesResponse``, ``ListChunksResponse``,
``ChunkResponse``), and the conversions from :mod:`heed.memory.views.service`' results. The graphs
use the Cytoscape ``{"data": {...}}`` envelope with camelCase keys, as the client reads
them."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from heed.memory.models import StoredUnit
from heed.memory.views.rows import ChunkRow, EntityCount
from heed.memory.views.service import EntityDetail, EntityGraph, MemoryGraph

__all__ = [
    "ChunkResponse",
    "EntityDetailResponse",
    "EntityGraphResponse",
    "EntityListResponse",
    "GraphDataResponse",
    "ListChunksResponse",
    "ListTagsResponse",
    "ObservationScopesResponse",
    "chunk_response",
    "entity_detail",
    "entity_graph",
    "entity_item",
    "memory_graph",
]

#: Characters of a unit's text a memory-graph node's label shows.
LABEL_CHARS: Final = 60


class _Camel(BaseModel):
    """A graph payload: written by alias (camelCase), extra keys allowed."""

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True, extra="allow")


class EntityListItem(BaseModel):
    id: str
    canonical_name: str
    mention_count: int
    first_seen: str | None = None
    last_seen: str | None = None
    metadata: dict[str, Any] | None = None


class EntityListResponse(BaseModel):
    items: list[EntityListItem]
    total: int
    limit: int
    offset: int


class EntityObservationResponse(BaseModel):
    text: str
    mentioned_at: str | None = None


class EntityDetailResponse(EntityListItem):
    observations: list[EntityObservationResponse]


class EntityGraphNodeData(_Camel):
    id: str
    label: str = ""
    mention_count: int = Field(0, alias="mentionCount")
    color: str | None = None


class EntityGraphNode(BaseModel):
    data: EntityGraphNodeData


class _GraphEdgeData(_Camel):
    """An edge of a graph answer: its id and the ids of the two nodes it joins (a
    subclass's schema lists these first, then its own fields)."""

    id: str
    source: str
    target: str


class EntityGraphEdgeData(_GraphEdgeData):
    link_type: str = Field("cooccurrence", alias="linkType")
    weight: int = 0
    last_cooccurred: str | None = Field(None, alias="lastCooccurred")


class EntityGraphEdge(BaseModel):
    data: EntityGraphEdgeData


class EntityGraphResponse(BaseModel):
    nodes: list[EntityGraphNode]
    edges: list[EntityGraphEdge]
    total_entities: int
    total_edges: int
    limit: int


class MemoryGraphNodeData(_Camel):
    id: str
    label: str = ""
    text: str = ""
    date: str = ""
    context: str = ""
    entities: str = ""
    fact_type: str | None = Field(None, alias="factType")


class MemoryGraphNode(BaseModel):
    data: MemoryGraphNodeData


class MemoryGraphEdgeData(_GraphEdgeData):
    link_type: str = Field("", alias="linkType")
    weight: float = 0.0
    entity_name: str = Field("", alias="entityName")


class MemoryGraphEdge(BaseModel):
    data: MemoryGraphEdgeData


class MemoryGraphTableRow(BaseModel):
    id: str
    text: str = ""
    context: str = ""
    occurred_start: str | None = None
    occurred_end: str | None = None
    mentioned_at: str | None = None
    date: str | None = None
    entities: str = ""
    document_id: str | None = None
    chunk_id: str | None = None
    fact_type: str | None = None
    tags: list[str] | None = None
    created_at: str | None = None
    proof_count: int | None = None


class GraphDataResponse(BaseModel):
    nodes: list[MemoryGraphNode]
    edges: list[MemoryGraphEdge]
    table_rows: list[MemoryGraphTableRow]
    total_units: int
    limit: int


class TagItem(BaseModel):
    tag: str
    count: int


class ListTagsResponse(BaseModel):
    items: list[TagItem]
    total: int
    limit: int
    offset: int


class ObservationScope(BaseModel):
    tags: list[str]
    count: int


class ObservationScopesResponse(BaseModel):
    scopes: list[ObservationScope]
    total: int
    limit: int
    offset: int


class ChunkResponse(BaseModel):
    chunk_id: str
    document_id: str
    bank_id: str
    chunk_index: int
    chunk_text: str
    created_at: str
    attachments: list[dict[str, Any]] | None = None


class ListChunksResponse(BaseModel):
    items: list[ChunkResponse]
    total: int
    limit: int
    offset: int


def entity_item(entity: EntityCount) -> EntityListItem:
    """An entity as a list item, its fields by name (``canonical_name`` is its name); its
    ``metadata`` holds its type when it has one."""
    metadata = {"type": entity.type} if entity.type else None
    fields = {**asdict(entity), "canonical_name": entity.name, "metadata": metadata}
    return EntityListItem.model_validate(fields)


def entity_detail(detail: EntityDetail) -> EntityDetailResponse:
    """An entity with its latest memories as its ``observations``."""
    return EntityDetailResponse(
        **entity_item(detail.entity).model_dump(),
        observations=[
            EntityObservationResponse(text=u.text, mentioned_at=u.mentioned_at or u.created_at)
            for u in detail.memories
        ],
    )


def entity_graph(graph: EntityGraph, limit: int) -> EntityGraphResponse:
    """The co-occurrence graph in the client's envelope."""
    return EntityGraphResponse(
        nodes=[
            EntityGraphNode(
                data=EntityGraphNodeData(id=n.id, label=n.name, mentionCount=n.mention_count)
            )
            for n in graph.nodes
        ],
        edges=[
            EntityGraphEdge(
                data=EntityGraphEdgeData(
                    id=f"{e.source}-{e.target}",
                    source=e.source,
                    target=e.target,
                    linkType="cooccurrence",
                    weight=e.weight,
                    lastCooccurred=e.last_cooccurred,
                )
            )
            for e in graph.edges
        ],
        total_entities=graph.total_entities,
        total_edges=graph.total_edges,
        limit=limit,
    )


def _entities(unit: StoredUnit) -> str:
    return ", ".join(unit.entities) if unit.entities else "None"


def memory_graph(graph: MemoryGraph, limit: int) -> GraphDataResponse:
    """Units as nodes and table rows, stored links as edges; an ``entity`` link names the
    entities its two units share."""
    by_id = {u.id: u for u in graph.units}
    edges = []
    for link in graph.links:
        shared = ""
        if link.link_type == "entity":
            theirs = set(by_id[link.target].entities)
            shared = ", ".join(n for n in by_id[link.source].entities if n in theirs)
        edges.append(
            MemoryGraphEdge(
                data=MemoryGraphEdgeData(
                    id=f"{link.source}-{link.target}-{link.link_type}",
                    source=link.source,
                    target=link.target,
                    linkType=link.link_type,
                    weight=link.weight,
                    entityName=shared,
                )
            )
        )
    return GraphDataResponse(
        nodes=[
            MemoryGraphNode(
                data=MemoryGraphNodeData(
                    id=u.id,
                    label=u.text if len(u.text) <= LABEL_CHARS else u.text[:LABEL_CHARS] + "…",
                    text=u.text,
                    date=u.occurred_start or u.mentioned_at or "",
                    context=u.context or "",
                    entities=_entities(u),
                    factType=u.fact_type,
                )
            )
            for u in graph.units
        ],
        edges=edges,
        table_rows=[
            MemoryGraphTableRow(
                id=u.id,
                text=u.text,
                context=u.context or "N/A",
                occurred_start=u.occurred_start,
                occurred_end=u.occurred_end,
                mentioned_at=u.mentioned_at,
                date=u.occurred_start or u.mentioned_at,
                entities=_entities(u),
                document_id=u.document_id,
                chunk_id=u.chunk_id,
                fact_type=u.fact_type,
                tags=u.tags,
                created_at=u.created_at,
                proof_count=u.proof_count or 1,
            )
            for u in graph.units
        ],
        total_units=graph.total,
        limit=limit,
    )


def chunk_response(chunk: ChunkRow) -> ChunkResponse:
    """A stored chunk as the client's ``ChunkResponse``, its fields by name (``chunk_id``
    and ``chunk_text`` its id and text; heed keeps no attachments)."""
    fields = {**asdict(chunk), "chunk_id": chunk.id, "chunk_text": chunk.text, "attachments": []}
    return ChunkResponse.model_validate(fields)
