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

Smaller questions, each answered here and nowhere else: is it waiting to start
(:func:`is_queued`), is its worker executing it (:func:`is_running`), should a local
worker stop (:func:`worker_should_stop`), may the reaper end it
(:func:`reaper_may_end`), what becomes of a run whose worker is gone -- interrupted,
cancelled, requeued or quarantined (:func:`ending_for_lost_worker`), is its worker dead
(:func:`worker_is_dead`, the restart rule), was it interrupted (:func:`is_interrupted`),
was it quarantined (:func:`is_quarantined`).

All functions are pure: they read the given :class:`~heed.runs.model.Run` and
``now`` (epoch seconds) and never raise for odd field values (:func:`worker_is_dead`
also asks whether a process id is alive, through an argument it can be given).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Final

from heed.runs.model import TERMINAL_PHASES, Phase, Run, parse_phase

__all__ = [
    "DEFAULT_UNWIND_WINDOW",
    "QUARANTINED",
    "WORKER_PHASES",
    "cancel_age",
    "cancel_is_stale",
    "ending_for_lost_worker",
    "is_attachable",
    "is_completed",
    "is_interrupted",
    "is_lifecycle_busy",
    "is_quarantined",
    "is_queued",
    "is_running",
    "is_terminal",
    "is_wedged",
    "reaper_may_end",
    "worker_is_dead",
    "worker_is_live",
    "worker_should_stop",
]

#: Seconds a cancelling worker is given to unwind before it may be reclaimed.
DEFAULT_UNWIND_WINDOW: Final = 180.0

#: The phases of a run a worker holds (or held before it died): the only runs
#: :func:`reaper_may_end` and :func:`ending_for_lost_worker` can end, so the only rows the
#: reaper and restart recovery read (never the queue, however long it is).
WORKER_PHASES: Final = (Phase.RUNNING, Phase.CANCELLING)

_ATTACHABLE: Final = frozenset({Phase.QUEUED, Phase.RUNNING})

#: How the ``error`` of a quarantined run starts (:func:`is_quarantined`; the whole text is
#: written by :func:`heed.runs.ending.as_quarantined`).
QUARANTINED: Final = "quarantined:"


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


def is_queued(run: Run) -> bool:
    """Is the run waiting to start (``queued``)?"""
    return parse_phase(run.phase) is Phase.QUEUED


def is_running(run: Run) -> bool:
    """Is a worker executing the run right now (``running``, not yet cancelled)?"""
    return parse_phase(run.phase) is Phase.RUNNING


def is_completed(run: Run) -> bool:
    """Did the run finish its work and record a result (``completed``)?"""
    return parse_phase(run.phase) is Phase.COMPLETED


def is_interrupted(run: Run) -> bool:
    """Did the run end because its worker was lost or the server shut down?"""
    return parse_phase(run.phase) is Phase.INTERRUPTED


def is_quarantined(run: Run) -> bool:
    """Was the run quarantined: ``failed`` because its worker died ``max_attempts`` times
    (:func:`ending_for_lost_worker`)? It is terminal: nothing claims it again."""
    return (
        parse_phase(run.phase) is Phase.FAILED
        and run.attempts > 0
        and (run.error or "").startswith(QUARANTINED)
    )


def worker_should_stop(run: Run, worker_id: str | None = None) -> bool:
    """Should a local worker of this row stop? Yes once it is ``cancelling`` or terminal
    (another process cancelled or ended it), and, given this process's *worker_id*, once
    the row is no longer held by it (its lease expired and another process requeued the
    run, or another worker claimed it since: the work is someone else's now)."""
    if worker_id is not None and run.worker_id != worker_id:
        return True
    phase = parse_phase(run.phase)
    return phase is Phase.CANCELLING or phase in TERMINAL_PHASES


def ending_for_lost_worker(run: Run, max_attempts: int | None = None) -> Phase | None:
    """What becomes of a run whose worker is gone, for its kind's *max_attempts*
    (:attr:`heed.runs.kinds.KindSpec.max_attempts`).

    - ``cancelling``: ``cancelled``, whatever the kind (its journal already ends in
      ``cancelled``, and the user asked for it: a cancel is never requeued);
    - ``running`` of a kind without *max_attempts*: ``interrupted`` (never re-run);
    - ``running`` of a kind with it: ``queued`` (*requeued*: it starts again from the
      start) while this death, ``run.attempts + 1``, is below *max_attempts*; the death
      that reaches it gives ``failed`` (*quarantined*: :func:`is_quarantined`, never
      claimed again);
    - ``None`` for every other phase: a queued run keeps waiting, a terminal one stays as
      it is.
    """
    phase = parse_phase(run.phase)
    if phase is Phase.RUNNING and max_attempts is not None:
        return Phase.QUEUED if run.attempts + 1 < max_attempts else Phase.FAILED
    if phase is Phase.RUNNING:
        return Phase.INTERRUPTED
    if phase is Phase.CANCELLING:
        return Phase.CANCELLED
    return None


def reaper_may_end(run: Run, now: float, window: float = DEFAULT_UNWIND_WINDOW) -> bool:
    """May the reaper end this run (its worker is not in this process)? A ``cancelling``
    run when :func:`cancel_is_stale`; a ``running`` run whose lease expired."""
    phase = parse_phase(run.phase)
    if phase is Phase.CANCELLING:
        return cancel_is_stale(run, now, window)
    if phase is Phase.RUNNING:
        return not worker_is_live(run, now)
    return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def worker_is_dead(
    run: Run,
    now: float,
    own_worker_id: str,
    *,
    pid_alive: Callable[[int], bool] = _pid_alive,
    hostname: str | None = None,
) -> bool:
    """The restart rule: can no live process be running *run*'s worker?

    True without a live lease. With one: never for this process's own worker id; for
    another process on this host (worker ids are ``host:pid:nonce``), when that pid is
    this process's own (an earlier incarnation: containers restart as pid 1) or not alive;
    another host's lease is trusted.
    """
    if run.worker_id is None or not worker_is_live(run, now):
        return True
    if run.worker_id == own_worker_id:
        return False
    host, _, rest = run.worker_id.partition(":")
    pid_text, _, _nonce = rest.partition(":")
    if host != (hostname or socket.gethostname()) or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    return pid == os.getpid() or not pid_alive(pid)
