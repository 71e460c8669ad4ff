"""A bank's LLM request traces (Hindsight's ``LLM Traces`` routes):

- ``GET /v1/default/banks/{bank_id}/llm-requests``: a page of the bank's traced LLM calls,
  newest first, filtered by ``status``, ``operation``, ``scope``, ``call_type``,
  ``provider``, ``trace_id`` (one run's calls), ``start_date`` / ``end_date`` (ISO
  datetimes); ``group=true`` pages by run (``trace_id``) instead of by call and returns
  every call of the runs on the page, ``total`` counting runs;
- ``GET /v1/default/banks/{bank_id}/llm-requests/stats``: calls by status and token sums
  per hour (``period=1d``) or day (``7d``, ``30d``).

heed traces LLM calls only (no embedding, rerank or decision calls), so ``call_type``
``embedding``, ``rerank`` and ``decision`` match nothing; heed's traces are not linked to
documents or memories, so ``document_id`` and ``memory_id`` are refused (400 naming them).
Another ``call_type`` or ``period``, or a date that is not ISO 8601, is a 422 naming the
parameter (the document states them). An unknown bank is a 404. What a trace keeps:
docs/observability.md.
"""

from __future__ import annotations

from fastapi import APIRouter

from heed.api.deps import MemoryDep, ObservabilityDep
from heed.api.input_rules import IdPath
from heed.api.list_queries import TraceQueryDep, TraceStatsQueryDep
from heed.api.paging import LogPageDep
from heed.api.routing import HeedRoute
from heed.api.wire import observability as wire

router = APIRouter(prefix="/v1/default/banks", tags=["llm traces"], route_class=HeedRoute)


@router.get("/{bank_id}/llm-requests")
async def list_llm_requests(
    bank_id: IdPath,
    engine: MemoryDep,
    observability: ObservabilityDep,
    query: TraceQueryDep,
    page: LogPageDep,
) -> wire.LLMRequestListResponse:
    """A page of the bank's LLM request traces, newest first (module docstring)."""
    where = query.where()
    bank = await engine.get_bank(bank_id)
    if query.call_type not in (None, "llm"):  # heed traces LLM calls only
        return page.answer(wire.LLMRequestListResponse, [], 0, bank_id=bank.bank_id)
    listing = observability.trace_groups if query.group else observability.traces
    rows, total = await listing(bank.tenant, bank.bank_id, where, page.limit, page.offset)
    items = [wire.llm_request(r) for r in rows]
    return page.answer(wire.LLMRequestListResponse, items, total, bank_id=bank.bank_id)


@router.get("/{bank_id}/llm-requests/stats")
async def llm_request_stats(
    bank_id: IdPath, engine: MemoryDep, observability: ObservabilityDep, query: TraceStatsQueryDep
) -> wire.LLMRequestStatsResponse:
    """The bank's LLM calls by status and their tokens, per time bucket of *period*."""
    bank = await engine.get_bank(bank_id)
    where = query.where()
    stats = await observability.trace_stats(bank.tenant, bank.bank_id, where, query.period)
    if query.call_type not in (None, "llm"):  # heed traces LLM calls only
        stats["buckets"] = []
    return wire.LLMRequestStatsResponse.model_validate({"bank_id": bank.bank_id, **stats})
