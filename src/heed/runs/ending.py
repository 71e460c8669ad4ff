"""How a run ends: the one place that makes a run terminal.

Every path that ends a run (its worker exits, a queued run is cancelled, the server drains,
the reaper reclaims a stale cancel or an expired lease, restart recovery) calls
:func:`end_run` with the :class:`Step` s that describe its transition. :func:`end_run`
promises, in this order:

1. **One transaction** holds every step's guarded transition (``RunStore.transition``), their
   journal events, and the kind's ``on_terminal`` hook once a step made the run terminal (a
   task's wakeup, say), then the manager's ``terminal_hooks`` (hooks for runs of every kind:
   the webhooks' outbox): either all of it is stored, or none.
2. **Publish** the events to live readers, after the commit.
3. **Tell** the listeners (``finished``); for an ``interrupted`` run whose worker is gone,
   first the kind's ``on_interrupted`` hook (a turn rebuilds its partial output from the
   journal). A draining server passes ``worker_gone=False``: its workers are still alive and
   store their own partial output as they unwind.
4. **Dispatch** the session, unless the caller does it itself (a worker exit dispatches after
   it has left the worker table) or the manager is closing.

Steps are tried in order and each is guarded by its source phases, so a sequence can say
"complete it, or if it was being cancelled meanwhile, finish the cancel" without reading the
phase first: a step whose source does not match writes nothing. When no step matches (another
writer ended the run first), :func:`end_run` returns ``None`` and does nothing else.

The step lists themselves are built here too, one builder per way a run ends, so every
caller states *how* it ends, never *which rows to write*:

- :func:`as_completed`, :func:`as_failed`: the worker's own end, from ``running``; if the run
  was being cancelled meanwhile, the cancel is finished instead (``cancelled``);
- :func:`as_cancelled`: from ``queued`` (it never starts), from ``running`` (its worker was
  cancelled without the cancel API: a deadline, a shutdown; through ``cancelling``), or from
  ``cancelling`` (a stale cancel the reaper or recovery finishes);
- :func:`as_interrupted`: from ``running``, when the server drains or the worker was lost;
- :func:`as_quarantined`: from ``running``, when the worker of a run whose kind has
  ``max_attempts`` died for the last time it may: ``failed`` with an error starting
  ``quarantined`` (:func:`heed.runs.state.is_quarantined`).

One way out of ``running`` is not an ending: a run whose kind has ``max_attempts`` left when
its worker died goes back to the queue (:func:`as_requeued`, written by :func:`requeue_run`:
``attempts`` + 1, worker and lease cleared, a ``requeued`` journal event, in one
transaction). Which of these a lost worker's run gets is decided by
:func:`heed.runs.state.ending_for_lost_worker` alone. The steps for a lost worker are guarded
by the worker id the caller saw holding the row, so a reaper that read the row before another
process requeued it and claimed it again writes nothing.

Every terminal step stamps ``finished_at`` and releases the lease (a terminal run holds no
worker) and carries the phase's terminal journal event: ``completed {result}``,
``failed {error, status}``, ``cancelled {reason}``, ``interrupted {reason}``. The journal is
closed by the first terminal event, so the event of a step that finishes a cancel (whose
``cancelled`` event was written with ``cancelling``) is dropped by the store. A step written
for a worker of this process (``worker_id``) also requires the row to be held by it, and
records the reason as the run's ``cancel_reason``: a lease renewal that reads the row before
the worker's token is cancelled then stops the worker with that reason.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from heed.runs.events import EventType
from heed.runs.model import Phase, Run, RunEvent
from heed.runs.state import QUARANTINED, is_interrupted, is_terminal

if TYPE_CHECKING:
    from heed.runs.manager import RunManager
    from heed.runs.store import Transition

__all__ = [
    "SHUTDOWN",
    "WORKER_LOST",
    "Step",
    "as_cancelled",
    "as_completed",
    "as_failed",
    "as_interrupted",
    "as_quarantined",
    "as_requeued",
    "end_run",
    "requeue_run",
]

log = logging.getLogger("heed.runs.ending")

#: The reason a run is interrupted (or its worker cancelled) when the server shuts down.
SHUTDOWN: Final = "server shutting down"
#: The error of a run whose worker was lost (its lease expired, its process restarted).
WORKER_LOST: Final = "worker lost (lease expired or process restarted)"


@dataclass(frozen=True, slots=True)
class Step:
    """One guarded transition: from any of *sources* to *to*, with *fields* and *event*.

    *worker_id*, when given, also requires the row to be held by that worker.
    """

    to: Phase
    sources: tuple[Phase, ...]
    fields: dict[str, Any] = field(default_factory=dict)
    event: tuple[str, dict[str, Any]] | None = None
    worker_id: str | None = None


async def end_run(
    manager: RunManager,
    run_id: str,
    steps: Sequence[Step],
    *,
    dispatch: bool = True,
    worker_gone: bool = True,
) -> Run | None:
    """End run *run_id* by *steps* (see the module docstring); the terminal row, or ``None``.

    Raises what the store raises (the transaction then wrote nothing).
    """

    def write() -> tuple[Run | None, list[RunEvent]]:
        with manager.store.transaction():
            written = _write_steps(manager, run_id, steps)
            final = next((t.run for t in reversed(written) if is_terminal(t.run)), None)
            if final is not None:
                spec = manager.kinds.get(final.kind)
                if spec is not None and spec.on_terminal is not None:
                    spec.on_terminal(final)
                for hook in manager.terminal_hooks:  # every kind's (webhooks' outbox)
                    hook(final)
        return final, [t.event for t in written if t.event is not None]

    final, events = await manager.io.call(write)
    manager.journal.publish(events)
    if final is None:
        return None
    if is_interrupted(final) and worker_gone:
        await manager.after_interrupted(final)
    else:
        await manager.notify(final, "finished")
    if dispatch and final.session_id is not None and not manager.closing:
        await manager.dispatch(final.session_id)
    return final


def _write_steps(manager: RunManager, run_id: str, steps: Sequence[Step]) -> list[Transition]:
    """Each step's guarded transition, in order (call inside a store transaction); the
    transitions that were written."""
    written: list[Transition] = []
    for step in steps:
        t = manager.store.transition(
            run_id,
            step.to,
            fields=step.fields,
            event=step.event,
            only_from=list(step.sources),
            worker_id=step.worker_id,
        )
        if t is not None:
            written.append(t)
    return written


# -- how a run ends as X: the step lists (see the module docstring) ----------------------


def _terminal(
    to: Phase,
    source: Phase,
    event: tuple[str, dict[str, Any]],
    fields: dict[str, Any],
    now: float,
    worker_id: str | None,
) -> Step:
    """A step from *source* to the terminal phase *to*: ``finished_at`` stamped, the lease
    released, *event* appended (unless the journal is already closed)."""
    done = {"finished_at": now, "lease_expires_at": None, **fields}
    return Step(to, (source,), done, event, worker_id)


def _finish_cancel(now: float, worker_id: str | None) -> Step:
    """``cancelling -> cancelled``: the cancel wrote its terminal event with ``cancelling``."""
    done = {"finished_at": now, "lease_expires_at": None}
    return Step(Phase.CANCELLED, (Phase.CANCELLING,), done, None, worker_id)


def as_completed(result: dict[str, Any] | None, *, worker_id: str, now: float) -> list[Step]:
    """The worker returned *result*: ``completed``, or the cancel finished if one came first."""
    event = (EventType.COMPLETED, {"result": result})
    return [
        _terminal(Phase.COMPLETED, Phase.RUNNING, event, {"result": result}, now, worker_id),
        _finish_cancel(now, worker_id),
    ]


def as_failed(error: str, status: int | None, *, worker_id: str, now: float) -> list[Step]:
    """The worker raised: ``failed`` with *error* and its HTTP *status* (500 when it has
    none), or the cancel finished if one came first."""
    event = (EventType.FAILED, {"error": error, "status": status or 500})
    return [
        _terminal(Phase.FAILED, Phase.RUNNING, event, {"error": error}, now, worker_id),
        _finish_cancel(now, worker_id),
    ]


def as_cancelled(
    reason: str, *, source: Phase, now: float, worker_id: str | None = None
) -> list[Step]:
    """``cancelled`` for *reason*, from *source*: ``queued`` (it never starts), ``running``
    (its worker of this process, *worker_id*, stopped on a token cancelled without the
    cancel API: through ``cancelling``, whose event ends the journal) or ``cancelling`` (a
    stale cancel finished for a worker that is gone)."""
    event = (EventType.CANCELLED, {"reason": reason})
    if source is Phase.QUEUED:
        fields = {"cancelled_at": now, "cancel_reason": reason}
        return [_terminal(Phase.CANCELLED, Phase.QUEUED, event, fields, now, worker_id)]
    if source is Phase.RUNNING:
        assert worker_id is not None, "only a run's own worker ends it from running"
        fields = {"cancelled_at": now, "cancel_reason": reason}
        cancelling = Step(Phase.CANCELLING, (Phase.RUNNING,), fields, event, worker_id)
        return [cancelling, _finish_cancel(now, worker_id)]
    if source is Phase.CANCELLING:
        return [_terminal(Phase.CANCELLED, Phase.CANCELLING, event, {}, now, worker_id)]
    raise ValueError(f"a run is not cancelled from {source}")


def as_interrupted(
    reason: str, *, error: str, now: float, worker_id: str | None = None
) -> list[Step]:
    """``interrupted`` from ``running`` for *reason* (the journal's), with *error* on the row:
    the server drains (*worker_id*: its own worker, which unwinds after this), or the worker
    was lost (no *worker_id*: whoever held it is gone)."""
    fields: dict[str, Any] = {"error": error}
    if worker_id is not None:
        fields["cancel_reason"] = reason
    event = (EventType.INTERRUPTED, {"reason": reason})
    return [_terminal(Phase.INTERRUPTED, Phase.RUNNING, event, fields, now, worker_id)]


def as_quarantined(run: Run, *, now: float) -> list[Step]:
    """``failed`` from ``running``: *run*'s worker died once more and its kind's
    ``max_attempts`` is spent (:func:`heed.runs.state.ending_for_lost_worker`). ``attempts``
    becomes the number of deaths; the error (row and ``failed`` event) starts with
    ``quarantined``. Guarded by the worker id that held *run*."""
    deaths = run.attempts + 1
    error = (
        f"{QUARANTINED} its worker died {deaths} time{'s' if deaths != 1 else ''} while "
        "processing (lease expired or process gone); it is not claimed again"
    )
    event = (EventType.FAILED, {"error": error, "status": 500})
    fields = {"error": error, "attempts": deaths}
    return [_terminal(Phase.FAILED, Phase.RUNNING, event, fields, now, run.worker_id)]


def as_requeued(run: Run, reason: str, *, now: float) -> list[Step]:
    """``queued`` from ``running``: *run*'s worker died (*reason*) and its kind has
    ``max_attempts`` left. ``attempts`` + 1; the worker, its lease and ``started_at`` are
    cleared (the next claim sets them); a ``requeued {attempt, reason}`` event. Guarded by
    the worker id that held *run*. Not terminal: write it with :func:`requeue_run`."""
    attempt = run.attempts + 1
    fields = {"attempts": attempt, "worker_id": None, "lease_expires_at": None, "started_at": None}
    event = (EventType.REQUEUED, {"attempt": attempt, "reason": reason})
    return [Step(Phase.QUEUED, (Phase.RUNNING,), fields, event, run.worker_id)]


async def requeue_run(manager: RunManager, run_id: str, steps: Sequence[Step]) -> Run | None:
    """Put run *run_id* back in the queue by *steps* (:func:`as_requeued`), in one
    transaction with their journal events; publish the events and tell the listeners
    (``queued``). Returns the queued row, or ``None`` when no step matched (another writer
    moved the run first). The caller starts it (:meth:`RunManager.start`)."""

    def write() -> tuple[Run | None, list[RunEvent]]:
        with manager.store.transaction():
            written = _write_steps(manager, run_id, steps)
        queued = written[-1].run if written else None
        return queued, [t.event for t in written if t.event is not None]

    queued, events = await manager.io.call(write)
    manager.journal.publish(events)
    if queued is not None:
        await manager.notify(queued, "queued")
    return queued
