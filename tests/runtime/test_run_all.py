"""run_all: pieces of work side by side, bounded, in order, the first failure itself."""

from __future__ import annotations

import asyncio

import pytest

from heed.runtime import CancellationToken, OperationCancelled, RequestContext, run_all, use_context


async def test_results_keep_their_order_and_the_limit_holds() -> None:
    running = 0
    most = 0

    def piece(n: int):  # type: ignore[no-untyped-def]
        async def work() -> int:
            nonlocal running, most
            running += 1
            most = max(most, running)
            await asyncio.sleep(0.01 * (5 - n % 5))  # later pieces finish first
            running -= 1
            return n

        return work

    assert await run_all([piece(n) for n in range(12)], 3) == list(range(12))
    assert most == 3


async def test_the_first_failure_is_raised_itself_and_stops_the_others() -> None:
    stopped: list[int] = []

    def slow(n: int):  # type: ignore[no-untyped-def]
        async def work() -> int:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                stopped.append(n)
                raise
            return n

        return work

    async def fails() -> int:
        await asyncio.sleep(0.01)
        raise ValueError("upstream said no")

    with pytest.raises(ValueError, match="upstream said no"):  # not an ExceptionGroup
        await run_all([slow(0), fails, slow(2)], 3)
    assert sorted(stopped) == [0, 2]


async def test_an_operation_cancelled_in_a_piece_is_raised_as_is() -> None:
    token = CancellationToken()

    async def waits() -> None:
        await token.wait()
        token.raise_if_cancelled()

    async def cancels() -> None:
        await asyncio.sleep(0.01)
        token.cancel("client left")

    with use_context(RequestContext(token=token)), pytest.raises(OperationCancelled):
        await run_all([waits, cancels], 2)


async def test_cancelling_the_caller_returns_only_once_every_piece_stopped() -> None:
    ended: list[str] = []

    def piece(name: str):  # type: ignore[no-untyped-def]
        async def work() -> None:
            try:
                await asyncio.sleep(30)
            finally:
                await asyncio.sleep(0.05)  # unwinding takes a while
                ended.append(name)

        return work

    caller = asyncio.ensure_future(run_all([piece("a"), piece("b")], 2))
    await asyncio.sleep(0.02)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert sorted(ended) == ["a", "b"]


async def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="limit"):
        await run_all([], 0)
