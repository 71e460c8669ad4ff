"""THE shared predicates over run state. Every reader of run state calls these.

Two questions look alike and must never be answered by the same test:

- **may a client attach?** (:func:`is_attachable`) -- a browser or SDK may
  render this run as live work: ``queued`` or ``running`` only. A
  ``cancelling`` run is *not* attachable: its journal already ends in the
  terminal ``cancelled`` event, so for clients the run is over. Recovery paths
  (session channel replay of ``turn_started``, the status endpoint's
  ``active_run_id``) use this one.
- **is the session's lifecycle busy?** (:func:`is_lifecycle_busy`) -- may a new
  turn start? ``queued``, ``running``, and a ``cancelling`` run that is not yet
  stale, so a successor never overlaps a worker that is still unwinding.
  Admission, ``busy`` on the status endpoint and wakeup delivery use this one.

:func:`cancel_is_stale` is the reclamation rule: a ``cancelling`` run whose age,
measured from ``cancelled_at`` (falling back to ``started_at``, then
``created_at``), is past the unwind window *and* whose worker is not live. Age
alone never makes a run with a live worker stale (it is *wedged*:
:func:`is_wedged`, exported as a metric).

Worker liveness is the lease (:func:`worker_is_live`): the process that owns a
worker renews ``lease_expires_at`` while the worker task exists, whatever the
task is doing, so a wedged worker keeps a live lease and an abandoned row
(dead process) loses it. This works across processes sharing one database.

Unknown or blank phases (a newer writer, a corrupt row): never attachable (a
client cannot render what it does not understand, and replaying it would risk
the attach loop); lifecycle-busy only while the row holds a live lease (never
start a successor on top of a live worker, never block a session forever on a
dead one); never stale, never terminal.

All functions are pure: they read the given :class:`~heed.runs.model.Run` and
``now`` (epoch seconds) and never raise for odd field values.
"""

from __future__ import annotations

from typing import Final

from heed.runs.model import TERMINAL_PHASES, Phase, Run, parse_phase

__all__ = [
    "DEFAULT_UNWIND_WINDOW",
    "cancel_age",
    "cancel_is_stale",
    "is_attachable",
    "is_lifecycle_busy",
    "is_terminal",
    "is_wedged",
    "worker_is_live",
]

#: Seconds a cancelling worker is given to unwind before it may be reclaimed.
DEFAULT_UNWIND_WINDOW: Final = 180.0

_ATTACHABLE: Final = frozenset({Phase.QUEUED, Phase.RUNNING})


def is_terminal(run: Run) -> bool:
    """True when the run's phase is absorbing (cancelled, completed, failed, interrupted)."""
    return parse_phase(run.phase) in TERMINAL_PHASES


def worker_is_live(run: Run, now: float) -> bool:
    """True when the run holds a lease that has not expired at *now*."""
    lease = run.lease_expires_at
    return run.worker_id is not None and lease is not None and lease > now


def is_attachable(run: Run) -> bool:
    """May a client attach to this run as live work? ``queued`` or ``running`` only.

    Never for ``cancelling`` (its journal is already closed), terminal, unknown
    or blank phases.
    """
    return parse_phase(run.phase) in _ATTACHABLE


def cancel_age(run: Run, now: float) -> float | None:
    """Seconds since the cancel (``cancelled_at``, else ``started_at``, else ``created_at``)."""
    for anchor in (run.cancelled_at, run.started_at, run.created_at):
        if anchor is not None:
            return now - anchor
    return None


def cancel_is_stale(run: Run, now: float, window: float = DEFAULT_UNWIND_WINDOW) -> bool:
    """May this ``cancelling`` run be reclaimed? Past the unwind window and no live worker.

    False for every other phase, and always False while the worker is live.
    """
    if parse_phase(run.phase) is not Phase.CANCELLING:
        return False
    if worker_is_live(run, now):
        return False
    age = cancel_age(run, now)
    return age is not None and age >= window


def is_wedged(run: Run, now: float, window: float = DEFAULT_UNWIND_WINDOW) -> bool:
    """A ``cancelling`` run past the unwind window whose worker is still live (for metrics)."""
    if parse_phase(run.phase) is not Phase.CANCELLING or not worker_is_live(run, now):
        return False
    age = cancel_age(run, now)
    return age is not None and age >= window


def is_lifecycle_busy(run: Run, now: float, window: float = DEFAULT_UNWIND_WINDOW) -> bool:
    """Does this run keep its session busy (no successor may start)?

    ``queued`` and ``running``: yes. ``cancelling``: yes until
    :func:`cancel_is_stale`. Terminal: no. Unknown or blank: only while it holds
    a live lease.
    """
    phase = parse_phase(run.phase)
    if phase in _ATTACHABLE:
        return True
    if phase is Phase.CANCELLING:
        return not cancel_is_stale(run, now, window)
    if phase in TERMINAL_PHASES:
        return False
    return worker_is_live(run, now)
