"""Budgets of a bank's background LLM work: tokens per clock hour and per UTC day.

A bank's ``llm_budget_tokens_per_hour`` and ``llm_budget_tokens_per_day`` (bank settings;
the server's defaults ``HEED_LLM_BUDGET_TOKENS_PER_HOUR`` and ``_PER_DAY``; unset: no budget)
bound the tokens its learning spends: the kinds of :data:`LEARNING_KINDS` (extraction,
consolidation, mental-model refreshes), as every LLM call's record counts them (prompt and
completion tokens: :mod:`heed.llm.usage`). What a window has spent is read where those
records are kept (:meth:`heed.observability.Observability.spent`: the stored hourly usage
plus what this process has not written yet), so instances sharing a database see each
other's spend within one flush interval.

:meth:`LlmBudgets.admit` is awaited before each call (:func:`heed.llm.metered.metered_stream`)
and promises:

- **Background calls only wait.** A call made inside background work
  (``llm_work(..., background=True)``: a consolidation, a refresh, an asynchronous retain's
  extraction) starts only while what its window spent, plus an estimate of each of the bank's
  calls in flight (its prompt's tokens and its reply's cap), is below the budget; a user's
  call is never held, but a synchronous retain's extraction counts in the spend. So a
  window's spend passes its budget by at most about one call.
- **It waits, with a reason, and resumes.** A held call waits until the window that is
  spent ends (the next clock hour, or the next UTC day), the bank's budget changes
  (:meth:`LlmBudgets.poke`, called on every bank settings change), or its token is
  cancelled (then it leaves at once). While it waits, the run it belongs to is told once
  (:meth:`heed.runtime.TokenTally.waiting`: a consolidation or refresh journals a
  ``progress`` event with ``waiting: "llm_budget"``, the reason and ``resumes_at``). Its
  facts stay pending: nothing fails because a budget was reached.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from heed.llm.base import ChatMessage
from heed.llm.usage import LlmWork, count_tokens, wall_clock
from heed.runtime import current_tally, wait_for_event

__all__ = ["LEARNING_KINDS", "Budget", "BudgetWait", "LlmBudgets"]

LEARNING_KINDS: Final = ("extraction", "consolidation", "mental_model_refresh")
"""The kinds of LLM work a bank's budget counts."""

HOUR: Final = 3600
DAY: Final = 86_400

#: How often a waiting call looks again although nothing woke it (a budget raised by another
#: instance, whose change this process hears of only through its database).
RECHECK_SECONDS: Final = 60.0


@dataclass(frozen=True, slots=True)
class Budget:
    """A bank's budgets in tokens (``None``: none for that window)."""

    per_hour: int | None = None
    per_day: int | None = None


@dataclass(frozen=True, slots=True)
class BudgetWait:
    """Why a call waits: the window spent, its budget, what it spent, and when it ends."""

    window: str
    budget: int
    spent: int
    resumes_at: float

    @property
    def reason(self) -> str:
        when = datetime.fromtimestamp(self.resumes_at, UTC).isoformat(timespec="seconds")
        return (
            f"the bank's LLM budget of {self.budget} tokens per {self.window} is spent "
            f"({self.spent} tokens); background work resumes at {when}"
        )

    def as_event(self) -> dict[str, object]:
        when = datetime.fromtimestamp(self.resumes_at, UTC).isoformat(timespec="seconds")
        return {"waiting": "llm_budget", "reason": self.reason, "resumes_at": when}


#: What :meth:`LlmBudgets._wait_for` answers while the bank's calls in flight may spend
#: what is left: wait for one of them to end (not reported: it is a moment).
_IN_FLIGHT: Final = BudgetWait("in flight", 0, 0, 0.0)

BudgetOf = Callable[[str, str], Awaitable[Budget | None]]
SpentSince = Callable[[str, str, float], Awaitable[int]]


class LlmBudgets:
    """The budgets of one server's banks (see the module docstring).

    *budget_of(tenant, bank_id)* is the bank's :class:`Budget` (``None``: the bank is gone,
    no budget applies); *spent_since(tenant, bank_id, since)* the tokens of
    :data:`LEARNING_KINDS` the bank spent since the epoch second *since*; *clock* the
    wall clock calls are timed by (:func:`heed.llm.usage.wall_clock`).
    """

    def __init__(
        self,
        budget_of: BudgetOf,
        spent_since: SpentSince,
        clock: Callable[[], float] = wall_clock,
    ) -> None:
        self.budget_of = budget_of
        self.spent_since = spent_since
        self.clock = clock
        self._in_flight: dict[tuple[str, str], int] = {}
        self._changed = asyncio.Event()
        #: How many times a call waited for a budget (a figure for tests and metrics).
        self.waits = 0

    def poke(self) -> None:
        """Something a waiting call depends on changed (a bank's settings, the clock):
        every waiting call looks again."""
        self._changed.set()
        self._changed = asyncio.Event()

    @contextlib.asynccontextmanager
    async def admit(
        self, work: LlmWork | None, messages: Sequence[ChatMessage], max_tokens: int | None
    ) -> AsyncIterator[None]:
        """Hold the call while its bank's budget is spent (background work only), then
        count its estimate as in flight until the block ends."""
        if work is None or not work.tenant or not work.bank_id or work.kind not in LEARNING_KINDS:
            yield
            return
        key = (work.tenant, work.bank_id)
        estimate = sum(count_tokens(m.content) for m in messages) + (max_tokens or 512)
        if work.background:
            await self._until_allowed(key)
        self._in_flight[key] = self._in_flight.get(key, 0) + estimate
        try:
            yield
        finally:
            left = self._in_flight.get(key, 0) - estimate
            if left > 0:
                self._in_flight[key] = left
            else:
                self._in_flight.pop(key, None)
            self.poke()  # a call of the bank waiting for this one looks again

    async def _until_allowed(self, key: tuple[str, str]) -> None:
        told = False
        while (wait := await self._wait_for(key)) is not None:
            if wait is _IN_FLIGHT:  # the bank's calls in flight may spend it: see what they do
                await self._sleep(RECHECK_SECONDS)
                continue
            self.waits += 1
            tally = current_tally()
            if not told and tally is not None:
                told = True
                await tally.waiting(wait.as_event())
            await self._sleep(min(RECHECK_SECONDS, max(0.0, wait.resumes_at - self.clock())))

    async def _wait_for(self, key: tuple[str, str]) -> BudgetWait | None:
        """Why a call of bank *key* must wait now (:data:`_IN_FLIGHT`: until one of the
        bank's calls in flight ends), or ``None`` when it may start."""
        budget = await self.budget_of(*key)
        if budget is None:
            return None
        now = self.clock()
        in_flight = self._in_flight.get(key, 0)
        crowded = False
        for window, limit, size in (("hour", budget.per_hour, HOUR), ("day", budget.per_day, DAY)):
            if limit is None:
                continue
            start = now // size * size
            spent = await self.spent_since(*key, start)
            if spent >= limit:
                return BudgetWait(window, limit, spent, start + size)
            crowded = crowded or spent + in_flight >= limit
        return _IN_FLIGHT if crowded else None

    async def _sleep(self, seconds: float) -> None:
        """Sleep *seconds*, waking early on :meth:`poke`; raises when the token is cancelled."""
        await wait_for_event(self._changed, seconds)
