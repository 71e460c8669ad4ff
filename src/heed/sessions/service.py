"""Sessions: CRUD, turns with a multitask strategy, status, the session channel, wakeups.

Layers and who is the truth (see docs/run-state-contract.md):

- the **run registry** decides busy and attachable, always through
  :mod:`heed.runs.state` (``busy`` = :func:`is_lifecycle_busy`, ``active_run_id`` and
  the channel's replayed ``turn_started`` = :func:`is_attachable`);
- the **transcript** (session store) holds what was said;
- the **session channel** (broker topic ``session:<id>``) is live-only hints:
  ``turn_started``, ``session_updated``, ``task_complete``. On subscribe it
  replays ``turn_started`` only for attachable runs, never for a cancelling
  one (that replay loop is the bug this design exists to prevent).

Wakeups: when a ``task`` run owned by a session becomes terminal, a wakeup row is
written *in the same transaction* (so it is never lost), ``task_complete`` is
published, and the session is dispatched. A wakeup is delivered by admitting a
turn of source ``wakeup`` with strategy ``idle`` -- only when nothing in the
session is lifecycle-busy -- and marking the wakeup delivered inside that
admission transaction (so it is never doubled). Busy sessions get it when they
become idle: the manager's idle hook runs after every worker exit, cancel of a
queued run, reaper reclaim (a stale cancelling run) and restart recovery.

The session rules live here, not in a front end, so the HTTP API and the MCP tools keep
them alike: a session's ``bank_id`` names an existing bank of its tenant (404 ``no memory
bank ...``), and ``remember_messages`` needs a bank (400 when a session is created without
one, 409 when it is switched on for a session that has none).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Final

from heed.errors import HeedError, refuse_nul
from heed.memory import MemoryEngine
from heed.memory.models import InvalidInput, NotFound
from heed.runs.broker import LAGGED, STOPPED
from heed.runs.journal import HEARTBEAT, Heartbeat
from heed.runs.manager import AdmissionAborted, RunManager, Strategy
from heed.runs.model import Run, Source
from heed.runs.state import is_attachable, is_lifecycle_busy, is_queued, is_running
from heed.runtime import CancellationToken
from heed.sessions.store import Message, Session, SessionStore, Wakeup

__all__ = ["TASK", "TURN", "SessionNotFound", "SessionService", "session_topic"]

TURN: Final = "turn"
TASK: Final = "task"


def session_topic(session_id: str) -> str:
    """The broker topic of a session's channel."""
    return f"session:{session_id}"


#: The longest task title or action a run's summary keeps (the model chooses them).
_SUMMARY_CHARS: Final = 200


def _short(value: object) -> str | None:
    """*value* as a summary string, cut to :data:`_SUMMARY_CHARS`; ``None`` when absent."""
    return None if value is None else str(value)[:_SUMMARY_CHARS]


def stream_url(run_id: str) -> str:
    return f"/v1/runs/{run_id}/stream"


class SessionNotFound(HeedError):
    """No session with that id (for this tenant): 404."""

    status_code = 404


