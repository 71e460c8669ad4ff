"""Observations and their consolidation (``/v1/default/banks/{bank_id}/...``).

- ``POST .../consolidate``: start a consolidation of the bank now (an operation; a busy one
  is returned with ``deduplicated: true``);
- ``POST .../consolidation/recover``: make the units whose consolidation failed pending
  again, and start one;
- ``DELETE .../observations``: delete every observation (their facts become pending);
- ``DELETE .../memories/{memory_id}/observations``: delete the observations resting on one
  memory;
- ``GET .../memories/{memory_id}/history``: an observation's earlier versions;
- ``POST .../consolidation-strategies/preview``: which existing scopes a draft of the bank's
  ``consolidation_strategies`` would claim (nothing is saved; no LLM:
  :mod:`heed.memory.learning.strategy_preview`).

What consolidation is and how it is bounded and cancelled:
:mod:`heed.memory.learning.consolidation`.
"""

from __future__ import annotations

from fastapi import APIRouter

from heed.api.deps import ConsolidationDep, CurationDep, MemoryDep, ViewsDep
from heed.api.input_rules import IdPath
from heed.api.routing import HeedRoute
from heed.api.wire import learning as learning_wire
from heed.api.wire import memory as wire
from heed.memory.learning.strategy_preview import preview_strategies

router = APIRouter(
    prefix="/v1/default/banks/{bank_id}", tags=["observations"], route_class=HeedRoute
)


@router.post("/consolidate")
async def consolidate(
    bank_id: IdPath,
    engine: MemoryDep,
    consolidation: ConsolidationDep,
    body: wire.ConsolidationRequest | None = None,
) -> wire.ConsolidationResponse:
    """Start consolidating the bank's pending memories (or return the busy run), scoped by
    ``observation_scopes`` (else the bank's ``default_observation_scopes``)."""
    bank = await engine.get_bank(bank_id)
    scopes = body.observation_scopes if body is not None else None
    run, deduplicated = await consolidation.submit(bank, scopes)
    return wire.ConsolidationResponse(
        operation_id=run.id if run is not None else "", deduplicated=deduplicated
    )


@router.post("/consolidation/recover")
async def recover_consolidation(
    bank_id: IdPath, engine: MemoryDep, consolidation: ConsolidationDep
) -> wire.RecoverConsolidationResponse:
    """Make the memories whose consolidation failed pending again."""
    bank = await engine.get_bank(bank_id)
    return wire.RecoverConsolidationResponse(retried_count=await consolidation.recover(bank))


@router.delete("/observations")
async def clear_observations(
    bank_id: IdPath, engine: MemoryDep, consolidation: ConsolidationDep
) -> wire.DeleteResponse:
    """Delete every observation of the bank; their facts are consolidated again."""
    bank = await engine.get_bank(bank_id)
    deleted = await consolidation.clear(bank)
    return wire.deleted(f"deleted {deleted} observations", deleted)


@router.delete("/memories/{memory_id}/observations")
async def clear_memory_observations(
    bank_id: IdPath, memory_id: IdPath, engine: MemoryDep, consolidation: ConsolidationDep
) -> wire.ClearObservationsResponse:
    """Delete the observations resting on one memory."""
    bank = await engine.get_bank(bank_id)
    return wire.ClearObservationsResponse(deleted_count=await consolidation.clear(bank, memory_id))


@router.get("/memories/{memory_id}/history")
async def memory_history(
    bank_id: IdPath, memory_id: IdPath, engine: MemoryDep, curation: CurationDep
) -> wire.MemoryHistoryResponse:
    """A memory's earlier versions, oldest first: an observation's as consolidation
    rewrote it, a fact's edits and invalidations (empty for a memory never changed)."""
    bank = await engine.get_bank(bank_id)
    unit = (await curation.find(bank, memory_id)).unit
    return wire.MemoryHistoryResponse(
        memory_id=unit.id,
        text=unit.text,
        history=[wire.MemoryHistoryEntry.model_validate(v) for v in unit.history],
    )


@router.post("/consolidation-strategies/preview")
async def preview_consolidation_strategies(
    bank_id: IdPath, body: learning_wire.ConsolidationStrategiesPreviewRequest, views: ViewsDep
) -> learning_wire.ConsolidationStrategiesPreview:
    """Which of the bank's existing observation scopes each strategy of a draft
    ``consolidation_strategies`` would apply to, and which fall to the default; a 400 naming
    a problem of the draft. Nothing is saved."""
    found = await preview_strategies(views, bank_id, body.strategies, body.sample_limit)
    return learning_wire.strategies_preview(found)
