"""The JSON of a bank's LLM request traces and audit logs, shaped like ``hindsight-client``'s
models (``LLMRequestListResponse``, ``LLMRequestEntry``, ``LLMRequestStatsResponse``,
``AuditLogListResponse``, ``AuditLogSummary``, ``AuditLogEntry``,
``AuditLogStatsResponse``), and the conversions from :mod:`heed.observability`' rows.

heed keeps no span ids, cached or reasoning ("thoughts") token counts: ``span_id`` and
``parent_span_id`` are ``null``, ``cached_tokens`` 0 and ``thoughts_tokens`` ``null``.
``trace_id`` is the run the call was made in (``null`` outside a run).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from pydantic import BaseModel

from heed.observability import AuditEntry, TraceRow
from heed.observability.periods import iso

__all__ = [
    "AuditLogEntry",
    "AuditLogListResponse",
    "AuditLogStatsResponse",
    "AuditLogSummary",
    "LLMRequestEntry",
    "LLMRequestListResponse",
    "LLMRequestStatsResponse",
    "audit_entry",
    "audit_summary",
    "llm_request",
]


class LLMRequestEntry(BaseModel):
    id: str
    bank_id: str | None
    operation: str | None
    scope: str | None
    trace_id: str | None
    span_id: str | None = None
    parent_span_id: str | None = None
    provider: str | None
    model: str | None
    status: str
    started_at: str | None
    ended_at: str | None
    duration_ms: int | None
    input_tokens: int | None
    output_tokens: int | None
    cached_tokens: int | None = 0
    thoughts_tokens: int | None = None
    total_tokens: int | None
    input: Any = None
    output: Any = None
    error: str | None
    llm_info: dict[str, Any]
    metadata: dict[str, Any]


class _BankPage(BaseModel):
    # A page of a bank's entries (``items`` in the subclass): ``total`` counts every entry
    # the filters pass, ``limit`` and ``offset`` are the request's.
    bank_id: str
    total: int
    limit: int
    offset: int


class LLMRequestListResponse(_BankPage):
    items: list[LLMRequestEntry]


class LLMRequestTokenSums(BaseModel):
    input: int
    output: int
    cached: int
    thoughts: int | None = None
    total: int


class LLMRequestStatsBucket(BaseModel):
    time: str
    statuses: dict[str, int]
    total: int
    tokens: LLMRequestTokenSums


class LLMRequestStatsResponse(BaseModel):
    bank_id: str
    period: str
    trunc: str
    start: str
    buckets: list[LLMRequestStatsBucket]


class AuditLogSummary(BaseModel):
    id: str
    action: str
    transport: str
    bank_id: str | None
    started_at: str | None
    ended_at: str | None
    duration_ms: int | None = None
    metadata: dict[str, Any]


class AuditLogEntry(AuditLogSummary):
    request: dict[str, Any] | None
    response: dict[str, Any] | None


class AuditLogListResponse(_BankPage):
    items: list[AuditLogSummary]


class AuditLogStatsBucket(BaseModel):
    time: str
    actions: dict[str, int]
    total: int


class AuditLogStatsResponse(BaseModel):
    bank_id: str
    period: str
    trunc: str
    start: str
    buckets: list[AuditLogStatsBucket]


def llm_request(row: TraceRow) -> LLMRequestEntry:
    """One trace as the client reads it."""
    fields = asdict(row)
    for kept_apart in ("tenant", "started_at", "ended_at"):
        fields.pop(kept_apart)
    return LLMRequestEntry(
        **fields,
        started_at=iso(row.started_at),
        ended_at=iso(row.ended_at),
        total_tokens=row.input_tokens + row.output_tokens,
        llm_info={"provider": fields["provider"], "model": fields["model"]},
    )


def _audit_fields(entry: AuditEntry) -> dict[str, Any]:
    # The entry's fields by name, its times as ISO text: a model takes the ones it has.
    return {**asdict(entry), "started_at": iso(entry.started_at), "ended_at": iso(entry.ended_at)}


def audit_summary(entry: AuditEntry) -> AuditLogSummary:
    """An audit entry without its request and response, as the list gives it."""
    return AuditLogSummary.model_validate(_audit_fields(entry))


def audit_entry(entry: AuditEntry) -> AuditLogEntry:
    """One audit entry with what it keeps of its request and response."""
    return AuditLogEntry.model_validate(_audit_fields(entry))
