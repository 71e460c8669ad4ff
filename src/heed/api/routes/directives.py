"""Directives: ``/v1/default/banks/{bank_id}/directives[/{directive_id}]`` (tenant-scoped).

hindsight-client's ``create_directive``, ``list_directives``, ``get_directive``,
``update_directive`` and ``delete_directive``. What a directive is, which apply to a reflect
or a chat turn and how they are said: :mod:`heed.memory.directives.rules`; the rules of each
call: :mod:`heed.memory.directives.service`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import Field

from heed.api.deps import DirectivesDep
from heed.api.input_rules import MAX_LIST_ITEMS, MAX_TAG_CHARS, IdPath
from heed.api.paging import PageDep
from heed.api.routing import HeedRoute
from heed.api.wire import directives as wire
from heed.api.wire.memory import DeleteResponse, deleted
from heed.memory.directives.rules import DirectivePatch, DirectiveScope

__all__ = ["router"]

router = APIRouter(
    prefix="/v1/default/banks/{bank_id}/directives", tags=["directives"], route_class=HeedRoute
)

TagsQuery = Annotated[
    list[Annotated[str, Field(min_length=1, max_length=MAX_TAG_CHARS)]] | None,
    Query(
        max_length=MAX_LIST_ITEMS,
        description="Only the directives that apply in this scope (the untagged ones, and "
        "the tagged ones these tags match); omit to list every directive.",
    ),
]


@router.post("")
async def create_directive(
    bank_id: IdPath, body: wire.DirectiveCreate, directives: DirectivesDep
) -> wire.DirectiveResponse:
    """Create a directive: a rule reflect and the bank's chat turns say to the model."""
    made = await directives.create(bank_id, **body.model_dump())
    return wire.directive_response(bank_id, made)


@router.get("")
async def list_directives(
    bank_id: IdPath,
    directives: DirectivesDep,
    page: PageDep,
    tags: TagsQuery = None,
    tags_match: Literal["any", "all", "any_strict", "all_strict", "exact"] = "any",
    active_only: bool = True,
) -> wire.DirectiveListResponse:
    """The bank's directives in the order they are said (priority, highest first)."""
    scope = DirectiveScope(tags, tags_match) if tags else None
    found, total = await directives.list_directives(
        bank_id, scope, active_only=active_only, limit=page.limit, offset=page.offset
    )
    items = [wire.directive_response(bank_id, d) for d in found]
    return page.answer(wire.DirectiveListResponse, items, total)


@router.get("/{directive_id}")
async def get_directive(
    bank_id: IdPath, directive_id: IdPath, directives: DirectivesDep
) -> wire.DirectiveResponse:
    """One directive."""
    return wire.directive_response(bank_id, await directives.get(bank_id, directive_id))


@router.patch("/{directive_id}")
async def update_directive(
    bank_id: IdPath, directive_id: IdPath, body: wire.DirectiveUpdate, directives: DirectivesDep
) -> wire.DirectiveResponse:
    """Change the fields sent (``null`` keeps a field; ``tags: []`` clears the tags)."""
    patch = DirectivePatch(**body.model_dump())
    return wire.directive_response(bank_id, await directives.update(bank_id, directive_id, patch))


@router.delete("/{directive_id}")
async def delete_directive(
    bank_id: IdPath, directive_id: IdPath, directives: DirectivesDep
) -> DeleteResponse:
    """Delete a directive."""
    await directives.delete(bank_id, directive_id)
    return deleted(f"directive {directive_id!r} deleted", 1)
