"""Observability: every LLM call's usage and trace, and audit entries, kept per bank.

:class:`Observability` is an LLM call sink (:func:`heed.llm.usage.add_call_sink`, added by
:meth:`Observability.start`): each call of a bank adds its tokens to the bank's hour row
of its kind of work and makes one trace row (:mod:`heed.observability.content` says what
of its text). Audit entries come from the HTTP edge and from runs' ends
(:meth:`record_audit`). Nothing is written on the calling path: rows are buffered (at most
:data:`MAX_BUFFERED` traces and audit entries; more are dropped and counted in
``dropped``) and written in one transaction every ``flush_seconds`` by a background task,
and before every read, so a process reads its own calls at once. A call without a bank
(a chat turn of a session bound to none) is counted in the metrics only.

**Bounds.** After each write, each bank written keeps its ``max_traces`` newest traces and
``max_audits`` newest audit entries; once a minute, rows older than their maximum age go
(usage hour rows after :data:`USAGE_DAYS` days). A crash loses at most the buffered rows.

Reads (the API's): :meth:`usage`, :meth:`traces`, :meth:`trace_stats`, :meth:`audits`,
:meth:`audit`, :meth:`audit_stats`; each is tenant-scoped by its caller's bank check.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Final

from heed.llm.usage import LlmCall, add_call_sink, remove_call_sink
from heed.observability.content import input_of, output_of
from heed.observability.periods import period_of
from heed.observability.records import (
    AuditEntry,
    AuditFilter,
    ObservabilityStore,
    Retention,
    TraceFilter,
    TraceRow,
    UsageRow,
)
from heed.runtime import reraise_cancellation, run_blocking, run_in_thread, settle

__all__ = ["MAX_BUFFERED", "USAGE_DAYS", "Limits", "Observability", "operation_of"]

log = logging.getLogger("heed.observability")

MAX_BUFFERED: Final = 10_000
USAGE_DAYS: Final = 90
_PRUNE_EVERY: Final = 60.0

_OPERATIONS: Final = {
    "extraction": "retain",
    "consolidation": "consolidation",
    "reflect": "reflect",
    "turn": "turn",
    "mental_model_refresh": "mental_model_refresh",
}


def operation_of(kind: str) -> str:
    """A kind of LLM work in Hindsight's operation words (extraction is part of ``retain``)."""
    return _OPERATIONS.get(kind, kind)


@dataclass(frozen=True, slots=True)
class Limits:
    """What is kept: text or not, and the bounds (see the module docstring)."""

    keep_content: bool = False
    max_traces: int = 1000
    trace_max_age_days: float = 30.0
    max_audits: int = 10_000
    audit_max_age_days: float = 90.0
    flush_seconds: float = 1.0


