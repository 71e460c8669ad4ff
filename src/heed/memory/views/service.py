"""Read-only views of a bank, as Hindsight's browsing routes answer them: its entities (with
how many memories name each), one entity with its latest memories, the entities' co-occurrence
graph, the memory graph (units and the links between them), the bank's tags, its observation
scopes and its documents' chunks.

Everything here reads what retain and consolidation stored (:class:`heed.memory.store.BrowseStore`);
nothing is computed by a model and nothing is written. An entity is what heed's entity
links name (``memory_entities``): its *mentions* are the units naming it, its first and last
sight their earliest and latest ``mentioned_at`` (else ``created_at``). A tag filter is
recall's rule (:func:`heed.memory.tags.tags_pass`) on the units counted.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from heed.memory.engine import MemoryEngine
from heed.memory.models import Bank, InvalidInput, NotFound, StoredUnit, TagsMatch
from heed.memory.store import UnitFilter
from heed.memory.views.rows import ChunkRow, EntityCount, EntityEdge, UnitLink
from heed.runtime import current_context, run_in_thread

__all__ = [
    "ENTITY_OBSERVATIONS",
    "TAG_SOURCES",
    "BankViews",
    "EntityDetail",
    "EntityGraph",
    "MemoryGraph",
    "tag_pattern",
]

#: How many of an entity's latest memories its detail shows (as Hindsight's observations).
ENTITY_OBSERVATIONS: Final = 10
#: Edges an entity graph shows at most, per node it shows.
EDGES_PER_NODE: Final = 10
#: Where ``GET .../tags`` reads tags from.
TAG_SOURCES: Final = ("memories", "mental_models")
#: The fact type of observations (consolidation's units).
_OBSERVATION: Final = "observation"


@dataclass(frozen=True, slots=True)
class EntityDetail:
    """One entity with its counts and its latest memories (newest first)."""

    entity: EntityCount
    memories: list[StoredUnit]


@dataclass(frozen=True, slots=True)
class EntityGraph:
    """The most named entities (``nodes``) and how often two of them are named together
    (``edges``); the totals count every entity and every edge among the nodes."""

    nodes: list[EntityCount]
    edges: list[EntityEdge]
    total_entities: int
    total_edges: int


@dataclass(frozen=True, slots=True)
class MemoryGraph:
    """A page of units and the stored links among them; ``total`` counts every unit the
    filter keeps."""

    units: list[StoredUnit]
    links: list[UnitLink]
    total: int


def tag_pattern(q: str | None) -> re.Pattern[str] | None:
    """The case-folded matcher of a tag filter *q*: ``*`` matches any run of characters and
    the whole tag must match; without ``*`` the tag must contain *q*. ``None``: no filter."""
    if not q:
        return None
    if "*" not in q:
        return re.compile(".*" + re.escape(q) + ".*", re.IGNORECASE | re.DOTALL)
    return re.compile(".*".join(re.escape(part) for part in q.split("*")), re.I | re.DOTALL)


class BankViews:
    """The views of the current tenant's banks over *engine*'s store (see the module
    docstring). Each method names its bank by id and is a 404 naming what is missing: the
    bank (another tenant's too), the entity, the document or the chunk."""

    def __init__(self, engine: MemoryEngine) -> None:
        self.engine = engine
        self.store = engine.store

    async def entities(
        self,
        bank_id: str,
        tags: Sequence[str] | None,
        tags_match: TagsMatch,
        limit: int,
        offset: int,
    ) -> tuple[list[EntityCount], int]:
        """A page of the bank's entities, the most named first, and how many there are."""

        async def read(bank: Bank) -> tuple[list[EntityCount], int]:
            return await run_in_thread(
                self.store.entity_counts, bank.ref, tags, tags_match, limit, offset
            )

        return await self.engine.on_bank(bank_id, read, found=lambda page: bool(page[0]))

    async def entity(
        self, bank_id: str, entity_id: str, tags: Sequence[str] | None, tags_match: TagsMatch
    ) -> EntityDetail:
        """The entity *entity_id* with its latest :data:`ENTITY_OBSERVATIONS` memories; a
        404 when no memory passing the tag filter names it."""

        async def read(bank: Bank) -> EntityDetail:
            found, _ = await run_in_thread(
                self.store.entity_counts, bank.ref, tags, tags_match, 1, 0, entity_id=entity_id
            )
            if not found:
                raise NotFound(f"entity {entity_id!r} not found in bank {bank_id!r}")
            flt = UnitFilter(entity_id=entity_id, tags=tags, tags_match=tags_match)
            units, _ = await run_in_thread(
                self.store.list_units, bank.ref, flt, ENTITY_OBSERVATIONS, 0
            )
            return EntityDetail(found[0], units)

        return await self.engine.on_bank(bank_id, read)

    async def entity_graph(
        self,
        bank_id: str,
        limit: int,
        min_count: int,
        tags: Sequence[str] | None,
        tags_match: TagsMatch,
    ) -> EntityGraph:
        """The *limit* most named entities named at least *min_count* times, and the pairs
        of them named together (at most :data:`EDGES_PER_NODE` per node, the heaviest)."""

        async def read(bank: Bank) -> EntityGraph:
            nodes, total = await run_in_thread(
                self.store.entity_counts,
                bank.ref,
                tags,
                tags_match,
                limit,
                0,
                min_count=min_count,
            )
            edges = await run_in_thread(
                self.store.entity_edges, bank.ref, [n.id for n in nodes], tags, tags_match
            )
            return EntityGraph(nodes, edges[: EDGES_PER_NODE * len(nodes)], total, len(edges))

        return await self.engine.on_bank(bank_id, read, found=lambda graph: bool(graph.nodes))

    async def memory_graph(self, bank_id: str, flt: UnitFilter, limit: int) -> MemoryGraph:
        """The newest *limit* units passing *flt* and the stored links among them."""

        async def read(bank: Bank) -> MemoryGraph:
            units, total = await self.engine.list_units(bank, flt, limit, 0)
            links = await run_in_thread(self.store.unit_links, bank.ref, [u.id for u in units])
            return MemoryGraph(units, links, total)

        return await self.engine.on_bank(bank_id, read, found=lambda graph: bool(graph.units))

    async def tags(
        self, bank_id: str, source: str, q: str | None, limit: int, offset: int
    ) -> tuple[list[tuple[str, int]], int]:
        """A page of the tags the bank's memories (or mental models) carry, each with how
        many carry it, the most used first, then by tag; *q* filters (:func:`tag_pattern`)."""
        if source not in TAG_SOURCES:
            raise InvalidInput(f"source must be one of {', '.join(TAG_SOURCES)}, not {source!r}")
        pattern = tag_pattern(q)

        async def read(bank: Bank) -> tuple[list[tuple[str, int]], int]:
            counts: Counter[str] = Counter()
            for row in await run_in_thread(self.store.tag_lists, bank.ref, source):
                for tag in set(row.tags):
                    counts[tag] += row.count
            ranked = sorted(
                (item for item in counts.items() if pattern is None or pattern.fullmatch(item[0])),
                key=lambda item: (-item[1], item[0]),
            )
            return ranked[offset : offset + limit], len(ranked)

        return await self.engine.on_bank(bank_id, read, found=lambda page: bool(page[1]))

    async def observation_scopes(
        self, bank_id: str, limit: int, offset: int
    ) -> tuple[list[tuple[list[str], int]], int]:
        """A page of the distinct tag sets the bank's observations carry (sorted; ``[]`` the
        untagged scope), each with how many observations carry it, the most populous first,
        then by tags; and how many scopes there are."""

        async def read(bank: Bank) -> tuple[list[tuple[list[str], int]], int]:
            counts: Counter[tuple[str, ...]] = Counter()
            for row in await run_in_thread(
                self.store.tag_lists, bank.ref, "memories", _OBSERVATION
            ):
                counts[tuple(sorted(set(row.tags)))] += row.count
            ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
            page = [(list(tags), n) for tags, n in ranked[offset : offset + limit]]
            return page, len(ranked)

        return await self.engine.on_bank(bank_id, read, found=lambda page: bool(page[1]))

    async def document_chunks(
        self, bank_id: str, document_id: str, limit: int, offset: int
    ) -> tuple[list[ChunkRow], int]:
        """A page of the document's chunks by index; a 404 naming an unknown document."""

        async def read(bank: Bank) -> tuple[list[ChunkRow], int]:
            page = await run_in_thread(
                self.store.document_chunks, bank.ref, document_id, limit, offset
            )
            if page is None:
                raise NotFound(f"document {document_id!r} not found in bank {bank_id!r}")
            return page

        return await self.engine.on_bank(bank_id, read)

    async def chunk(self, chunk_id: str) -> ChunkRow:
        """The chunk *chunk_id* of one of the current tenant's banks; a 404 naming it."""
        found = await run_in_thread(self.store.find_chunk, current_context().tenant, chunk_id)
        if found is None:
            raise NotFound(f"chunk {chunk_id!r} not found")
        return found
