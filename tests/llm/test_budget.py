"""Budgets of background LLM work (heed.llm.budget): who waits, why, and when it resumes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from heed.llm import ChatMessage
from heed.llm.budget import DAY, HOUR, Budget, LlmBudgets
from heed.llm.usage import LlmWork
from heed.runtime import (
    CancellationToken,
    OperationCancelled,
    RequestContext,
    tallying,
    use_context,
)

PROMPT = [ChatMessage.user("twelve chars")]
T0 = 1_800_000_000.0 // DAY * DAY + 10 * HOUR  # 10:00 UTC on some day


class Bank:
    """One bank's budget and spend, and a clock the test moves."""

    def __init__(self, budget: Budget | None) -> None:
        self.budget = budget
        self.spent: list[tuple[float, int]] = []  # (when, tokens)
        self.now = T0

    async def budget_of(self, tenant: str, bank_id: str) -> Budget | None:
        return self.budget

    async def spent_since(self, tenant: str, bank_id: str, since: float) -> int:
        return sum(tokens for when, tokens in self.spent if when >= since)

    def budgets(self) -> LlmBudgets:
        return LlmBudgets(self.budget_of, self.spent_since, clock=lambda: self.now)


def work(background: bool = True, kind: str = "consolidation") -> LlmWork:
    return LlmWork("tenant", "bank", kind, background)


async def test_a_background_call_waits_once_the_day_is_spent_and_resumes_the_next() -> None:
    bank = Bank(Budget(per_day=1000))
    budgets = bank.budgets()
    bank.spent.append((T0 - HOUR, 1000))
    told: list[dict[str, Any]] = []

    async def on_wait(why: dict[str, Any]) -> None:
        told.append(why)

    async def background_call() -> None:
        with tallying("run-1", on_wait):
            async with budgets.admit(work(), PROMPT, 50):
                pass

    waiting = asyncio.ensure_future(background_call())
    await asyncio.sleep(0.05)
    assert not waiting.done()
    assert len(told) == 1 and told[0]["waiting"] == "llm_budget"
    assert "1000 tokens per day" in told[0]["reason"]
    assert told[0]["resumes_at"].startswith("20") and told[0]["resumes_at"].endswith(
        "00:00:00+00:00"
    )
    bank.now = T0 + DAY  # the next UTC day
    budgets.poke()
    await asyncio.wait_for(waiting, 1)
    assert len(told) == 1  # told once per wait


async def test_the_hour_window_holds_too_and_a_raised_budget_resumes_at_once() -> None:
    bank = Bank(Budget(per_hour=100))
    budgets = bank.budgets()
    bank.spent.append((T0, 150))

    async def background_call() -> None:
        async with budgets.admit(work(), PROMPT, 10):
            pass

    waiting = asyncio.ensure_future(background_call())
    await asyncio.sleep(0.05)
    assert not waiting.done()
    bank.budget = Budget(per_hour=10_000)
    budgets.poke()
    await asyncio.wait_for(waiting, 1)


async def test_users_calls_and_other_kinds_are_never_held() -> None:
    bank = Bank(Budget(per_day=10))
    budgets = bank.budgets()
    bank.spent.append((T0, 10_000))
    for held_not in (work(background=False), work(kind="reflect"), work(kind="turn")):
        async with asyncio.timeout(1), budgets.admit(held_not, PROMPT, 10):
            pass
    async with asyncio.timeout(1), budgets.admit(None, PROMPT, 10):
        pass


async def test_no_budget_holds_nothing() -> None:
    for budget in (None, Budget()):
        bank = Bank(budget)
        bank.spent.append((T0, 10**9))
        async with asyncio.timeout(1), bank.budgets().admit(work(), PROMPT, 10):
            pass


async def test_calls_in_flight_count_so_the_spend_passes_the_budget_by_one_call_at_most() -> None:
    bank = Bank(Budget(per_day=1000))
    budgets = bank.budgets()
    bank.spent.append((T0, 900))
    first_done = asyncio.Event()

    async def first() -> None:
        async with budgets.admit(work(), PROMPT, 200):  # 900 spent, nothing in flight: starts
            await first_done.wait()
            bank.spent.append((bank.now, 250))  # its record, before it leaves the flight

    async def second() -> None:
        async with budgets.admit(work(), PROMPT, 200):
            pass

    one = asyncio.ensure_future(first())
    await asyncio.sleep(0.02)
    two = asyncio.ensure_future(second())
    await asyncio.sleep(0.05)
    assert not two.done()  # 900 + the first's estimate reach the budget: it waits for it
    first_done.set()
    await one
    await asyncio.sleep(0.05)
    assert not two.done()  # 1150 spent: now it waits for the next day
    bank.now = T0 + DAY
    budgets.poke()
    await asyncio.wait_for(two, 1)


async def test_a_waiting_call_leaves_when_its_token_is_cancelled() -> None:
    bank = Bank(Budget(per_day=1))
    budgets = bank.budgets()
    bank.spent.append((T0, 5))
    token = CancellationToken()

    async def background_call() -> None:
        with use_context(RequestContext(token=token)):
            async with budgets.admit(work(), PROMPT, 10):
                pass

    waiting = asyncio.ensure_future(background_call())
    await asyncio.sleep(0.05)
    token.cancel("operation cancelled")
    with pytest.raises(OperationCancelled):
        await asyncio.wait_for(waiting, 0.5)