class Observability:
    """See the module docstring. *io* runs the store's writes; *secrets* are masked in
    kept text."""

    def __init__(
        self,
        store: ObservabilityStore,
        io: Executor,
        limits: Limits | None = None,
        secrets: Iterable[str] = (),
    ) -> None:
        self.store = store
        self.io = io
        self.limits = limits or Limits()
        self.secrets = tuple(s for s in secrets if s)
        self.dropped = 0
        self._lock = threading.Lock()
        self._usage: dict[tuple[str, str, str, int], list[int]] = {}
        #: The usage a flush is writing (still counted by :meth:`spent` until it committed).
        self._flushing: dict[tuple[str, str, str, int], list[int]] = {}
        self._traces: list[TraceRow] = []
        self._audits: list[AuditEntry] = []
        self._write_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._pruned_at = 0.0

    # -- what comes in ---------------------------------------------------------------

    def on_call(self, call: LlmCall) -> None:
        """The LLM call sink: buffer *call*'s usage and trace (a call of no bank: nothing)."""
        if not call.bank_id or not call.tenant:
            return
        keep = self.limits.keep_content
        trace = TraceRow(
            id=call.id,
            tenant=call.tenant,
            bank_id=call.bank_id,
            operation=operation_of(call.kind),
            scope=call.kind,
            trace_id=call.trace_id,
            provider=call.provider,
            model=call.model,
            status=call.status,
            started_at=call.started_at,
            ended_at=call.ended_at,
            duration_ms=call.duration_ms,
            input_tokens=call.prompt_tokens,
            output_tokens=call.completion_tokens,
            input=input_of(call.messages, keep=keep, secrets=self.secrets),
            output=output_of(
                call.reply, call.tool_calls, call.finish_reason, keep=keep, secrets=self.secrets
            ),
            error=call.error,
            metadata={"usage_reported": call.usage_reported, "content_kept": keep},
        )
        hour = int(call.started_at // 3600 * 3600)
        with self._lock:
            counts = self._usage.setdefault((call.tenant, call.bank_id, call.kind, hour), [0, 0, 0])
            counts[0] += 1
            counts[1] += call.prompt_tokens
            counts[2] += call.completion_tokens
            if len(self._traces) >= MAX_BUFFERED:
                self.dropped += 1
                return
            self._traces.append(trace)

    def record_audit(
        self,
        *,
        tenant: str,
        bank_id: str | None,
        action: str,
        transport: str,
        started_at: float,
        ended_at: float | None,
        principal: str | None,
        request: dict[str, Any] | None = None,
        response: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        """Buffer one audit entry (thread-safe; the run manager's hooks call it off the loop)."""
        duration = None if ended_at is None else max(0, round((ended_at - started_at) * 1000))
        entry = AuditEntry(
            id=uuid.uuid4().hex,
            tenant=tenant,
            bank_id=bank_id,
            action=action,
            transport=transport,
            started_at=started_at,
            ended_at=ended_at,
            duration_ms=duration,
            principal=principal,
            request=request,
            response=response,
            metadata=metadata or {},
        )
        with self._lock:
            if len(self._audits) >= MAX_BUFFERED:
                self.dropped += 1
                return
            self._audits.append(entry)

    # -- writing ---------------------------------------------------------------------

    def start(self) -> None:
        """Take every LLM call from now on and write the buffers every ``flush_seconds``."""
        add_call_sink(self.on_call)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._loop(), name="observability-flush"
            )

    async def close(self) -> None:
        """Stop taking calls, stop the loop and write what is buffered."""
        remove_call_sink(self.on_call)
        if self._task is not None:
            await settle(self._task)
            self._task = None
        await self._flush_or_log("could not write the last usage, traces and audit entries")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.limits.flush_seconds)
            await self._flush_or_log("could not write usage, traces and audit entries; retrying")

    async def _flush_or_log(self, failure: str) -> None:
        """:meth:`flush`; an error is logged as *failure* (cancellation propagates)."""
        try:
            await self.flush()
        except Exception as exc:
            reraise_cancellation(exc)
            log.exception(failure)

    async def flush(self) -> None:
        """Write what is buffered (one transaction), then keep each bank written in bounds."""
        async with self._write_lock:
            with self._lock:
                usage, self._usage = self._usage, {}
                self._flushing = usage
                traces, self._traces = self._traces, []
                audits, self._audits = self._audits, []
            if not (usage or traces or audits):
                return
            rows = [
                UsageRow(tenant, bank, kind, hour, c[0], c[1], c[2])
                for (tenant, bank, kind, hour), c in usage.items()
            ]
            try:
                await run_blocking(self.io, self.store.write, rows, traces, audits)
            except Exception as exc:
                reraise_cancellation(exc)
                with self._lock:  # put them back: the next flush tries again
                    self._flushing = {}
                    for row in rows:
                        key = (row.tenant, row.bank_id, row.kind, row.hour_start)
                        counts = self._usage.setdefault(key, [0, 0, 0])
                        counts[0] += row.calls
                        counts[1] += row.prompt_tokens
                        counts[2] += row.completion_tokens
                    self._traces[:0] = traces
                    self._audits[:0] = audits
                raise
            with self._lock:
                self._flushing = {}
            banks = sorted(
                {(t.tenant, t.bank_id) for t in traces}
                | {(a.tenant, a.bank_id) for a in audits if a.bank_id is not None}
            )
            await self._prune(banks)

    async def _prune(self, banks: list[tuple[str, str]]) -> None:
        now = time.time()
        every = now - self._pruned_at >= _PRUNE_EVERY
        if not banks and not every:
            return
        if every:
            self._pruned_at = now
        day = 86_400.0
        limits = self.limits
        retention = Retention(
            max_traces=limits.max_traces,
            max_audits=limits.max_audits,
            traces_before=now - limits.trace_max_age_days * day if every else 0.0,
            audits_before=now - limits.audit_max_age_days * day if every else 0.0,
            usage_before=now - USAGE_DAYS * day if every else 0.0,
        )
        await run_blocking(self.io, self.store.prune, banks, retention)

    async def forget_bank(self, tenant: str, bank_id: str) -> None:
        """Drop the bank's usage and traces (buffered and written) once it is deleted."""
        with self._lock:
            self._usage = {k: v for k, v in self._usage.items() if k[:2] != (tenant, bank_id)}
            self._traces = [t for t in self._traces if (t.tenant, t.bank_id) != (tenant, bank_id)]
        await run_blocking(self.io, self.store.delete_bank, tenant, bank_id)

    # -- reading ---------------------------------------------------------------------

    async def usage(self, tenant: str, bank_id: str, now: float | None = None) -> dict[str, Any]:
        """The bank's LLM tokens by kind of work: ``by_kind`` over the kept hours
        (:data:`USAGE_DAYS` days), ``last_hour`` and ``last_24h`` totals."""
        await self.flush()
        now = time.time() if now is None else now
        rows = await run_in_thread(self.store.usage, tenant, bank_id, now - USAGE_DAYS * 86_400)
        hour = now // 3600 * 3600

        def total(since: float) -> dict[str, int]:
            kept = [r for r in rows if r.hour_start >= since]
            prompt = sum(r.prompt_tokens for r in kept)
            completion = sum(r.completion_tokens for r in kept)
            return {
                "calls": sum(r.calls for r in kept),
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            }

        by_kind: dict[str, dict[str, int]] = {}
        for row in rows:
            counts = by_kind.setdefault(
                row.kind,
                {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            )
            counts["calls"] += row.calls
            counts["prompt_tokens"] += row.prompt_tokens
            counts["completion_tokens"] += row.completion_tokens
            counts["total_tokens"] += row.prompt_tokens + row.completion_tokens
        return {
            "by_kind": dict(sorted(by_kind.items())),
            "total": total(0),
            "last_hour": total(hour),
            "last_24h": total(hour - 23 * 3600),
        }

    async def spent(self, tenant: str, bank_id: str, kinds: Sequence[str], since: float) -> int:
        """The tokens the bank's calls of *kinds* spent in the hours from *since* (epoch
        seconds, an hour's start): what is written (every instance's) plus what this process
        has not written yet (a budget's reading, :mod:`heed.llm.budget`; a moment may count
        a flushed hour twice, never none)."""
        hour = int(since // 3600 * 3600)
        with self._lock:
            buffered = sum(
                c[1] + c[2]
                for buffer in (self._usage, self._flushing)
                for (t, b, kind, start), c in buffer.items()
                if t == tenant and b == bank_id and kind in kinds and start >= hour
            )
        rows = await run_in_thread(self.store.usage, tenant, bank_id, hour)
        written = sum(r.prompt_tokens + r.completion_tokens for r in rows if r.kind in kinds)
        return buffered + written

    async def traces(
        self, tenant: str, bank_id: str, where: TraceFilter, limit: int, offset: int
    ) -> tuple[list[TraceRow], int]:
        """A page of the bank's traces, newest first, and how many match."""
        await self.flush()
        return await run_in_thread(self.store.traces, tenant, bank_id, where, limit, offset)

    async def trace_groups(
        self, tenant: str, bank_id: str, where: TraceFilter, limit: int, offset: int
    ) -> tuple[list[TraceRow], int]:
        """A page of the bank's runs (calls sharing a ``trace_id``; a call outside a run is
        a group of its own), newest first by their newest call: every call of the runs on
        the page, newest first, and how many runs match."""
        await self.flush()
        everything = max(self.limits.max_traces, 1) * 4  # a bank keeps about max_traces
        rows, _ = await run_in_thread(self.store.traces, tenant, bank_id, where, everything, 0)
        groups: dict[str, list[TraceRow]] = {}
        for row in rows:  # newest first, so groups are in order of their newest call
            groups.setdefault(row.trace_id or f"call:{row.id}", []).append(row)
        page = list(groups.values())[offset : offset + limit]
        return [row for group in page for row in group], len(groups)

    async def trace_stats(
        self, tenant: str, bank_id: str, where: TraceFilter, period: str | None
    ) -> dict[str, Any]:
        """Calls by status and token sums per time bucket of *period* (Hindsight's shape)."""
        await self.flush()
        span = period_of(period, time.time())
        where = TraceFilter(
            status=where.status,
            operation=where.operation,
            scope=where.scope,
            provider=where.provider,
            since=span.start.timestamp(),
        )
        rows = await run_in_thread(self.store.trace_times, tenant, bank_id, where)
        buckets: dict[str, dict[str, Any]] = {}
        for started, status, tokens_in, tokens_out in sorted(rows):
            bucket = buckets.setdefault(
                span.bucket(started),
                {
                    "statuses": {},
                    "total": 0,
                    "tokens": {"input": 0, "output": 0, "cached": 0, "total": 0},
                },
            )
            bucket["statuses"][status] = bucket["statuses"].get(status, 0) + 1
            bucket["total"] += 1
            bucket["tokens"]["input"] += tokens_in
            bucket["tokens"]["output"] += tokens_out
            bucket["tokens"]["total"] += tokens_in + tokens_out
        return {
            "period": span.name,
            "trunc": span.trunc,
            "start": span.start.isoformat(),
            "buckets": [{"time": key, **value} for key, value in buckets.items()],
        }

    async def audits(
        self, tenant: str, bank_id: str, where: AuditFilter, limit: int, offset: int
    ) -> tuple[list[AuditEntry], int]:
        """A page of the bank's audit entries, newest first, and how many match."""
        await self.flush()
        return await run_in_thread(self.store.audits, tenant, bank_id, where, limit, offset)

    async def audit(self, tenant: str, bank_id: str, log_id: str) -> AuditEntry | None:
        """One of the bank's audit entries, or ``None``."""
        await self.flush()
        return await run_in_thread(self.store.audit, tenant, bank_id, log_id)

    async def audit_stats(
        self, tenant: str, bank_id: str, action: str | None, period: str | None
    ) -> dict[str, Any]:
        """Audit entries by action per time bucket of *period* (Hindsight's shape)."""
        await self.flush()
        span = period_of(period, time.time())
        where = AuditFilter(action=action, since=span.start.timestamp())
        rows = await run_in_thread(self.store.audit_times, tenant, bank_id, where)
        buckets: dict[str, dict[str, Any]] = {}
        for started, name in sorted(rows):
            bucket = buckets.setdefault(span.bucket(started), {"actions": {}, "total": 0})
            bucket["actions"][name] = bucket["actions"].get(name, 0) + 1
            bucket["total"] += 1
        return {
            "period": span.name,
            "trunc": span.trunc,
            "start": span.start.isoformat(),
            "buckets": [{"time": key, **value} for key, value in buckets.items()],
        }
