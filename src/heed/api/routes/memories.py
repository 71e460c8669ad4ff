"""Memories: retain, recall, list, get and delete (``/v1/default/banks/{bank_id}/memories``).

Sync retain and recall run under the request's token: a client that leaves
stops them (499). Async retain returns an operation id at once; the
operation runs under its own token (see :mod:`heed.memory.retain.operations`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query
from fastapi.responses import JSONResponse

from heed.api.deps import CurationDep, MemoryDep, RetainOperationsDep
from heed.api.input_rules import IdPath
from heed.api.list_queries import FactType, UnitQueryDep
from heed.api.openapi import CONFLICT
from heed.api.paging import PageDep
from heed.api.routing import HeedRoute
from heed.api.wire import memory as wire
from heed.api.wire.memory_convert import (
    curated_item,
    recall_query,
    recall_response,
    retain_items,
    unit_item,
)
from heed.memory.retain.idempotency import MAX_KEY_CHARS

router = APIRouter(
    prefix="/v1/default/banks/{bank_id}/memories", tags=["memories"], route_class=HeedRoute
)


IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=MAX_KEY_CHARS,
        pattern=r"^[\x21-\x7e]+$",
        description="Makes a retried retain write nothing twice (see docs/security.md): "
        "printable ASCII, no spaces, up to 255 characters; kept 24 hours.",
    ),
]


@router.post("", responses=CONFLICT)
async def retain(
    bank_id: IdPath,
    body: wire.RetainRequest,
    engine: MemoryDep,
    operations: RetainOperationsDep,
    idempotency_key: IdempotencyKey = None,
) -> wire.RetainResponse:
    """Retain items, synchronously (one transaction per document) or as an operation.

    Under an ``Idempotency-Key`` a retry after a dropped connection writes only what the
    first attempt did not; the same key with another body answers 409.
    """
    bank = await engine.get_bank(bank_id)
    items = retain_items(body)
    tags = list(body.document_tags or [])
    if body.async_:
        run = await operations.submit(
            bank, items, tags, body.operation_id, idempotency_key=idempotency_key
        )
        return wire.RetainResponse.model_validate(
            {
                "success": True,
                "bank_id": bank_id,
                "items_count": len(items),
                "async": True,
                "operation_id": run.id,
                "operation_ids": [run.id],
            }
        )
    summary = await engine.on_bank(
        bank_id, lambda bank: engine.retain(bank, items, tags, idempotency_key=idempotency_key)
    )
    return wire.RetainResponse.model_validate(
        {
            "success": True,
            "bank_id": bank_id,
            "items_count": summary.items,
            "async": False,
            "units_count": summary.units,
            "document_ids": summary.document_ids,
            "extraction": summary.extraction.report() if summary.extraction else None,
        }
    )


@router.post("/recall", response_model=wire.RecallResponse)
async def recall(bank_id: IdPath, body: wire.RecallRequest, engine: MemoryDep) -> JSONResponse:
    """Hybrid recall; cancelled at the next checkpoint when the client leaves."""
    query = recall_query(body)
    outcome = await engine.on_bank(
        bank_id, lambda bank: engine.recall(bank, query), found=lambda found: bool(found.hits)
    )
    return JSONResponse(recall_response(outcome))


@router.get("/list")
async def list_memories(
    bank_id: IdPath, engine: MemoryDep, query: UnitQueryDep, page: PageDep
) -> wire.ListMemoryUnitsResponse:
    """Memory units, newest first (or by ``time_field``), with filters. ``state``: every
    stored unit is ``valid`` (an observation's earlier versions are its history, not
    units), so ``invalidated`` lists none. ``tags`` / ``tags_match`` keep the units recall
    would keep (:func:`heed.memory.tags.tags_pass`): ``any`` (the default) and ``all`` also
    keep the untagged, the ``_strict`` modes do not, ``exact`` keeps the units carrying
    exactly those tags; an unknown ``tags_match`` is a 400 naming it."""
    flt = query.where()
    if query.state == "invalidated":
        return page.answer(wire.ListMemoryUnitsResponse, [], 0)
    units, total = await engine.on_bank(
        bank_id,
        lambda bank: engine.list_units(bank, flt, page.limit, page.offset),
        found=lambda found: bool(found[0]),
    )
    return page.answer(wire.ListMemoryUnitsResponse, [unit_item(u) for u in units], total)


@router.delete("")
async def clear_memories(
    bank_id: IdPath,
    engine: MemoryDep,
    curation: CurationDep,
    type: Annotated[
        FactType | None,
        Query(description="Delete only memories of this fact type (default: all)"),
    ] = None,
) -> wire.DeleteResponse:
    """Delete a bank's memories: of one fact type (the observations citing deleted facts go
    with them), or all of them with their entities, chunks and documents. The bank, its
    settings, directives and mental models stay. One transaction: a client that leaves
    before it commits leaves everything as it was."""
    deleted = await engine.on_bank(bank_id, lambda bank: curation.clear(bank, type))
    return wire.deleted(f"deleted {deleted} memories", deleted)


@router.get("/{memory_id}")
async def get_memory(
    bank_id: IdPath, memory_id: IdPath, engine: MemoryDep, curation: CurationDep
) -> wire.MemoryUnitItem:
    """One memory unit, live or invalidated (``state``)."""
    return curated_item(await engine.on_bank(bank_id, lambda bank: curation.find(bank, memory_id)))


@router.patch("/{memory_id}")
async def update_memory(
    bank_id: IdPath,
    memory_id: IdPath,
    body: wire.UpdateMemoryRequest,
    engine: MemoryDep,
    curation: CurationDep,
) -> wire.MemoryUnitItem:
    """Curate a fact: edit its text, context, dates, type or entities (embedded again; its
    old text joins its history), invalidate it (recall and consolidation stop seeing it) or
    revert it (``state: "valid"``). The observations citing it are removed and their other
    facts consolidated again; the bank's mental models become stale. Observations are
    derived: curating one is a 400."""
    edit = body.edit()
    return curated_item(
        await engine.on_bank(bank_id, lambda bank: curation.update(bank, memory_id, edit))
    )


@router.delete("/{memory_id}")
async def delete_memory(
    bank_id: IdPath, memory_id: IdPath, engine: MemoryDep
) -> wire.DeleteResponse:
    """Delete one memory unit (and its keyword, vector and link entries)."""
    await engine.on_bank(bank_id, lambda bank: engine.delete_unit(bank, memory_id))
    return wire.deleted(f"memory {memory_id!r} deleted", 1)
