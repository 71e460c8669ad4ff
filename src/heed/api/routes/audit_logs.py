"""A bank's audit log (Hindsight's ``Audit`` routes):

- ``GET /v1/default/banks/{bank_id}/audit-logs``: a page of the bank's entries, newest
  first, filtered by ``action``, ``transport`` (``http``, ``system``), ``start_date`` /
  ``end_date`` (ISO datetimes), without their request and response;
- ``GET /v1/default/banks/{bank_id}/audit-logs/stats``: entries by action per hour
  (``period=1d``) or day (``7d``, ``30d``);
- ``GET /v1/default/banks/{bank_id}/audit-logs/{log_id}``: one entry with its request and
  response (404 naming an unknown id).

What an entry is (a mutating request, a run's end) and what it keeps:
docs/observability.md. Another ``period``, or a date that is not ISO 8601, is a 422 naming
the parameter. An unknown bank is a 404.
"""

from __future__ import annotations

from fastapi import APIRouter

from heed.api.deps import MemoryDep, ObservabilityDep
from heed.api.input_rules import IdPath
from heed.api.list_queries import AuditQueryDep, AuditStatsQueryDep
from heed.api.paging import LogPageDep
from heed.api.routing import HeedRoute
from heed.api.wire import observability as wire
from heed.memory import NotFound

router = APIRouter(prefix="/v1/default/banks", tags=["audit"], route_class=HeedRoute)


@router.get("/{bank_id}/audit-logs")
async def list_audit_logs(
    bank_id: IdPath,
    engine: MemoryDep,
    observability: ObservabilityDep,
    query: AuditQueryDep,
    page: LogPageDep,
) -> wire.AuditLogListResponse:
    """A page of the bank's audit entries, newest first."""
    where = query.where()
    bank = await engine.get_bank(bank_id)
    entries, total = await observability.audits(
        bank.tenant, bank.bank_id, where, page.limit, page.offset
    )
    items = [wire.audit_summary(e) for e in entries]
    return page.answer(wire.AuditLogListResponse, items, total, bank_id=bank.bank_id)


@router.get("/{bank_id}/audit-logs/stats")
async def audit_log_stats(
    bank_id: IdPath, engine: MemoryDep, observability: ObservabilityDep, query: AuditStatsQueryDep
) -> wire.AuditLogStatsResponse:
    """The bank's audit entries by action, per time bucket of *period*."""
    bank = await engine.get_bank(bank_id)
    stats = await observability.audit_stats(bank.tenant, bank.bank_id, query.action, query.period)
    return wire.AuditLogStatsResponse.model_validate({"bank_id": bank.bank_id, **stats})


@router.get("/{bank_id}/audit-logs/{log_id}")
async def get_audit_log(
    bank_id: IdPath, log_id: IdPath, engine: MemoryDep, observability: ObservabilityDep
) -> wire.AuditLogEntry:
    """One audit entry with its request and response."""
    bank = await engine.get_bank(bank_id)
    entry = await observability.audit(bank.tenant, bank.bank_id, log_id)
    if entry is None:
        raise NotFound(f"audit log entry {log_id!r} not found in bank {bank.bank_id!r}")
    return wire.audit_entry(entry)
