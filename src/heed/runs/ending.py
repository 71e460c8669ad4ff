"""How a run ends: the one place that makes a run terminal.

Every path that ends a run (its worker exits, a queued run is cancelled, the server drains,
the reaper reclaims a stale cancel or an expired lease, restart recovery) calls
:func:`end_run` with the :class:`Step` s that describe its transition. :func:`end_run`
promises, in this order:

1. **One transaction** holds every step's guarded transition (``RunStore.transition``), their
   journal events, and the kind's ``on_terminal`` hook once a step made the run terminal (a
   task's wakeup, say): either all of it is stored, or none.
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
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from heed.runs.model import Phase, Run, RunEvent
from heed.runs.state import is_interrupted, is_terminal

if TYPE_CHECKING:
    from heed.runs.manager import RunManager

__all__ = ["Step", "end_run"]

log = logging.getLogger("heed.runs.ending")


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
        events: list[RunEvent] = []
        final: Run | None = None
        with manager.store.transaction():
            for step in steps:
                t = manager.store.transition(
                    run_id,
                    step.to,
                    fields=step.fields,
                    event=step.event,
                    only_from=list(step.sources),
                    worker_id=step.worker_id,
                )
                if t is None:
                    continue
                if t.event is not None:
                    events.append(t.event)
                if is_terminal(t.run):
                    final = t.run
            if final is not None:
                spec = manager.kinds.get(final.kind)
                if spec is not None and spec.on_terminal is not None:
                    spec.on_terminal(final)
        return final, events

    final, events = await manager.io.call(write)
    manager.journal.publish(events)
    if final is None:
        return None
    if is_interrupted(final) and worker_gone:
        await manager.after_interrupted(final)
    else:
        await manager._notify(final, "finished")
    if dispatch and final.session_id is not None and not manager._closing:
        await manager.dispatch(final.session_id)
    return final
