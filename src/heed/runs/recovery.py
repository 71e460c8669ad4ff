"""Restart recovery: what a process does with runs a previous process left behind.

Called once from ``Services.start`` before serving. For every non-terminal run
whose worker is not alive (its lease expired, or its worker id names this host
and a process that no longer exists, or this very process id in an earlier
incarnation -- containers restart as pid 1):

- ``running`` becomes ``interrupted`` with a synthetic terminal ``interrupted``
  journal event (at most once: the work is not re-run); the kind's
  ``on_interrupted`` hook then runs (a turn stores its partial output in the
  transcript, marked interrupted);
- ``running`` of a kind with ``max_attempts`` is instead requeued (``queued``,
  ``attempts`` + 1, a ``requeued`` journal event) and started again below, or, on
  the death that reaches ``max_attempts``, quarantined (``failed``, error
  ``quarantined: ...``): it is never claimed again, by this process or any later one
  (the same rule as the reaper's: :func:`heed.runs.reaper.settle_lost_worker`);
- ``cancelling`` becomes ``cancelled`` (its journal already ends in the
  terminal ``cancelled`` event; the user asked for a cancel, so that is the
  honest final phase);
- ``queued`` runs (and the ones just requeued) are kept and started (a queued message
  is not lost);
- then every session it touched is dispatched, which delivers pending wakeups, so
  no session stays busy.

It reads only ``running`` and ``cancelling`` rows in batches (then the queued ones,
to start them), never a payload.

Runs held by live workers of other processes sharing the database are left
alone.
"""

from __future__ import annotations

import time

from heed.runs.manager import RunManager
from heed.runs.model import Run
from heed.runs.reaper import settle_lost_worker, worker_runs
from heed.runs.state import worker_is_dead

__all__ = ["recover", "worker_is_dead"]


async def recover(manager: RunManager, session_ids: list[str] | None = None) -> list[Run]:
    """Finalize (or requeue) runs left by dead workers; start queued runs; dispatch
    sessions.

    *session_ids* (e.g. sessions with pending wakeups) are dispatched too.
    Returns the runs finalized or requeued, as it left them (a requeued one ``queued``).
    """
    now = time.time()
    finalized: list[Run] = []
    sessions = set(session_ids or [])
    async for runs in worker_runs(manager):
        for run in runs:
            if run.id in manager.workers or not worker_is_dead(run, now, manager.worker_id):
                continue
            done = await settle_lost_worker(manager, run)
            if done is not None:
                finalized.append(done)
                if done.session_id is not None:
                    sessions.add(done.session_id)
    await manager.start_queued()
    for session_id in sorted(sessions):
        await manager.dispatch(session_id)
    return finalized
