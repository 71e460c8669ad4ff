"""Async retain operations, built as runs of kind ``"retain"`` on :mod:`heed.runs`; a
bank's operations also list its consolidation runs and its mental models' refreshes
(:data:`heed.memory.bank_runs.OPERATION_KINDS`).

``POST .../memories`` with ``async: true`` submits a run whose payload holds
the validated items (read by its worker alone; listings see its summary: the item
count and the keys a retry is matched by); the run manager starts it (its token
is the run's, never the HTTP request's), and the executor calls
:meth:`MemoryEngine.retain` with a progress callback that records progress in the
run's journal.

Runs are grouped per bank with ``session_id = "bank:<ref>"`` (non-exclusive:
operations of one bank run side by side, bounded by the retain lane). Phases
map onto Hindsight's operation statuses in the API layer (see
:func:`heed.memory.bank_runs.status_of`). Cancelling a running operation moves it to
``cancelling`` and then ``cancelled`` once its worker stopped; a document is
written whole or not at all, so a cancelled operation leaves no partial
document. Deleting a bank cancels its queued and running operations first.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Final

from heed.errors import HeedError
from heed.memory.bank_runs import (
    OPERATION_KINDS,
    RETAIN_KIND,
    BankRunService,
    bank_payload,
    bank_run,
    bank_session,
    status_of_phase,
)
from heed.memory.models import Bank, EntityRef, NotFound, RetainItem
from heed.memory.retain.idempotency import check_fingerprint, retain_key
from heed.runs.events import EventType
from heed.runs.kinds import KindSpec, RunContext
from heed.runs.manager import RunNotFound
from heed.runs.model import Run
from heed.runs.state import is_terminal
from heed.runtime import run_in_thread

__all__ = ["Progress", "RetainOperations"]


@dataclass(frozen=True, slots=True)
class Progress:
    """A run's last progress event, in the terms of Hindsight's ``OperationProgress``: the
    stage it names (``None``: the kind's only one), work done and in all when the run knows
    them (a consolidation takes what is pending round by round: no total), and its other
    counters (``detail``); ``at`` is the event's time (epoch seconds)."""

    stage: str | None
    processed: int | None
    total: int | None
    detail: dict[str, int]
    at: float


_PROGRESS_KEYS: Final = frozenset({"stage", "processed", "total"})


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def progress_of(data: Mapping[str, Any], at: float) -> Progress:
    """A progress event's data as a :class:`Progress`; every field is optional (each kind
    of run reports what it knows), and only integer counters go to ``detail``."""
    stage = data.get("stage")
    return Progress(
        stage=stage if isinstance(stage, str) and stage else None,
        processed=_count(data.get("processed")),
        total=_count(data.get("total")),
        detail={
            key: value
            for key, value in data.items()
            if key not in _PROGRESS_KEYS and _count(value) is not None
        },
        at=at,
    )


def _item_payload(item: RetainItem) -> dict[str, Any]:
    return {
        "content": item.content,
        "timestamp": item.timestamp.isoformat() if item.timestamp else None,
        "timestamp_unset": item.timestamp_unset,
        "context": item.context,
        "metadata": item.metadata,
        "document_id": item.document_id,
        "tags": item.tags,
        "entities": [{"name": e.name, "type": e.type} for e in item.entities],
        "update_mode": item.update_mode,
        "fact_type": item.fact_type,
    }


def _item_of(data: dict[str, Any]) -> RetainItem:
    return RetainItem(
        content=data["content"],
        timestamp=datetime.fromisoformat(data["timestamp"]) if data.get("timestamp") else None,
        timestamp_unset=bool(data.get("timestamp_unset")),
        context=data.get("context"),
        metadata=dict(data.get("metadata") or {}),
        document_id=data.get("document_id"),
        tags=list(data.get("tags") or []),
        entities=[EntityRef(e["name"], e.get("type")) for e in data.get("entities") or []],
        update_mode=data.get("update_mode") or "replace",
        fact_type=data.get("fact_type") or "world",
    )


@dataclass(eq=False)
class RetainOperations(BankRunService):
    """Submit, list, read and cancel a bank's async retains (see the module docstring)."""

    KINDS: ClassVar[tuple[str, ...]] = (RETAIN_KIND,)

    def kind_spec(self) -> KindSpec:
        """How ``retain`` runs execute: register it as :data:`RETAIN_KIND`."""
        return KindSpec(execute=self._execute)

    async def submit(
        self,
        bank: Bank,
        items: list[RetainItem],
        document_tags: list[str],
        client_operation_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> Run:
        """Queue a retain of *items* into *bank*; returns the run (its id is the operation id).

        A *client_operation_id* makes retries idempotent: a second submit with the
        same id for the same bank returns the first run instead of queueing again.
        An *idempotency_key* does too, and refuses (``IdempotencyConflict``) a second
        submit with a different body; the operation then retains under the key, so a
        re-run after a restart skips what the first run wrote.
        """
        self.engine.validate_items(items, document_tags)
        key = (
            await run_in_thread(retain_key, idempotency_key, items, document_tags)
            if idempotency_key
            else None
        )
        if client_operation_id:
            existing = await self._keyed(bank, "client_operation_id", client_operation_id)
            if existing is not None:
                return existing
        if key is not None:
            existing = await self._keyed(bank, "idempotency_key", key.key)
            if existing is not None:
                check_fingerprint(key, existing.summary.get("fingerprint"))
                return existing
        summary = {
            "bank_id": bank.bank_id,
            "items_count": len(items),
            "client_operation_id": client_operation_id,
            "idempotency_key": idempotency_key,
            "fingerprint": key.fingerprint if key is not None else None,
        }
        run = await self.manager.submit(
            RETAIN_KIND,
            tenant=bank.tenant,
            session_id=bank_session(bank),
            payload={
                **bank_payload(bank),
                "items": [_item_payload(i) for i in items],
                "document_tags": document_tags,
                **summary,
            },
            summary=summary,
        )
        assert run is not None
        return run

    async def _keyed(self, bank: Bank, field: str, value: str) -> Run | None:
        """The bank's newest operation whose summary names *value* as its *field*."""
        runs = await self.manager.io.call(
            lambda: self.manager.store.list_runs(
                tenant=bank.tenant,
                session_id=bank_session(bank),
                kind=RETAIN_KIND,
                summary_equals={field: value},
                newest_first=True,
                limit=1,
            )
        )
        return runs[0] if runs else None

    async def _execute(self, rc: RunContext) -> dict[str, Any]:
        payload = rc.payload
        items = [_item_of(d) for d in payload["items"]]
        loop = asyncio.get_running_loop()
        pending: list[asyncio.Future[Any]] = []

        def progress(done: int, total: int) -> None:
            pending.append(
                asyncio.ensure_future(
                    rc.emit(EventType.PROGRESS, {"processed": done, "total": total}), loop=loop
                )
            )

        try:
            async with bank_run(self.engine, rc) as bank:
                summary = await self.engine.retain(
                    bank,
                    items,
                    payload.get("document_tags") or [],
                    progress=progress,
                    idempotency_key=payload.get("idempotency_key"),
                    background=True,  # nobody waits on an operation's model calls
                )
        finally:
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        return {
            "items_count": summary.items,
            "documents": summary.documents,
            "units": summary.units,
            "document_ids": summary.document_ids,
            **({"extraction": summary.extraction.report()} if summary.extraction else {}),
        }

    async def _by_phase(self, bank: Bank) -> dict[str, int]:
        """How many operations the bank has per stored phase (counted by the store)."""
        counts: dict[str, int] = {}
        for kind in OPERATION_KINDS:
            by_phase = await self.manager.io.call(
                functools.partial(
                    self.manager.store.count_runs,
                    tenant=bank.tenant,
                    session_id=bank_session(bank),
                    kind=kind,
                )
            )
            for phase, n in by_phase.items():
                counts[phase] = counts.get(phase, 0) + n
        return counts

    async def counts(self, bank: Bank) -> dict[str, int]:
        """How many operations the bank has, per Hindsight status."""
        by_phase = await self._by_phase(bank)
        counts: dict[str, int] = {}
        for phase, n in by_phase.items():
            status = status_of_phase(phase)
            counts[status] = counts.get(status, 0) + n
        return counts

    async def list(
        self, bank: Bank, status: str | None = None, *, offset: int = 0, limit: int = 100
    ) -> tuple[int, list[Run]]:
        """``(total, page)``: how many operations the bank has (of one Hindsight status, when
        given), and those from *offset*, at most *limit*, newest first (no payloads). The
        page merges the kinds' newest ``offset + limit`` each (bounded by the page)."""
        by_phase = await self._by_phase(bank)
        # The stored phase strings that have this status (unknown ones count as failed).
        phases = [p for p in by_phase if status is None or status_of_phase(p) == status]
        total = sum(by_phase[p] for p in phases)
        if total == 0 or offset >= total:
            return total, []
        runs: list[Run] = []
        for kind in OPERATION_KINDS:
            runs.extend(
                await self.manager.io.call(
                    functools.partial(
                        self.manager.store.list_runs,
                        tenant=bank.tenant,
                        session_id=bank_session(bank),
                        kind=kind,
                        phases=None if status is None else phases,
                        newest_first=True,
                        limit=offset + limit,
                    )
                )
            )
        runs.sort(key=lambda r: (r.created_at, r.id), reverse=True)
        return total, runs[offset : offset + limit]

    async def get(self, bank: Bank, operation_id: str) -> Run:
        """The operation; :class:`NotFound` when it is not this bank's."""
        try:
            run = await self.manager.get(operation_id, tenant=bank.tenant)
        except RunNotFound:
            raise NotFound(f"operation {operation_id!r} not found") from None
        if run.session_id != bank_session(bank) or run.kind not in OPERATION_KINDS:
            raise NotFound(f"operation {operation_id!r} not found")
        return run

    async def progress(self, run: Run) -> Progress | None:
        """The run's last progress event, if its journal still holds one."""
        event = await self.manager.io.call(
            self.manager.store.last_event, run.id, EventType.PROGRESS.value
        )
        return progress_of(event.data, event.ts) if event is not None else None

    async def cancel(self, bank: Bank, operation_id: str) -> Run:
        """Cancel an operation (idempotent; terminal ones are returned unchanged)."""
        await self.get(bank, operation_id)
        return await self.manager.cancel(operation_id, "cancelled by client", tenant=bank.tenant)

    async def retry(self, bank: Bank, operation_id: str) -> Run:
        """Submit a new run of a failed or cancelled retain operation, with its payload
        (Hindsight re-queues the same id; heed's runs are immutable once ended, so the
        retry is a new operation, returned). A retry of a keyed retain
        (``idempotency_key``) skips what the first run wrote. 409 (:class:`HeedError`)
        for an operation still pending or running, a completed one, or another kind than
        a retain (a consolidation or refresh is started anew by its own route)."""
        run = await self.get(bank, operation_id)
        status = status_of_phase(run.phase)
        if status not in ("failed", "cancelled"):
            raise HeedError(
                f"operation {operation_id!r} is {status}: only a failed or cancelled "
                "operation can be retried",
                status_code=409,
            )
        if run.kind != RETAIN_KIND:
            raise HeedError(
                f"operation {operation_id!r} is a {run.kind}: heed retries retain operations "
                "only; start it anew with its own route",
                status_code=409,
            )
        payload = await self.manager.io.call(self.manager.store.payload, run.id)
        if not payload or payload.get("bank_ref") != bank.ref:
            raise HeedError(f"operation {operation_id!r} kept no input to retry", status_code=409)
        retried = await self.manager.submit(
            RETAIN_KIND,
            tenant=bank.tenant,
            session_id=bank_session(bank),
            payload=payload,
            summary={**run.summary, "retry_of": run.id},
        )
        assert retried is not None
        return retried

    async def delete(self, bank: Bank, operation_id: str) -> Run:
        """Remove a finished (completed, failed or cancelled) operation's record, its
        journal and its payload; returns the run as it was. 409 (:class:`HeedError`) for
        one still pending or running (cancel it first)."""
        run = await self.get(bank, operation_id)
        terminal = is_terminal(run)
        if terminal:
            terminal = await self.manager.io.call(self.manager.store.delete_terminal, run.id)
        if not terminal:
            raise HeedError(
                f"operation {operation_id!r} is {status_of_phase(run.phase)}: only a "
                "finished operation can be deleted (cancel it first)",
                status_code=409,
            )
        return run
