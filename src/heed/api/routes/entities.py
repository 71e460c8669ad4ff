"""Entities (``/v1/default/banks/{bank_id}/entities``): what heed's entity links name.

- ``GET .../entities``: the bank's entities, the most named first, paged, with each one's
  mention count and first and last sight;
- ``GET .../entities/graph``: the most named entities and how often two are named
  together (co-occurrence), bounded by ``limit``;
- ``GET .../entities/{entity_id}``: one entity with its latest memories as its
  ``observations``;
- ``POST .../entities/{entity_id}/regenerate``: deprecated in Hindsight (entity
  observations gave way to mental models). heed keeps no entity summary to regenerate: an
  entity's observations are read from its memories on every request, so they are always
  current, and this answers what ``GET .../entities/{entity_id}`` answers.

``tags`` / ``tags_match`` count only the memories recall would keep
(:func:`heed.memory.tags.tags_pass`); an entity no such memory names is left out (a 404 for
one entity). ``tag_groups`` is refused (400), as recall refuses it. What is counted:
:mod:`heed.memory.views.service`.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from heed.api.deps import ViewsDep
from heed.api.input_rules import IdPath, Limit
from heed.api.paging import PageDep
from heed.api.routing import HeedRoute
from heed.api.tag_query import TagQueryDep
from heed.api.wire import views as wire

router = APIRouter(
    prefix="/v1/default/banks/{bank_id}/entities", tags=["entities"], route_class=HeedRoute
)

MinCount = Annotated[int, Query(ge=1, le=1_000_000_000)]


@router.get("")
async def list_entities(
    bank_id: IdPath, views: ViewsDep, page: PageDep, tag: TagQueryDep
) -> wire.EntityListResponse:
    """The bank's entities, the most named first (then by canonical name)."""
    match = tag.match()
    entities, total = await views.entities(bank_id, tag.tags, match, page.limit, page.offset)
    return page.answer(wire.EntityListResponse, [wire.entity_item(e) for e in entities], total)


@router.get("/graph")
async def get_entity_graph(
    bank_id: IdPath,
    views: ViewsDep,
    tag: TagQueryDep,
    limit: Limit = 100,
    min_count: MinCount = 1,
) -> wire.EntityGraphResponse:
    """The ``limit`` most named entities (each named at least ``min_count`` times) and,
    between two of them, an edge weighted by how many memories name both."""
    match = tag.match()
    graph = await views.entity_graph(bank_id, limit, min_count, tag.tags, match)
    return wire.entity_graph(graph, limit)


@router.get("/{entity_id}")
async def get_entity(
    bank_id: IdPath,
    entity_id: IdPath,
    views: ViewsDep,
    tag: TagQueryDep,
) -> wire.EntityDetailResponse:
    """One entity with its latest memories (newest first) as its observations."""
    match = tag.match()
    return wire.entity_detail(await views.entity(bank_id, entity_id, tag.tags, match))


@router.post("/{entity_id}/regenerate", deprecated=True)
async def regenerate_entity_observations(
    bank_id: IdPath, entity_id: IdPath, views: ViewsDep
) -> wire.EntityDetailResponse:
    """Deprecated (as in Hindsight): nothing to regenerate, an entity's observations are
    read from its memories on every request; answers the entity as ``GET`` does."""
    return wire.entity_detail(await views.entity(bank_id, entity_id, None, "any"))
