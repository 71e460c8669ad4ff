"""The reaper: lease renewal and reclamation of runs whose worker is gone.

One pass (:func:`reap_once`), run every ``reaper_interval`` seconds by
:class:`Reaper`, and safe to run concurrently in several processes (every write
is a guarded transition, so at most one reclaimer wins each row):

1. **Renew** the lease of every run whose worker task exists in this process
   (whatever that task is doing: a wedged worker keeps its lease, which is how
   "never reclaim a live worker by age alone" holds), and notice runs another
   process moved to ``cancelling`` so the local token is cancelled.
2. **Reclaim**:
   - a ``cancelling`` run for which :func:`~heed.runs.state.cancel_is_stale` is
     true (past the unwind window, measured from ``cancelled_at``; no live
     lease) becomes ``cancelled`` and its session is released (dispatched: the
     next queued turn or pending wakeups go);
   - a ``running`` run whose lease expired (its process died) becomes
     ``interrupted`` with a terminal ``interrupted`` journal event -- at most
     once: it is never re-run -- unless its kind has ``max_attempts``: then it is
     requeued (``queued`` again, ``attempts`` + 1, a ``requeued`` journal event) and
     started again in the same pass, or, on the death that reaches ``max_attempts``,
     quarantined (``failed``, error ``quarantined: ...``; never claimed again). The
     rule is :func:`~heed.runs.state.ending_for_lost_worker`, applied by
     :func:`settle_lost_worker` here and in restart recovery alike.
3. **Count** wedged runs (:func:`~heed.runs.state.is_wedged`) for the
   ``heed_runs_wedged`` gauge.
4. **Retention** (only with ``manager.journal_retention`` seconds > 0): journals of
   runs finished longer ago than that keep only their terminal event; a reader
   resuming before it gets an explicit ``gap`` and reloads the transcript.
5. **Dispatch** the sessions of the runs it ended (the next queued turn or pending
   wakeups go), and **start** the runs it requeued (:meth:`RunManager.start`).
6. **Sweep** (every ``manager.queue_sweep_interval`` seconds, not every pass): start
   queued runs nobody started. Every path that frees a session dispatches it at once,
   so this is only a safety net (a dispatch that failed).

What a pass reads is bounded by the work that holds workers, never by the queue:
steps 2 and 3 read only ``running`` and ``cancelling`` rows
(:data:`~heed.runs.state.WORKER_PHASES`), in batches of :data:`BATCH` by id, and no
step reads a payload.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Final

from heed.runs.ending import (
    WORKER_LOST,
    as_cancelled,
    as_interrupted,
    as_quarantined,
    as_requeued,
    end_run,
    requeue_run,
)
from heed.runs.manager import RunManager
from heed.runs.model import Phase, Run
from heed.runs.state import (
    WORKER_PHASES,
    ending_for_lost_worker,
    is_interrupted,
    is_quarantined,
    is_queued,
    is_wedged,
    reaper_may_end,
    worker_should_stop,
)
from heed.runtime import OperationCancelled, reraise_cancellation, settle

__all__ = ["BATCH", "Reaper", "finalize", "reap_once", "settle_lost_worker", "worker_runs"]

log = logging.getLogger("heed.runs.reaper")


async def renew_leases(manager: RunManager) -> None:
    """Renew this process's leases; cancel local tokens of runs cancelled or ended
    elsewhere, or no longer held by this process (requeued after its lease expired)."""
    ids = list(manager.workers)
    if not ids:
        return
    rows = await manager.io.call(
        manager.store.renew_leases, manager.worker_id, ids, time.time() + manager.lease_seconds
    )
    for row in rows:
        if worker_should_stop(row, manager.worker_id):
            manager.cancel_local(row.id, row.cancel_reason or "cancelled")


#: Rows read per query when a pass scans the runs that hold workers.
BATCH: Final = 500


async def worker_runs(manager: RunManager, batch: int = BATCH) -> AsyncIterator[list[Run]]:
    """The ``running`` and ``cancelling`` runs (without payloads), batch by batch by id."""
    after = ""
    while True:
        runs = await manager.io.call(
            manager.store.runs_in_phases, WORKER_PHASES, after_id=after, limit=batch
        )
        if runs:
            yield runs
        if len(runs) < batch:
            return
        after = runs[-1].id


#: The reason in the journal of a run whose worker was lost (``interrupted``, ``requeued``).
LOST_REASON: Final = "worker lost"


async def finalize(manager: RunManager, run: Run, to: Phase) -> Run | None:
    """Move *run*, whose worker is gone, to *to* as
    :func:`~heed.runs.state.ending_for_lost_worker` decided: ``cancelled`` (a stale cancel),
    ``interrupted`` (a lost worker), ``queued`` (requeued: :func:`heed.runs.ending.requeue_run`)
    or ``failed`` (quarantined); the endings through :func:`heed.runs.ending.end_run`.
    Counts it. ``None`` when another writer moved it first. The caller starts a requeued
    run (:meth:`RunManager.start`)."""
    now = time.time()
    if to is Phase.QUEUED:
        requeued = await requeue_run(manager, run.id, as_requeued(run, LOST_REASON, now=now))
        if requeued is not None:
            manager.requeued_total += 1
            manager.requeued_by_kind[run.kind] += 1
        return requeued
    if to is Phase.CANCELLED:
        steps = as_cancelled(run.cancel_reason or "reclaimed", source=Phase.CANCELLING, now=now)
    elif to is Phase.FAILED:
        steps = as_quarantined(run, now=now)
    else:
        steps = as_interrupted(LOST_REASON, error=WORKER_LOST, now=now)
    # The reaper and recovery dispatch every session after their pass.
    final = await end_run(manager, run.id, steps, dispatch=False)
    if final is not None:
        if is_interrupted(final):
            manager.interrupted_total += 1
        elif is_quarantined(final):
            manager.quarantined_total += 1
            manager.quarantined_by_kind[final.kind] += 1
        else:
            manager.reclaimed_total += 1
    return final


async def settle_lost_worker(manager: RunManager, run: Run) -> Run | None:
    """*run*'s worker is gone (the caller checked): end, requeue or quarantine it by
    :func:`~heed.runs.state.ending_for_lost_worker` for its kind's ``max_attempts`` (a kind
    this process does not know has none). The reaper and restart recovery both come here.
    Returns the new row, or ``None`` when there was nothing to do or another writer was
    first."""
    spec = manager.kinds.get(run.kind)
    target = ending_for_lost_worker(run, spec.max_attempts if spec is not None else None)
    return await finalize(manager, run, target) if target is not None else None


async def reclaim(manager: RunManager, run: Run, now: float) -> Run | None:
    """Finalize *run* if the rules above say so; returns the new row or ``None``."""
    if run.id in manager.workers:
        return None  # our own worker is alive
    if not reaper_may_end(run, now, manager.unwind_window):
        return None
    return await settle_lost_worker(manager, run)


async def trim_finished(manager: RunManager, cutoff: float) -> int:
    """Trim the journals of runs finished before *cutoff* to their terminal event."""
    trimmed = 0
    for run in await manager.io.call(manager.store.finished_before, cutoff):
        trimmed += await manager.io.call(manager.store.trim_journal, run.id, run.last_seq)
    return trimmed


async def reap_once(manager: RunManager, *, sweep: bool = True) -> list[Run]:
    """One pass; returns the runs it finalized or requeued (as it left them: a requeued
    run is ``queued`` in the list, though the pass then starts it). ``sweep=False`` skips
    step 6."""
    await renew_leases(manager)
    now = time.time()
    finalized: list[Run] = []
    wedged = 0
    async for runs in worker_runs(manager):
        for run in runs:
            if is_wedged(run, now, manager.unwind_window):
                wedged += 1
            done = await reclaim(manager, run, now)
            if done is not None:
                finalized.append(done)
    manager.wedged = wedged
    if manager.journal_retention > 0:
        await trim_finished(manager, time.time() - manager.journal_retention)
    for session_id in sorted({r.session_id for r in finalized if r.session_id is not None}):
        await manager.dispatch(session_id)
    for run in finalized:
        if is_queued(run):  # requeued: it starts again as any queued run
            await manager.start(run)
    if sweep:
        await manager.start_queued()
    return finalized


class Reaper:
    """Runs :func:`reap_once` every ``manager.reaper_interval`` seconds until stopped."""

    def __init__(self, manager: RunManager) -> None:
        self.manager = manager
        self._task: asyncio.Task[None] | None = None
        self.passes = 0
        self._last_sweep = time.monotonic()  # start-up recovery has just swept

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="heed-run-reaper")

    async def _loop(self) -> None:
        """Pass after pass until :meth:`stop` cancels the task. A failed pass is logged and
        the next one runs: the loop is the only thing renewing this process's leases."""
        while True:
            await asyncio.sleep(self.manager.reaper_interval)
            sweep = time.monotonic() - self._last_sweep >= self.manager.queue_sweep_interval
            if sweep:
                self._last_sweep = time.monotonic()
            try:
                await reap_once(self.manager, sweep=sweep)
            except OperationCancelled as exc:
                # Nobody cancels the reaper by token (stop() cancels its task), so this came
                # from a call it made; ending the loop here would let every lease expire.
                log.warning("reaper pass was cancelled from inside (%s); continuing", exc.reason)
            except Exception as exc:
                reraise_cancellation(exc)
                log.exception("reaper pass failed")
            self.passes += 1

    async def stop(self) -> None:
        """Cancel the loop and return once it has finished (:func:`heed.runtime.settle`)."""
        if self._task is not None:
            await settle(self._task)
            self._task = None
