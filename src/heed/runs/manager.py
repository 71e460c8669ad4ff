"""The run manager: admission, start, cancel, worker lifecycle and leases.

One :class:`RunManager` per server process. The database is the source of
truth; the manager only holds the in-process workers (task + token) and the
fan-out. Promises:

- **submit** (:meth:`RunManager.submit`) creates a ``queued`` run. For an
  *exclusive* kind (chat turns) admission is one write transaction that reads
  the session's runs and applies :func:`~heed.runs.state.is_lifecycle_busy`, so
  two concurrent starts -- in this process or another sharing the database --
  never both pass: ``reject`` raises :class:`RunConflict` naming the busy run;
  ``enqueue`` queues, at most ``max_queued_per_session`` runs per session
  (:class:`QueueFull`, 429, past it; counted in the same transaction);
  ``interrupt`` queues and cancels the busy runs. A queued
  run starts (``claim``, again one transaction) only when no older sibling is
  lifecycle-busy. A run's ``payload`` is stored apart from its row and read only
  by the worker that executes it; everything else sees its ``summary``.
- **cancel** (:meth:`RunManager.cancel`) is idempotent and returns the run.
  ``queued`` becomes ``cancelled`` (it never starts); ``running`` becomes
  ``cancelling`` with a terminal ``cancelled`` journal event appended in the
  same transaction, and the worker's token is cancelled at once; when the worker
  exits the run becomes ``cancelled``. Terminal runs are returned unchanged.
  ``wait=True`` waits (bounded) until the worker has stopped.
- **workers** run each run's :class:`~heed.runs.kinds.KindSpec` executor under a
  fresh token (never the HTTP request's). The worker's exit is written with
  guarded transitions (``completed``/``failed`` only from ``running``;
  ``cancelled`` from ``cancelling``), so a cancel that raced a completion wins
  and terminal phases never change.
- **the cancel watch** (``cancel_watch_interval`` > 0; for a broker that carries no
  hints between processes: SQLite with no Redis): while this process has workers, one
  query every ``cancel_watch_interval`` seconds asks which of their runs another process
  put in ``cancelling`` and cancels their tokens, so a cancel written by ``heed serve``
  stops a worker of ``heed mcp`` on the same data dir within that interval, not at the
  next lease renewal. With no worker it does not run.
- **leases**: the reaper (:mod:`heed.runs.reaper`) renews the lease of every run
  whose worker task exists in this process, whatever the task is doing. When a
  worker dies (its lease expires, its process is gone), the reaper or restart
  recovery ends its run ``interrupted``, or, for a kind with ``max_attempts``,
  requeues it (then :meth:`RunManager.start` starts it again) or quarantines it.

Other components subscribe with :meth:`RunManager.add_listener` (told after
every committed phase change) and :meth:`RunManager.add_idle_hook` (told when a
session has nothing busy and nothing queued, e.g. to deliver wakeups).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import KW_ONLY, InitVar, dataclass, field
from functools import partial
from typing import Any, Literal

from heed.errors import HeedError
from heed.runs.broker import STOPPED, Broker
from heed.runs.ending import (
    SHUTDOWN,
    as_cancelled,
    as_completed,
    as_failed,
    as_interrupted,
    end_run,
)
from heed.runs.events import EventType
from heed.runs.io import BlockingIO
from heed.runs.journal import Journal
from heed.runs.kinds import KindSpec, RunContext, TerminalHook
from heed.runs.model import Phase, Run, Source, new_run_id, summary_json
from heed.runs.spans import TRACE_LINK_KEY, run_span
from heed.runs.state import (
    DEFAULT_UNWIND_WINDOW,
    is_lifecycle_busy,
    is_queued,
    is_running,
    is_terminal,
)
from heed.runs.store import RunStore
from heed.runtime import (
    CancellationToken,
    LaneFull,
    Lanes,
    OperationCancelled,
    RequestContext,
    reraise_cancellation,
    tallying,
    use_context,
)
from heed.runtime.tracing import link_carrier, link_from

__all__ = [
    "AdmissionAborted",
    "QueueFull",
    "RunConflict",
    "RunManager",
    "RunNotFound",
    "Strategy",
    "make_worker_id",
]

log = logging.getLogger("heed.runs")

Strategy = Literal["reject", "enqueue", "interrupt", "idle"]
Listener = Callable[[Run, str], Awaitable[None]]
IdleHook = Callable[[str], Awaitable[object]]

#: Broker topic on which a cancel written by any process is announced to the others.
CANCEL_TOPIC = "runs:cancel"


class RunNotFound(HeedError):
    """No run with that id (for this tenant): 404."""

    status_code = 404


class RunConflict(HeedError):
    """A session is busy and the strategy was ``reject``: 409 naming the busy run."""

    status_code = 409

    def __init__(self, busy: Run, retry_after: int = 1) -> None:
        super().__init__(
            f"session {busy.session_id} is busy with run {busy.id} ({busy.phase}); "
            "retry later or use multitask_strategy enqueue or interrupt",
            headers={"Retry-After": str(retry_after)},
        )
        self.busy = busy


class QueueFull(HeedError):
    """A session already holds as many queued turns as it may: 429 naming the limit."""

    status_code = 429

    def __init__(self, session_id: str, queued: int, limit: int, retry_after: int = 5) -> None:
        super().__init__(
            f"session {session_id} already has {queued} queued turns, the most a session may "
            f"hold (HEED_MAX_QUEUED_TURNS_PER_SESSION={limit}); wait until some have run, or "
            "cancel some",
            headers={"Retry-After": str(retry_after)},
        )
        self.limit = limit


class AdmissionAborted(Exception):
    """Raised by an ``on_admitted`` callback to roll the admission back."""


def make_worker_id() -> str:
    """``host:pid:nonce`` -- unique per process incarnation."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass
