"""What the run manager needs to know about a kind of run (:class:`KindSpec`).

Other components register their kinds with
:meth:`heed.runs.manager.RunManager.register` -- for example the memory engine
can register ``"retain"`` to run async retains as runs, getting cancel, the
journal, leases, the reaper and restart recovery for free::

    manager.register("retain", KindSpec(execute=do_retain, lane="retain"))
    run = await manager.submit("retain", tenant=..., payload={...}, summary={...})

``payload`` is the run's input, which only the worker reads (``rc.payload``);
``summary`` is the small part of it that listings show (see
:class:`~heed.runs.model.Run`).

``execute(rc)`` does the work. It runs under ``rc.ctx`` (a
:class:`~heed.runtime.RequestContext` whose token is the run's token, also the
active context), emits journal events with ``await rc.emit(type, data)`` (a
:class:`~heed.runs.events.EventType`), checks
``rc.token`` at checkpoints, and returns a JSON-able result dict (or ``None``).
Raising :class:`~heed.runtime.OperationCancelled` ends the run ``cancelled``;
any other exception ends it ``failed`` with the message as ``error``. It must
not swallow cancellation (``reraise_cancellation`` first in broad handlers).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from heed.runs.events import EventType
from heed.runtime import CancellationToken, RequestContext

if TYPE_CHECKING:
    from heed.runs.journal import Journal
    from heed.runs.model import Run, RunEvent

__all__ = ["Executor", "KindSpec", "RunContext", "TerminalHook"]


@dataclass
class RunContext:
    """What an executor gets: its run, its input (``payload``, read from the store for
    this worker alone), its token and context, and the journal."""

    run: Run
    ctx: RequestContext
    journal: Journal
    payload: dict[str, Any] = field(default_factory=dict)
    closed: bool = field(default=False)

    @property
    def token(self) -> CancellationToken:
        return self.ctx.token

    async def emit(self, type_: EventType, data: Mapping[str, Any]) -> RunEvent | None:
        """Append an event to this run's journal (durable, then fanned out).

        Returns ``None`` once the journal is closed (the run was cancelled: the
        client has already seen its terminal event); keep unwinding.
        """
        event = await self.journal.append(self.run.id, type_, data)
        if event is None:
            self.closed = True
        return event


Executor = Callable[[RunContext], Awaitable[dict[str, Any] | None]]
#: Called inside the transaction that makes a run terminal (any path: worker exit,
#: cancel of a queued run, reaper, restart recovery). Must be quick and may raise to
#: abort the whole transition (it is then retried later).
TerminalHook = Callable[["Run"], None]


@dataclass(frozen=True)
class KindSpec:
    """How to run one kind of run.

    - ``exclusive``: at most one lifecycle-busy run of this kind per session
      (chat turns); admission and start honour ``multitask_strategy``.
    - ``lane``: a :class:`~heed.runtime.Lane` name whose slot the worker holds.
    - ``on_terminal``: in-transaction hook when the run becomes terminal.
    - ``on_interrupted``: async hook after restart recovery marked it
      ``interrupted`` (e.g. store the partial output of a killed turn).
    - ``max_attempts``: what happens when the worker of a ``running`` run dies (its
      lease expired, its process is gone; see
      :func:`~heed.runs.state.ending_for_lost_worker`). ``None`` (turns, retains,
      reflects): the run is ``interrupted`` and never re-run. A number *N* >= 1: the
      run is **requeued** (``running -> queued``, ``attempts`` + 1, a ``requeued``
      journal event) and started again like any queued run, until its worker has died
      *N* times: then it is **quarantined** (``failed``, an error starting
      ``quarantined``, :func:`~heed.runs.state.is_quarantined`) and never claimed again.
      A cancelled run is never requeued (``cancelling`` whose worker died ends
      ``cancelled``), and an executor that raises fails the run as usual.

      A requeued run's executor runs **from the start**, with the same payload, while
      the journal keeps what the lost attempt wrote: the executor must be idempotent
      (doing the work twice, or resuming half-done work, must leave the same state as
      doing it once), and must not assume it is the first to run. It can read
      ``rc.run.attempts`` (the deaths so far) to tell.
    """

    execute: Executor
    exclusive: bool = False
    lane: str | None = None
    on_terminal: TerminalHook | None = None
    on_interrupted: Callable[[Run], Awaitable[None]] | None = None
    max_attempts: int | None = None

    def __post_init__(self) -> None:
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, not {self.max_attempts}")
