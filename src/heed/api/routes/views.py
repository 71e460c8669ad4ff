"""Views of a bank's memories (``/v1/default/banks/{bank_id}/...``), read-only:

- ``GET .../graph``: the memory graph, the newest ``limit`` units passing the filters
  (``type``, ``q``, ``tags`` / ``tags_match``, ``document_id``, ``chunk_id``, as the
  memories list filters) as nodes and table rows, and the stored links among them (entity
  and temporal links, :mod:`heed.memory.retain.links`) as edges;
- ``GET .../tags``: the tags the bank's memories (``source=memories``, the default) or
  mental models (``source=mental_models``) carry, each with how many carry it, the most
  used first; ``q`` filters, ``*`` being a wildcard (without one, a tag containing ``q``),
  case-folded;
- ``GET .../observations/scopes``: the distinct tag sets the bank's observations carry
  (sorted; ``[]`` the untagged scope), each with how many carry it, the most populous first.

What is read: :mod:`heed.memory.views.service`.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from heed.api.deps import ViewsDep
from heed.api.input_rules import IdPath, QueryText
from heed.api.list_queries import GraphQueryDep
from heed.api.paging import PageDep
from heed.api.routing import HeedRoute
from heed.api.wire import views as wire
from heed.memory.views.service import TAG_SOURCES

router = APIRouter(prefix="/v1/default/banks/{bank_id}", tags=["memories"], route_class=HeedRoute)

TagSource = Annotated[
    str,
    Query(
        json_schema_extra={"enum": list(TAG_SOURCES)},
        description="memories (the default) or mental_models; another value is a 400.",
    ),
]


@router.get("/graph")
async def get_graph(
    bank_id: IdPath, views: ViewsDep, query: GraphQueryDep
) -> wire.GraphDataResponse:
    """The newest ``limit`` units passing the filters and the links among them."""
    flt = query.where()
    return wire.memory_graph(await views.memory_graph(bank_id, flt, query.limit), query.limit)


@router.get("/tags")
async def list_tags(
    bank_id: IdPath,
    views: ViewsDep,
    page: PageDep,
    q: QueryText | None = None,
    source: TagSource = "memories",
) -> wire.ListTagsResponse:
    """The bank's tags with how many memories (or mental models) carry each."""
    tags, total = await views.tags(bank_id, source, q, page.limit, page.offset)
    return page.answer(
        wire.ListTagsResponse, [wire.TagItem(tag=t, count=n) for t, n in tags], total
    )


@router.get("/observations/scopes")
async def list_observation_scopes(
    bank_id: IdPath, views: ViewsDep, page: PageDep
) -> wire.ObservationScopesResponse:
    """The distinct tag sets of the bank's observations, with their counts."""
    scopes, total = await views.observation_scopes(bank_id, page.limit, page.offset)
    return wire.ObservationScopesResponse(
        scopes=[wire.ObservationScope(tags=tags, count=n) for tags, n in scopes],
        total=total,
        limit=page.limit,
        offset=page.offset,
    )