class _Worker:
    run_id: str
    token: CancellationToken
    done: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


@dataclass(eq=False, repr=False)
class RunManager:
    """See the module docstring."""

    store: RunStore
    broker: Broker
    _: KW_ONLY
    lanes: Lanes | None = None
    unwind_window: float = DEFAULT_UNWIND_WINDOW
    lease_seconds: float = 15.0
    reaper_interval: float = 2.0
    #: The journal's poll and watch intervals (:class:`~heed.runs.journal.Journal`).
    poll_interval: InitVar[float] = 20.0
    watch_interval: InitVar[float] = 0.0
    #: Seconds between the cancel watch's queries (0: no watch; see the module docstring).
    cancel_watch_interval: float = 0.0
    #: Seconds after which a finished run's journal keeps only its terminal event (0: keep).
    journal_retention: float = 0.0
    #: Queued runs of exclusive kinds one session may hold (``enqueue`` past it: 429).
    max_queued_per_session: int = 32
    #: Seconds between the reaper's sweeps for queued runs nobody started (a safety net:
    #: every path that frees a session dispatches it at once).
    queue_sweep_interval: float = 30.0
    io: BlockingIO = field(default_factory=BlockingIO)

    def __post_init__(self, poll_interval: float, watch_interval: float) -> None:
        self._cancel_watch: asyncio.Task[None] | None = None
        self.read_io = BlockingIO(4, name="heed-runs-read")
        self.journal = Journal(
            self.store,
            self.broker,
            self.io,
            poll_interval=poll_interval,
            watch_interval=watch_interval,
            read_io=self.read_io,
        )
        self.worker_id = make_worker_id()
        #: In-transaction hooks for a run of any kind becoming terminal, after its kind's
        #: ``on_terminal`` (:func:`heed.runs.ending.end_run`): webhooks write their outbox.
        self.terminal_hooks: list[TerminalHook] = []
        self.kinds: dict[str, KindSpec] = {}
        self.workers: dict[str, _Worker] = {}
        self._listeners: list[Listener] = []
        self._idle_hooks: list[IdleHook] = []
        self._session_locks: dict[str, asyncio.Lock] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._closing = False
        self._stopped = False
        self._io_closed = False
        #: Counters and gauges read by the metrics collector.
        self.reclaimed_total = 0
        self.interrupted_total = 0
        #: Runs put back in the queue after their worker died, and runs quarantined
        #: (their worker died ``max_attempts`` times): see :mod:`heed.runs.reaper`. In all,
        #: and by kind (only registered kinds with ``max_attempts`` are ever requeued).
        self.requeued_total = 0
        self.quarantined_total = 0
        self.requeued_by_kind: Counter[str] = Counter()
        self.quarantined_by_kind: Counter[str] = Counter()
        self.wedged = 0

    # -- wiring ----------------------------------------------------------------------

    def register(self, kind: str, spec: KindSpec) -> None:
        """Declare how runs of *kind* execute (see :mod:`heed.runs.kinds`)."""
        self.kinds[kind] = spec

    def add_listener(self, listener: Listener) -> None:
        """``listener(run, change)`` after each committed change: ``queued``, ``started``,
        ``cancelling``, ``finished``. Exceptions are logged, never propagated."""
        self._listeners.append(listener)

    def add_idle_hook(self, hook: IdleHook) -> None:
        """``hook(session_id)`` when a session has no busy and no queued exclusive run."""
        self._idle_hooks.append(hook)

    @property
    def closing(self) -> bool:
        """True once :meth:`stop_runs` began: no run is admitted, started or dispatched."""
        return self._closing

    @property
    def exclusive_kinds(self) -> list[str]:
        return [kind for kind, spec in self.kinds.items() if spec.exclusive]

    async def notify(self, run: Run, change: str) -> None:
        """Tell every listener (:meth:`add_listener`) that *run* changed, after the commit;
        a listener's failure is logged, never propagated."""
        for listener in self._listeners:
            try:
                await listener(run, change)
            except Exception as exc:
                reraise_cancellation(exc)
                log.exception("run listener failed for %s (%s)", run.id, change)

    def _spawn(self, coro: Awaitable[Any], name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- reading ---------------------------------------------------------------------

    async def get(self, run_id: str, *, tenant: str | None = None) -> Run:
        """The run; :class:`RunNotFound` if unknown or another tenant's."""
        run = await self.io.call(self.store.get, run_id)
        if run is None or (tenant is not None and run.tenant != tenant):
            raise RunNotFound(f"no run with id {run_id!r}")
        return run

    async def session_runs(self, session_id: str, *, non_terminal: bool = True) -> list[Run]:
        """The session's exclusive-kind runs (non-terminal ones by default), oldest first."""
        runs = await self.io.call(
            self.store.list_runs, session_id=session_id, non_terminal=non_terminal
        )
        kinds = set(self.exclusive_kinds)
        return [r for r in runs if r.kind in kinds]

    def is_busy(self, runs: list[Run], now: float | None = None) -> Run | None:
        """The first lifecycle-busy run of *runs*, or ``None``."""
        now = time.time() if now is None else now
        for run in runs:
            if is_lifecycle_busy(run, now, self.unwind_window):
                return run
        return None

    # -- submit and start ------------------------------------------------------------

    async def submit(
        self,
        kind: str,
        *,
        tenant: str,
        payload: Mapping[str, Any] | None = None,
        summary: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        source: Source | str = Source.API,
        strategy: Strategy = "enqueue",
        on_admitted: Callable[[Run], None] | None = None,
        retry_after: int = 1,
    ) -> Run | None:
        """Create a run and start it when allowed; see the module docstring.

        *payload* is the run's input (stored apart, read by its worker alone); *summary*
        the small part of it that readers see (at most
        :data:`~heed.runs.model.MAX_SUMMARY_BYTES` as JSON, else ``ValueError``).
        Raises :class:`RunConflict` (``reject`` on a busy session), :class:`QueueFull`
        (``enqueue`` on a session whose queue is full) and
        :class:`HeedError` 400 for an unknown kind. ``strategy="idle"`` returns
        ``None`` instead of raising when the session is busy, and so does an
        ``on_admitted`` callback (run inside the admission transaction) that
        raises :class:`AdmissionAborted`.
        """
        spec = self.kinds.get(kind)
        if spec is None:
            raise HeedError(f"unknown run kind {kind!r}")
        if self._closing:
            raise HeedError("the server is shutting down", status_code=503)
        run = Run(
            id=new_run_id(),
            kind=kind,
            tenant=tenant,
            phase=Phase.QUEUED,
            created_at=time.time(),
            session_id=session_id,
            source=str(source),
            summary=dict(summary or {}),
        )
        summary_json(run.summary)  # refuses an oversized summary before anything is written
        carrier = link_carrier()  # the starting request's span, for the run's span to link
        if carrier is not None:
            payload = {**(payload or {}), TRACE_LINK_KEY: carrier}
        exclusive = spec.exclusive and session_id is not None

        def blocking(siblings: Any) -> Run | None:
            if strategy in ("reject", "idle"):
                return self.is_busy(list(siblings))
            if exclusive and strategy == "enqueue":
                queued = sum(1 for s in siblings if is_queued(s))
                if queued >= self.max_queued_per_session:
                    assert session_id is not None
                    raise QueueFull(session_id, queued, self.max_queued_per_session)
            return None

        def admit() -> tuple[Run | None, Run | None]:
            with self.store.transaction():
                admitted, blocker = self.store.admit(
                    run,
                    blocking,
                    scope_kinds=self.exclusive_kinds if exclusive else [kind],
                    payload=payload,
                )
                if admitted is not None and on_admitted is not None:
                    on_admitted(admitted)
            return admitted, blocker

        try:
            admitted, blocker = await self.io.call(admit)
        except AdmissionAborted:
            return None
        if admitted is None:
            assert blocker is not None
            if strategy == "idle":
                return None
            raise RunConflict(blocker, retry_after)
        await self.notify(admitted, "queued")
        if exclusive and strategy == "interrupt":
            assert session_id is not None
            mine = (admitted.created_at, admitted.id)
            for sibling in await self.session_runs(session_id):
                # Only runs admitted before this one: of racing interrupts, the last one wins.
                older = (sibling.created_at, sibling.id) < mine
                if older and (is_queued(sibling) or is_running(sibling)):
                    await self.cancel(sibling.id, "interrupted by a new turn")
        if exclusive:
            assert session_id is not None
            await self.dispatch(session_id)
        else:
            await self._claim_and_start(admitted)
        return await self.io.call(self.store.get, admitted.id) or admitted

    def _may_start(self, run: Run, siblings: Any) -> bool:
        now = time.time()
        for sibling in siblings:
            if not is_lifecycle_busy(sibling, now, self.unwind_window):
                continue
            if is_queued(sibling) and (sibling.created_at, sibling.id) > (
                run.created_at,
                run.id,
            ):
                continue  # a younger queued run waits behind this one
            return False
        return True

    async def _claim_and_start(self, run: Run) -> bool:
        spec = self.kinds.get(run.kind)
        if spec is None or self._closing or run.id in self.workers:
            # A worker of this run still in this process (a requeued run whose lost worker
            # has not unwound yet) is not joined by a second one.
            return False
        exclusive = spec.exclusive and run.session_id is not None
        claimed = await self.io.call(
            lambda: self.store.claim(
                run.id,
                worker_id=self.worker_id,
                lease_seconds=self.lease_seconds,
                may_start=self._may_start if exclusive else (lambda r, s: True),
                scope_kinds=self.exclusive_kinds if exclusive else [run.kind],
            )
        )
        if claimed is None:
            return False
        started, event = claimed
        self.journal.publish([event])
        worker = _Worker(started.id, CancellationToken())
        self.workers[started.id] = worker
        worker.task = asyncio.create_task(self._work(started, spec, worker), name=started.id)
        self._watch_cancels()
        await self.notify(started, "started")
        return True

    async def dispatch(self, session_id: str) -> None:
        """Start the session's oldest queued exclusive run if nothing busy is ahead of it;
        when the session is idle (nothing busy, nothing queued), run the idle hooks."""
        # The lock only avoids redundant claims in this process; correctness comes from
        # the claim transaction. It is dropped when free so the map does not grow.
        lock = self._session_locks.setdefault(session_id, asyncio.Lock())
        try:
            async with lock:
                runs = await self.session_runs(session_id)
                queued = [r for r in runs if is_queued(r)]
                if queued:
                    await self._claim_and_start(queued[0])
                    return
                if self.is_busy(runs) is not None:
                    return
        finally:
            if not lock.locked() and self._session_locks.get(session_id) is lock:
                del self._session_locks[session_id]
        if not self._closing:
            for hook in self._idle_hooks:
                try:
                    await hook(session_id)
                except Exception as exc:
                    reraise_cancellation(exc)
                    log.exception("idle hook failed for session %s", session_id)

    async def start(self, run: Run) -> None:
        """Start queued *run* if it may start now, as any queued run starts: a run of an
        exclusive kind through its session's :meth:`dispatch` (the oldest queued run of the
        session goes first), any other at once. Nothing happens when it may not start or is
        no longer queued (the claim is guarded)."""
        spec = self.kinds.get(run.kind)
        if spec is None:
            return
        if spec.exclusive and run.session_id is not None:
            await self.dispatch(run.session_id)
        else:
            await self._claim_and_start(run)

    async def start_queued(self, batch: int = 500) -> None:
        """Start every queued run that may start (after recovery, and from the reaper's
        sweep), reading the queued rows (never their payloads) in batches of *batch*."""
        after = ""
        while not self._closing:
            runs = await self.io.call(
                self.store.runs_in_phases, [Phase.QUEUED], after_id=after, limit=batch
            )
            sessions: set[str] = set()
            for run in runs:
                spec = self.kinds.get(run.kind)
                if spec is None:
                    continue
                if spec.exclusive and run.session_id is not None:
                    sessions.add(run.session_id)
                elif run.id not in self.workers:
                    await self._claim_and_start(run)
            for session_id in sorted(sessions):
                await self.dispatch(session_id)
            if len(runs) < batch:
                return
            after = runs[-1].id

    # -- the worker ------------------------------------------------------------------

    async def _work(self, run: Run, spec: KindSpec, worker: _Worker) -> None:
        ctx = RequestContext(tenant=run.tenant, token=worker.token)
        rc = RunContext(run=run, ctx=ctx, journal=self.journal)
        outcome = "completed"
        result: dict[str, Any] | None = None
        error: str | None = None
        status: int | None = None
        reason: str | None = None
        try:
            payload = await self.io.call(self.store.payload, run.id)
            rc.payload = payload or {}
            link = link_from(rc.payload.pop(TRACE_LINK_KEY, None))
            told = partial(rc.emit, EventType.PROGRESS)  # a budget holds its model calls
            with run_span(run, link), use_context(ctx), tallying(run.id, told) as tally:
                if spec.lane is not None and self.lanes is not None:
                    async with self.lanes[spec.lane].slot(worker.token):
                        result = await spec.execute(rc)
                else:
                    result = await spec.execute(rc)
                if isinstance(result, dict) and tally.calls:
                    result = {**result, "llm_usage": tally.as_dict()}
        except OperationCancelled as exc:
            outcome, reason = "cancelled", exc.reason
        except asyncio.CancelledError:
            outcome, reason = "cancelled", worker.token.reason or SHUTDOWN
        except LaneFull as exc:
            outcome, error, status = "failed", str(exc), 503
        except HeedError as exc:  # the caller's (or upstream's) problem, with its status
            outcome, error, status = "failed", exc.message, exc.status_code
        except Exception as exc:
            reraise_cancellation(exc)
            log.exception("run %s (%s) failed", run.id, run.kind)
            outcome, error = "failed", f"{type(exc).__name__}: {exc}"
        finally:
            try:
                await asyncio.shield(self._finish(run, outcome, result, error, status, reason))
            finally:
                self.workers.pop(run.id, None)
                worker.done.set()
            if run.session_id is not None and not self._closing:
                self._spawn(self.dispatch(run.session_id), f"dispatch-{run.session_id}")

    async def _finish(
        self,
        run: Run,
        outcome: str,
        result: dict[str, Any] | None,
        error: str | None,
        status: int | None,
        reason: str | None,
    ) -> None:
        """Record how the worker ended (see :mod:`heed.runs.ending`). A run that was being
        cancelled meanwhile ends ``cancelled``; one already terminal (interrupted by
        recovery or shutdown) is left as it is. The caller dispatches the session."""
        now, mine = time.time(), self.worker_id
        if outcome == "completed":
            steps = as_completed(result, worker_id=mine, now=now)
        elif outcome == "failed":
            steps = as_failed(error or "", status, worker_id=mine, now=now)
        else:  # cancelled without the cancel API (a deadline, a shutdown)
            steps = as_cancelled(reason or "", source=Phase.RUNNING, worker_id=mine, now=now)
        try:
            await end_run(self, run.id, steps, dispatch=False)
        except Exception as exc:
            reraise_cancellation(exc)
            log.exception("could not record the end of run %s; the reaper will", run.id)

    # -- cancel ----------------------------------------------------------------------

    async def cancel(
        self,
        run_id: str,
        reason: str = "cancelled by client",
        *,
        tenant: str | None = None,
        wait: bool = False,
        wait_timeout: float = 30.0,
    ) -> Run:
        """Cancel a run; idempotent. See the module docstring. Raises :class:`RunNotFound`."""
        run = await self.get(run_id, tenant=tenant)
        for _ in range(5):
            if is_terminal(run):
                return run
            now = time.time()
            if is_queued(run):
                steps = as_cancelled(reason, source=Phase.QUEUED, now=now)
                cancelled = await end_run(self, run_id, steps)
                if cancelled is not None:
                    return cancelled
            elif is_running(run):
                t = await self.io.call(
                    self.store.transition,
                    run_id,
                    Phase.CANCELLING,
                    fields={"cancelled_at": now, "cancel_reason": reason},
                    event=(EventType.CANCELLED, {"reason": reason}),
                    only_from=[Phase.RUNNING],
                )
                if t is not None:
                    self.journal.publish([t.event])
                    self.cancel_local(run_id, reason)
                    self.broker.publish(CANCEL_TOPIC, {"run_id": run_id, "reason": reason})
                    await self.notify(t.run, "cancelling")
                    run = t.run
                    break
            else:  # cancelling already, or an unknown phase: nothing to write
                self.cancel_local(run_id, run.cancel_reason or reason)
                break
            run = await self.get(run_id)  # raced with a start or finish: look again
        if wait:
            return await self.wait_stopped(run_id, wait_timeout)
        return run

    def cancel_soon(self, run_id: str, reason: str) -> None:
        """:meth:`cancel` in a background task of the manager (awaited at shutdown), for a
        caller that is itself being cancelled: a stream whose client left."""
        self._spawn(self.cancel(run_id, reason), f"cancel-{run_id}")

    def start_cancel_listener(self) -> None:
        """Follow :data:`CANCEL_TOPIC`: a cancel written by another process sharing the
        database stops this process's worker at once, instead of at the next lease
        renewal (which still catches any announcement that was lost)."""
        self._spawn(self._follow_cancels(), "heed-cancel-listener")

    async def _follow_cancels(self) -> None:
        sub = self.broker.subscribe(CANCEL_TOPIC)
        try:
            while True:
                message = await sub.get()
                if message is STOPPED:
                    return
                if isinstance(message, dict) and isinstance(message.get("run_id"), str):
                    self.cancel_local(message["run_id"], str(message.get("reason") or ""))
        finally:
            sub.close()

    def _watch_cancels(self) -> None:
        if self.cancel_watch_interval > 0 and not self._closing and self._cancel_watch is None:
            self._cancel_watch = asyncio.create_task(
                self._cancel_watch_loop(), name="heed-cancel-watch"
            )
            self._background.add(self._cancel_watch)
            self._cancel_watch.add_done_callback(self._background.discard)

    async def _cancel_watch_loop(self) -> None:
        """Every ``cancel_watch_interval`` while this process has workers: cancel the
        tokens of those whose run another process put in ``cancelling``. Ends when no
        worker is left (the next start begins it again); a failed read is logged and the
        watch goes on (the lease renewal is the backstop)."""
        try:
            while self.workers and not self._closing:
                asked = await self.read_io.watch_round(
                    self.cancel_watch_interval,
                    lambda: [rid for rid, w in self.workers.items() if not w.token.cancelled],
                    self.store.cancel_requests,
                    log,
                    "the cancel watch",
                )
                for run_id, reason in asked.items():
                    self.cancel_local(run_id, reason)
        finally:
            self._cancel_watch = None

    def cancel_local(self, run_id: str, reason: str) -> None:
        """Cancel the token of this process's worker of *run_id*, if it has one; writes
        nothing (the caller has seen, or written, the run's cancel or end)."""
        worker = self.workers.get(run_id)
        if worker is not None:
            worker.token.cancel(reason)

    async def wait_stopped(self, run_id: str, seconds: float) -> Run:
        """Wait until the run is terminal (its worker stopped), at most *seconds*;
        returns the run as it then is.

        A worker of this process is awaited; one of another process is seen by re-reading
        the run, at intervals that grow from 50 ms to 1 s (the end of a cancelled run
        publishes nothing: its terminal event was written when the cancel was)."""
        deadline = time.monotonic() + seconds
        worker = self.workers.get(run_id)
        if worker is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(worker.done.wait(), seconds)
        interval = 0.05
        while True:
            run = await self.get(run_id)
            left = deadline - time.monotonic()
            if is_terminal(run) or left <= 0:
                return run
            await asyncio.sleep(min(interval, left))
            interval = min(1.0, interval * 2)

    async def after_interrupted(self, run: Run) -> None:
        """Run the kind's ``on_interrupted`` hook (errors logged), then tell listeners."""
        spec = self.kinds.get(run.kind)
        if spec is not None and spec.on_interrupted is not None:
            try:
                await spec.on_interrupted(run)
            except Exception as exc:
                reraise_cancellation(exc)
                log.exception("on_interrupted failed for run %s", run.id)
        await self.notify(run, "finished")

    # -- shutdown --------------------------------------------------------------------

    async def stop_runs(self, grace: float = 5.0) -> None:
        """Stop accepting work; mark this process's running runs ``interrupted`` (a terminal
        journal event each, and the kind's ``on_terminal`` hook in the same transaction),
        cancel their tokens and wait up to *grace* seconds for the workers to unwind.

        Idempotent: the server's drain calls it on SIGTERM, :meth:`close` again at the end.
        """
        if self._stopped:
            return
        self._stopped = True
        self._closing = True
        for task in list(self._background):
            task.cancel()
        for run_id, worker in list(self.workers.items()):
            steps = as_interrupted(
                SHUTDOWN, error=SHUTDOWN, worker_id=self.worker_id, now=time.time()
            )
            await end_run(self, run_id, steps, worker_gone=False)
            # The worker unwinds on its own (a turn keeps its partial output, marked
            # interrupted: the token's reason is SHUTDOWN); on_interrupted is for workers
            # that died without unwinding (restart recovery, lost leases).
            worker.token.cancel(SHUTDOWN)
        tasks = [w.task for w in self.workers.values() if w.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=grace)

    async def close(self, grace: float = 5.0) -> None:
        """:meth:`stop_runs`, then release the store threads. Idempotent."""
        await self.stop_runs(grace)
        await self.journal.aclose()
        if self._io_closed:
            return
        self._io_closed = True
        self.io.close()
        self.read_io.close()
