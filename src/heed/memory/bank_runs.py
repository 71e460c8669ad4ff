"""The runs of a bank: what every run that works on one bank shares, in one place.

A bank's runs (async retains, consolidations, mental model refreshes, streamed reflects,
transfers) are grouped per bank (``session_id = "bank:<ref>"``: :func:`bank_session`) and
carry the bank they were submitted for (:func:`bank_payload`: its id and its ``ref``, the
internal id a new bank of the same id does not share). This module holds the rules they
share:

- **the prelude** (:func:`run_bank`, :func:`bank_run`): a run starts by looking its bank up
  again; a bank that is missing, or was replaced by a new bank of the same id meanwhile,
  ends the run ``cancelled`` with reason :data:`~heed.memory.engine.BANK_DELETED`, before
  it does anything (a run never lands in a new bank of its bank's id);
- **the kinds and the status map**: which kinds of run a bank's operations are
  (:data:`OPERATION_KINDS`) and Hindsight's status of a run phase (:func:`status_of`);
- **the delete**: :func:`cancel_on_delete` registers, as an engine ``before_delete`` hook,
  the cancel of the bank's unfinished runs of some kinds (:func:`cancel_bank_runs`: reason
  ``bank deleted``, waiting until their workers stopped); :class:`BankRunService` is the
  base of a service whose runs are a bank's, registering it when the service is built;
- **owned per-bank timers** (:class:`BankTimers`): background tasks keyed by bank, at most
  one per key, cancelled when their bank is deleted and stopped (and awaited, through
  :func:`heed.runtime.settle`) by ``aclose``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from heed.memory.engine import BANK_DELETED, MemoryEngine
from heed.memory.models import Bank, NotFound
from heed.runs.kinds import RunContext
from heed.runs.manager import RunManager
from heed.runs.model import Phase, Run, parse_phase
from heed.runtime import OperationCancelled, settle

__all__ = [
    "BANK_PREFIX",
    "CONSOLIDATION_KIND",
    "MENTAL_MODEL_REFRESH_KIND",
    "OPERATION_KINDS",
    "RETAIN_KIND",
    "TRANSFER_KINDS",
    "BankRunService",
    "BankTimers",
    "bank_payload",
    "bank_run",
    "bank_session",
    "cancel_bank_runs",
    "cancel_on_delete",
    "run_bank",
    "status_of",
    "status_of_phase",
]

#: Async retains (:mod:`heed.memory.retain.operations`).
RETAIN_KIND: Final = "retain"
#: Consolidation runs (:mod:`heed.memory.learning.consolidation`), listed with the bank's retains.
CONSOLIDATION_KIND: Final = "consolidation"
#: Mental model refreshes (:mod:`heed.mental_models.refresh`), listed with them too.
MENTAL_MODEL_REFRESH_KIND: Final = "mental_model_refresh"
#: Bank transfers: exports, imports and clones.
TRANSFER_KINDS: Final = ("bank_export", "bank_import", "bank_clone")
#: The kinds of run a bank's operations are.
OPERATION_KINDS: Final = (
    RETAIN_KIND,
    CONSOLIDATION_KIND,
    MENTAL_MODEL_REFRESH_KIND,
    *TRANSFER_KINDS,
)

_STATUS: Final = {
    Phase.QUEUED: "pending",
    Phase.RUNNING: "processing",
    Phase.CANCELLING: "processing",
    Phase.CANCELLED: "cancelled",
    Phase.COMPLETED: "completed",
    Phase.FAILED: "failed",
    Phase.INTERRUPTED: "failed",
}


def status_of(run: Run) -> str:
    """Hindsight's status for a run phase (``cancelling`` is still ``processing``)."""
    return status_of_phase(run.phase)


def status_of_phase(phase: str) -> str:
    """Hindsight's status for a stored phase string (unknown or blank: ``failed``)."""
    parsed = parse_phase(phase)
    return _STATUS.get(parsed, "failed") if parsed is not None else "failed"


#: How a bank's runs are grouped: ``session_id`` is this and the bank's ref.
BANK_PREFIX: Final = "bank:"


def bank_session(bank: Bank) -> str:
    """The run-group key of a bank's runs."""
    return BANK_PREFIX + bank.ref


def bank_payload(bank: Bank) -> dict[str, str]:
    """What a bank's run carries of its bank, for :func:`run_bank`: its id and its ref."""
    return {"bank_id": bank.bank_id, "bank_ref": bank.ref}


