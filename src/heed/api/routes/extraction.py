"""Dry-run extraction (``POST /v1/default/banks/{bank_id}/memories/dry-run-extract``).

Retain's fact extraction run on some content with the bank's settings (or the request's
``retain_mission`` / ``retain_extraction_mode``), writing nothing
(:mod:`heed.memory.learning.dry_run`). Like a sync retain it runs under the request's
token: a client that leaves stops the LLM call (499).
"""

from __future__ import annotations

from fastapi import APIRouter

from heed.api.deps import MemoryDep
from heed.api.input_rules import IdPath
from heed.api.routing import HeedRoute
from heed.api.wire import learning as wire
from heed.memory.learning.dry_run import dry_run_extract

router = APIRouter(
    prefix="/v1/default/banks/{bank_id}/memories", tags=["memories"], route_class=HeedRoute
)


@router.post("/dry-run-extract")
async def dry_run_extract_memories(
    bank_id: IdPath, body: wire.DryRunExtractRequest, engine: MemoryDep
) -> wire.DryRunExtractionResult:
    """The facts retain would extract from ``content``, the chunks it was cut into and the
    tokens the calls took; nothing is stored. A 400 names a field heed does not implement
    (given a value) and a bank or server that does not extract."""
    found = await dry_run_extract(
        engine,
        bank_id,
        wire.dry_run_item(body),
        mode=body.retain_extraction_mode,
        mission=body.retain_mission,
    )
    return wire.dry_run_result(found)
