"""The rows observability keeps and the store protocol storage implements for them.

Three things are kept per tenant and bank id (a bank's name, so a deleted bank's rows go
with it when :meth:`ObservabilityStore.delete_bank` runs):

- **usage** (:class:`UsageRow`): calls and prompt / completion tokens per kind of LLM work
  and hour (``hour_start``, epoch seconds at the start of the UTC hour), added up by an
  upsert, so a budget can read a bank's tokens of the last hour or day in one small query;
- **LLM request traces** (:class:`TraceRow`): one row per call, bounded per bank;
- **audit entries** (:class:`AuditEntry`): one row per mutating request or ended run,
  bounded per bank.

Times are epoch seconds. Every method blocks (short SQL); callers run them off the loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "AuditEntry",
    "AuditFilter",
    "ObservabilityStore",
    "Retention",
    "TraceFilter",
    "TraceRow",
    "UsageRow",
]


@dataclass(frozen=True, slots=True)
class UsageRow:
    """Calls and tokens of one kind of LLM work for one bank in one hour (an increment
    when written, a sum when read)."""

    tenant: str
    bank_id: str
    kind: str
    hour_start: int
    calls: int
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One LLM call as its trace keeps it. ``operation`` is the work it served in
    Hindsight's words (``retain`` for extraction), ``scope`` heed's kind of work;
    ``input`` / ``output`` are JSON values (redacted unless the setting keeps text)."""

    id: str
    tenant: str
    bank_id: str
    operation: str
    scope: str
    trace_id: str | None
    provider: str
    model: str
    status: str
    started_at: float
    ended_at: float
    duration_ms: int
    input_tokens: int
    output_tokens: int
    input: Any
    output: Any
    error: str | None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TraceFilter:
    """Which traces of a bank a list or stats read takes (``None``: any)."""

    status: str | None = None
    operation: str | None = None
    scope: str | None = None
    provider: str | None = None
    trace_id: str | None = None
    since: float | None = None
    until: float | None = None


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """Who did what to which bank, and when. ``action`` is the operation's name (the
    route's or ``run.<kind>``), ``transport`` ``http`` or ``system`` (a run's end);
    ``request`` / ``response`` what the entry shows of them (never a body or a header)."""

    id: str
    tenant: str
    bank_id: str | None
    action: str
    transport: str
    started_at: float
    ended_at: float | None
    duration_ms: int | None
    principal: str | None
    request: dict[str, Any] | None
    response: dict[str, Any] | None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Retention:
    """What a prune keeps: of each bank it names, the ``max_traces`` / ``max_audits`` newest
    traces and audit entries; in every bank, no row older than its table's cut-off (epoch
    seconds; ``0``: no cut)."""

    max_traces: int
    max_audits: int
    traces_before: float
    audits_before: float
    usage_before: float


@dataclass(frozen=True, slots=True)
class AuditFilter:
    """Which audit entries of a bank a list or stats read takes (``None``: any)."""

    action: str | None = None
    transport: str | None = None
    since: float | None = None
    until: float | None = None


class ObservabilityStore(Protocol):
    """Usage, traces and audit entries on a database (see the module docstring)."""

    def migrate(self) -> None: ...

    def write(
        self, usage: list[UsageRow], traces: list[TraceRow], audits: list[AuditEntry]
    ) -> None:
        """Add *usage* to the hour rows (upsert) and insert *traces* and *audits*, in one
        transaction."""
        ...

    def prune(self, banks: list[tuple[str, str]], retention: Retention) -> None:
        """Keep at most *retention*'s ``max_traces`` / ``max_audits`` newest rows of each of
        *banks* (``(tenant, bank_id)``) and drop every row older than its cut-off, in every
        bank."""
        ...

    def usage(self, tenant: str, bank_id: str, since: float) -> list[UsageRow]:
        """The bank's usage per kind since *since* (``hour_start`` = the earliest hour)."""
        ...

    def traces(
        self, tenant: str, bank_id: str, where: TraceFilter, limit: int, offset: int
    ) -> tuple[list[TraceRow], int]:
        """A page of the bank's traces, newest first, and how many match."""
        ...

    def trace_times(
        self, tenant: str, bank_id: str, where: TraceFilter
    ) -> list[tuple[float, str, int, int]]:
        """``(started_at, status, input_tokens, output_tokens)`` of every matching trace."""
        ...

    def audits(
        self, tenant: str, bank_id: str, where: AuditFilter, limit: int, offset: int
    ) -> tuple[list[AuditEntry], int]:
        """A page of the bank's audit entries, newest first, and how many match."""
        ...

    def audit(self, tenant: str, bank_id: str, log_id: str) -> AuditEntry | None:
        """One of the bank's audit entries, or ``None``."""
        ...

    def audit_times(self, tenant: str, bank_id: str, where: AuditFilter) -> list[tuple[float, str]]:
        """``(started_at, action)`` of every matching audit entry."""
        ...

    def delete_bank(self, tenant: str, bank_id: str) -> None:
        """Forget the bank's usage and traces (its audit entries stay: they are history)."""
        ...
