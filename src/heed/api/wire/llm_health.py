"""The JSON of a bank's LLM probe, shaped like ``hindsight-client``'s
``BankLlmHealthResponse`` and ``LlmOperationHealth`` (statuses only:
:mod:`heed.llm.health`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from heed.llm.health import Probe

__all__ = ["BankLlmHealthResponse", "LlmOperationHealth", "bank_llm_health"]


class LlmOperationHealth(BaseModel):
    operation: Literal["retain", "consolidation", "reflect"]
    ok: bool
    status: Literal["connected", "not_configured", "auth_failed", "unreachable", "timeout"]
    latency_ms: float | None = None


class BankLlmHealthResponse(BaseModel):
    bank_id: str
    operations: list[LlmOperationHealth]


def bank_llm_health(bank_id: str, probes: list[tuple[str, Probe]]) -> BankLlmHealthResponse:
    """The wire form of a bank's probes."""
    return BankLlmHealthResponse(
        bank_id=bank_id,
        operations=[
            LlmOperationHealth.model_validate(
                {
                    "operation": operation,
                    "ok": probe.ok,
                    "status": probe.status,
                    "latency_ms": probe.latency_ms,
                }
            )
            for operation, probe in probes
        ],
    )
