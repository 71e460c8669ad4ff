"""Refreshes that start by themselves: after retains and consolidations touch a model's scope.

A model's trigger says when: ``refresh_after_consolidation`` (a consolidation run of its
bank changed observations in a scope its tags filter passes:
:func:`heed.mental_models.values.tags_pass`) and heed's ``refresh_after_retain`` (a retain
wrote into its bank). The hooks (:meth:`RefreshTriggers.after_retain`, registered on
:attr:`heed.memory.engine.MemoryEngine.after_retain`, and
:meth:`RefreshTriggers.after_consolidation`, on
:attr:`heed.memory.learning.consolidation.Consolidation.after_consolidation`) are cheap: they note
the bank and return; one timer per bank waits :attr:`debounce` seconds of quiet, then reads
the bank's models once and submits a refresh of each model whose trigger fired, after its
minimum interval (:meth:`heed.mental_models.refresh.MentalModelRefreshes.remaining`). A
model whose refresh is busy is tried again after the next debounce, a bounded number of
times, so what was written meanwhile is read too. A bank delete stops its timers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from dataclasses import dataclass, field
from typing import Final

from heed.memory.bank_runs import BankTimers
from heed.memory.engine import MemoryEngine
from heed.memory.models import Bank, NotFound
from heed.mental_models.refresh import MentalModelRefreshes
from heed.mental_models.store import MentalModelStore
from heed.mental_models.values import MentalModel, scope_of, tags_pass
from heed.runtime import OperationCancelled, reraise_cancellation, run_in_thread

__all__ = ["RefreshTriggers"]

log = logging.getLogger("heed.mental_models")

#: Times a triggered refresh of a model whose refresh is busy is tried again.
BUSY_RETRIES: Final = 10


@dataclass
class _Pending:
    """What fired for one bank since its timer started."""

    retained: bool = False
    scopes: list[list[str]] = field(default_factory=list)


@dataclass(eq=False)
class RefreshTriggers:
    """Debounced triggered refreshes (see the module docstring)."""

    refreshes: MentalModelRefreshes
    engine: MemoryEngine
    store: MentalModelStore
    debounce: float

    def __post_init__(self) -> None:
        self._pending: dict[str, _Pending] = {}
        self._timers = BankTimers(self.engine)  # one per bank
        self._waits = BankTimers(self.engine)  # one per model, keyed by its id
        self.engine.after_retain.append(self.after_retain)
        self.engine.before_delete.append(self._forget)

    def after_retain(self, bank: Bank) -> None:
        """A retain wrote into *bank* (returns at once)."""
        self._note(bank).retained = True

    def after_consolidation(self, bank: Bank, scopes: list[list[str]]) -> None:
        """A consolidation of *bank* changed the observations of *scopes* (returns at once)."""
        self._note(bank).scopes.extend(scopes)

    def _note(self, bank: Bank) -> _Pending:
        pending = self._pending.setdefault(bank.ref, _Pending())
        self._timers.start(bank.ref, lambda: self._fire_later(bank))
        return pending

    @staticmethod
    def fired(model: MentalModel, pending: _Pending) -> bool:
        """Whether *pending* fires *model*'s trigger."""
        trigger = model.trigger
        if trigger.get("refresh_after_retain") and pending.retained:
            return True
        if trigger.get("refresh_after_consolidation"):
            tags, match = scope_of(model)
            return any(tags_pass(scope, tags, match) for scope in pending.scopes)
        return False

    async def _fire_later(self, bank: Bank) -> None:
        with contextlib.suppress(OperationCancelled, NotFound):
            try:
                await asyncio.sleep(self.debounce)
                pending = self._pending.pop(bank.ref, _Pending())
                models = await run_in_thread(self.store.mental_models, bank.ref, False)
                for model in models:
                    if self.fired(model, pending):
                        self._waits.start(
                            bank.ref, functools.partial(self._refresh, bank, model), model.id
                        )
            except Exception as exc:
                reraise_cancellation(exc)
                log.warning(
                    "mental model triggers of bank %s failed: %s", bank.bank_id, exc, exc_info=exc
                )

    async def _refresh(self, bank: Bank, model: MentalModel) -> None:
        """Submit a triggered refresh of *model* once its interval allows; while one is busy,
        again after each debounce (at most :data:`BUSY_RETRIES` times)."""
        with contextlib.suppress(OperationCancelled, NotFound):
            try:
                for _ in range(BUSY_RETRIES):
                    await asyncio.sleep(self.refreshes.remaining(bank, model))
                    current = await run_in_thread(self.store.get_mental_model, bank.ref, model.id)
                    if current is None:
                        return
                    wait = self.refreshes.remaining(bank, current)
                    if wait > 0:
                        model = current
                        continue
                    _, deduplicated = await self.refreshes.submit(
                        bank, current, "trigger", enforce_interval=False
                    )
                    if not deduplicated:
                        return
                    await asyncio.sleep(self.debounce)
            except Exception as exc:
                reraise_cancellation(exc)
                log.warning(
                    "a triggered refresh of %s could not start: %s", model.id, exc, exc_info=exc
                )

    async def _forget(self, bank: Bank) -> None:
        """Forget what fired for the bank (a bank delete's hook; its timers stop by theirs)."""
        self._pending.pop(bank.ref, None)

    async def aclose(self) -> None:
        """Stop every timer (runs are the manager's)."""
        await self._timers.aclose()
        await self._waits.aclose()
