"""A bank's LLM probe (``POST /v1/default/banks/{bank_id}/health/llm``).

One minimal real call to the provider of each operation the bank's work uses (retain,
consolidation, reflect), each answered with a status only (:mod:`heed.llm.health`). A
deliberate action, not for polling; a client that leaves stops the probes (499).
"""

from __future__ import annotations

from fastapi import APIRouter

from heed.api.deps import LlmHealthDep, MemoryDep
from heed.api.input_rules import IdPath
from heed.api.routing import HeedRoute
from heed.api.wire.llm_health import BankLlmHealthResponse, bank_llm_health

router = APIRouter(prefix="/v1/default/banks/{bank_id}", tags=["banks"], route_class=HeedRoute)


@router.post("/health/llm")
async def test_bank_llm(
    bank_id: IdPath, engine: MemoryDep, health: LlmHealthDep
) -> BankLlmHealthResponse:
    """Probe the LLM of each of the bank's operations: ``connected``, ``not_configured``,
    ``auth_failed``, ``unreachable`` or ``timeout``, with the measured latency."""
    bank = await engine.get_bank(bank_id)
    return bank_llm_health(bank.bank_id, await health.check())