async def run_bank(engine: MemoryEngine, rc: RunContext) -> Bank:
    """The prelude of every bank run: the bank the run's payload names (:func:`bank_payload`),
    looked up again for the run's tenant. :class:`OperationCancelled` with reason
    :data:`BANK_DELETED` when it is missing, or when the bank of that id now is another one
    (deleted and re-created meanwhile)."""
    try:
        bank = await engine.get_bank(rc.payload["bank_id"], tenant=rc.run.tenant)
    except NotFound as exc:
        raise OperationCancelled(BANK_DELETED) from exc
    if bank.ref != rc.payload["bank_ref"]:
        raise OperationCancelled(BANK_DELETED)
    return bank


@asynccontextmanager
async def bank_run(engine: MemoryEngine, rc: RunContext) -> AsyncIterator[Bank]:
    """:func:`run_bank`, and a body in which :class:`NotFound` (the bank deleted while the
    run worked: here, or by another process, whose delete a write sees as ``BankGone``)
    ends the run as the prelude does: :class:`OperationCancelled` with reason
    :data:`BANK_DELETED`."""
    bank = await run_bank(engine, rc)
    try:
        yield bank
    except NotFound as exc:
        raise OperationCancelled(BANK_DELETED) from exc


async def cancel_bank_runs(manager: RunManager, bank: Bank, kind: str) -> None:
    """Cancel the bank's unfinished runs of *kind* (reason ``bank deleted``) and wait until
    their workers stopped."""
    runs = await manager.io.call(
        manager.store.list_runs,
        tenant=bank.tenant,
        session_id=bank_session(bank),
        kind=kind,
        non_terminal=True,
    )
    for run in runs:
        await manager.cancel(run.id, BANK_DELETED, tenant=bank.tenant, wait=True)


def cancel_on_delete(engine: MemoryEngine, manager: RunManager, *kinds: str) -> None:
    """Register with *engine* that deleting a bank first cancels its unfinished runs of
    *kinds* and waits until they stopped (:func:`cancel_bank_runs`, in order)."""

    async def cancel(bank: Bank) -> None:
        for kind in kinds:
            await cancel_bank_runs(manager, bank, kind)

    engine.before_delete.append(cancel)


@dataclass(eq=False)
class BankRunService:
    """The base of a service that runs work on banks through *manager* (its run kinds,
    :attr:`KINDS`) over *engine*: built, it registers with *engine* that deleting a bank
    first cancels the bank's unfinished runs of those kinds (:func:`cancel_on_delete`). A
    subclass adds its own fields (a dataclass's, after these two) and, when it has more to
    do once built, extends :meth:`__post_init__`."""

    manager: RunManager
    engine: MemoryEngine
    #: The run kinds a bank delete cancels, in order.
    KINDS: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        cancel_on_delete(self.engine, self.manager, *self.KINDS)


class BankTimers:
    """Background tasks owned per bank: at most one per ``(bank ref, key)``.

    Made with an engine, they die with their bank: deleting a bank cancels its tasks (a
    ``before_delete`` hook, registered at construction; it does not wait for them).
    :meth:`aclose` cancels every task and returns once all have finished
    (:func:`heed.runtime.settle`). A task leaves the set when it ends.
    """

    def __init__(self, engine: MemoryEngine | None = None) -> None:
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        if engine is not None:
            engine.before_delete.append(self._on_delete)

    def running(self, bank_ref: str, key: str = "") -> bool:
        """Whether a task of *bank_ref* under *key* has not ended yet."""
        return (bank_ref, key) in self._tasks

    def start(
        self, bank_ref: str, work: Callable[[], Coroutine[Any, Any, None]], key: str = ""
    ) -> bool:
        """Start ``work()`` as the task of *bank_ref* under *key*, unless one runs (then
        *work* is not called). Whether it was started. Call from the event loop."""
        slot = (bank_ref, key)
        if slot in self._tasks:
            return False
        task = asyncio.get_running_loop().create_task(work())
        self._tasks[slot] = task
        task.add_done_callback(lambda done: self._ended(slot, done))
        return True

    def _ended(self, slot: tuple[str, str], task: asyncio.Task[None]) -> None:
        if self._tasks.get(slot) is task:
            del self._tasks[slot]

    def cancel_bank(self, bank_ref: str) -> None:
        """Cancel every task of *bank_ref* (without waiting for them)."""
        for slot in [s for s in self._tasks if s[0] == bank_ref]:
            self._tasks.pop(slot).cancel()

    async def _on_delete(self, bank: Bank) -> None:
        self.cancel_bank(bank.ref)

    async def aclose(self) -> None:
        """Cancel every task and return once each has finished."""
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            await settle(task)