class SessionService:
    """See the module docstring."""

    def __init__(self, store: SessionStore, manager: RunManager, memory: MemoryEngine) -> None:
        self.store = store
        self.manager = manager
        self.memory = memory
        self.io = manager.io
        manager.add_listener(self._on_run_change)
        manager.add_idle_hook(self.deliver_wakeups)

    # -- sessions --------------------------------------------------------------------

    async def create(
        self,
        tenant: str,
        *,
        title: str = "",
        bank_id: str | None = None,
        remember_messages: bool = False,
    ) -> Session:
        """Create a session of *tenant*, bound to the bank *bank_id* if given.

        Raises :class:`~heed.memory.models.NotFound` (404) when *bank_id* names no bank of
        the tenant, then :class:`~heed.memory.models.InvalidInput` (400) for
        *remember_messages* without a bank.
        """
        if bank_id is not None:
            try:
                await self.memory.get_bank(bank_id, tenant=tenant)
            except NotFound:
                raise NotFound(f"no memory bank {bank_id!r}") from None
        if remember_messages and not bank_id:
            raise InvalidInput("remember_messages needs a bank_id to remember into")
        now = time.time()
        session = Session(
            id="ses_" + uuid.uuid4().hex[:20],
            tenant=tenant,
            title=title,
            bank_id=bank_id,
            created_at=now,
            updated_at=now,
            remember_messages=remember_messages,
        )
        return await self.io.call(self.store.create, session)

    async def get(self, session_id: str, tenant: str | None = None) -> Session:
        """The session; :class:`SessionNotFound` if unknown or another tenant's."""
        session = await self.io.call(self.store.get, session_id)
        if session is None or (tenant is not None and session.tenant != tenant):
            raise SessionNotFound(f"no session with id {session_id!r}")
        return session

    async def list_sessions(self, tenant: str, limit: int = 100) -> list[Session]:
        return await self.io.call(self.store.list_sessions, tenant, limit)

    async def update(
        self,
        session_id: str,
        tenant: str,
        *,
        title: str | None = None,
        remember_messages: bool | None = None,
    ) -> Session:
        """Rename the session and/or switch ``remember_messages``; a field left ``None``
        is left as it is. 404 if unknown; 409 to switch ``remember_messages`` on for a
        session bound to no bank."""
        current = await self.get(session_id, tenant)
        if remember_messages and current.bank_id is None:
            raise HeedError("remember_messages needs a session bound to a bank", status_code=409)
        session = await self.io.call(
            self.store.update, session_id, title=title, remember_messages=remember_messages
        )
        if session is None:
            raise SessionNotFound(f"no session with id {session_id!r}")
        await self.publish(session_id, "session_updated", await self.status(session_id))
        return session

    async def delete(self, session_id: str, tenant: str) -> None:
        """Cancel the session's runs (turns and tasks), then delete it and its transcript."""
        await self.get(session_id, tenant)
        runs = await self.io.call(
            self.manager.store.list_runs, session_id=session_id, non_terminal=True
        )
        for run in runs:  # let workers unwind (bounded) before their session disappears
            await self.manager.cancel(run.id, "session deleted", wait=True, wait_timeout=5.0)
        await self.io.call(self.store.delete, session_id)
        await self.publish(session_id, "session_deleted", {"session_id": session_id})

    async def transcript(self, session_id: str) -> list[Message]:
        return await self.io.call(self.store.messages, session_id)

    # -- turns and tasks -------------------------------------------------------------

    async def start_turn(
        self,
        session_id: str,
        tenant: str,
        content: str,
        *,
        strategy: Strategy = "reject",
        source: Source = Source.USER,
    ) -> Run:
        """Admit a turn (see :meth:`RunManager.submit`): 404 for an unknown session,
        :class:`~heed.runs.manager.RunConflict` (409) for ``reject`` on a busy one,
        :class:`~heed.runs.manager.QueueFull` (429) for ``enqueue`` on a full queue."""
        await self.get(session_id, tenant)
        refuse_nul(content, "the message")  # refused here, not by the turn's transcript write
        run = await self.manager.submit(
            TURN,
            tenant=tenant,
            session_id=session_id,
            payload={"content": content},
            summary={"chars": len(content)},
            source=source,
            strategy=strategy,
        )
        assert run is not None
        return run

    async def start_task(self, session_id: str, tenant: str, payload: dict[str, Any]) -> str:
        """Start a background ``task`` run owned by the session; returns its id."""
        run = await self.manager.submit(
            TASK,
            tenant=tenant,
            session_id=session_id,
            payload=payload,
            summary={
                "title": _short(payload.get("title")),
                "action": _short(payload.get("action")),
            },
            source=Source.API,
        )
        assert run is not None
        return run.id

    async def sessions_with_pending_wakeups(self) -> list[str]:
        """The ids of the sessions that have wakeups not yet delivered, sorted (restart
        recovery dispatches them)."""
        pending = await self.io.call(self.store.pending_wakeups)
        return sorted({w.session_id for w in pending})

    async def bank_of(self, session_id: str) -> str | None:
        session = await self.io.call(self.store.get, session_id)
        return None if session is None else session.bank_id

    def record_task_wakeup(self, run: Run) -> None:
        """In-transaction terminal hook of ``task`` runs: record the wakeup (idempotent)."""
        if run.session_id is None or self.store.get(run.session_id) is None:
            return
        summary = {
            "task_run_id": run.id,
            "phase": run.phase,
            "title": run.summary.get("title") or run.summary.get("action"),
            "result": run.result,
            "error": run.error,
        }
        self.store.add_wakeup(
            Wakeup(
                id="wk_" + uuid.uuid4().hex[:20],
                session_id=run.session_id,
                task_run_id=run.id,
                summary=summary,
                created_at=time.time(),
            )
        )

    async def deliver_wakeups(self, session_id: str) -> Run | None:
        """Deliver the session's pending wakeups as one ``wakeup`` turn, only when idle."""
        pending = await self.io.call(self.store.pending_wakeups, session_id)
        if not pending:
            return None
        session = await self.io.call(self.store.get, session_id)
        if session is None:
            return None
        ids = [w.id for w in pending]
        lines = []
        for w in pending:
            s = w.summary
            outcome = (s.get("result") or {}).get("summary") if s.get("result") else s.get("error")
            lines.append(f"- task {s.get('task_run_id')} ({s.get('title')}): {s.get('phase')}")
            if outcome:
                lines[-1] += f": {outcome}"
        content = "[wakeup] Background work finished:\n" + "\n".join(lines)

        def on_admitted(run: Run) -> None:
            if self.store.mark_delivered(ids, run.id) != len(ids):
                raise AdmissionAborted  # someone else delivered (some of) them first

        return await self.manager.submit(
            TURN,
            tenant=session.tenant,
            session_id=session_id,
            payload={"content": content, "wakeups": [w.summary for w in pending]},
            summary={"chars": len(content), "wakeups": len(pending)},
            source=Source.WAKEUP,
            strategy="idle",
            on_admitted=on_admitted,
        )

    # -- status and channel ----------------------------------------------------------

    async def status(self, session_id: str) -> dict[str, Any]:
        """Busy (lifecycle predicate) and the attachable run, for polling clients."""
        runs = await self.manager.session_runs(session_id)
        now = time.time()
        window = self.manager.unwind_window
        busy = [r for r in runs if is_lifecycle_busy(r, now, window)]
        attachable = [r for r in runs if is_attachable(r)]
        running = [r for r in attachable if is_running(r)]
        candidates = running or attachable
        active = candidates[0] if candidates else None
        pending = await self.io.call(self.store.pending_wakeups, session_id)
        return {
            "session_id": session_id,
            "busy": bool(busy),
            "busy_run_id": busy[0].id if busy else None,
            "active_run_id": active.id if active else None,
            "active_phase": active.phase if active else None,
            "stream_url": stream_url(active.id) if active else None,
            "queued": sum(1 for r in runs if is_queued(r)),
            "pending_wakeups": len(pending),
        }

    async def publish(self, session_id: str, type_: str, data: dict[str, Any]) -> None:
        self.manager.broker.publish(session_topic(session_id), {"type": type_, "data": data})

    async def _on_run_change(self, run: Run, change: str) -> None:
        if run.session_id is None:
            return
        if run.kind == TURN and change == "started":
            await self.publish(run.session_id, "turn_started", self._turn_started(run))
        if run.kind == TASK and change == "finished":
            await self.publish(
                run.session_id,
                "task_complete",
                {
                    "task_run_id": run.id,
                    "phase": run.phase,
                    "result": run.result,
                    "error": run.error,
                },
            )
            await self.manager.dispatch(run.session_id)
        if run.kind == TURN or change == "finished":
            status = await self.status(run.session_id)
            await self.publish(run.session_id, "session_updated", {**status, "run_id": run.id})

    @staticmethod
    def _turn_started(run: Run) -> dict[str, Any]:
        return {
            "run_id": run.id,
            "source": run.source,
            "phase": run.phase,
            "stream_url": stream_url(run.id),
            "replayed": False,
        }

    async def follow_channel(
        self,
        session_id: str,
        *,
        heartbeat: float = 10.0,
        token: CancellationToken | None = None,
        shutdown: CancellationToken | None = None,
    ) -> AsyncIterator[dict[str, Any] | Heartbeat]:
        """The session channel: replay (``turn_started`` for attachable runs only, then a
        ``session_updated`` snapshot), then live events; heartbeats when idle. Ends after
        ``session_deleted``, or at once when *token* is cancelled (the client left). When
        *shutdown* is cancelled (the server drains) it ends with a last ``shutdown`` event,
        so a client knows to reconnect rather than treat the silence as an error."""
        sub = self.manager.broker.subscribe(session_topic(session_id))
        handles = [t.on_cancel(lambda _reason: sub.stop()) for t in (token, shutdown) if t]
        try:
            await sub.ready()  # other processes' hints reach us before we replay
            for run in await self.manager.session_runs(session_id):
                if is_attachable(run):
                    yield {
                        "type": "turn_started",
                        "data": {**self._turn_started(run), "replayed": True},
                    }
            yield {"type": "session_updated", "data": await self.status(session_id)}
            while True:
                message = await sub.get(heartbeat)
                if message is STOPPED:
                    if (
                        shutdown is not None
                        and shutdown.cancelled
                        and not (token and token.cancelled)
                    ):
                        yield {"type": "shutdown", "data": {"reason": shutdown.reason}}
                    return
                if message is None:
                    yield HEARTBEAT
                elif message is LAGGED:
                    yield {"type": "session_updated", "data": await self.status(session_id)}
                elif isinstance(message, dict):
                    yield message
                    if message.get("type") == "session_deleted":
                        return
        finally:
            for handle in handles:
                handle.remove()
            sub.close()
