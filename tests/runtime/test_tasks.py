"""heed.runtime.settle: never return before the child has finished."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from heed.runtime import settle


async def test_settle_waits_for_a_child_that_ignores_the_first_cancel() -> None:
    finished = threading.Event()

    async def stubborn() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.to_thread(time.sleep, 0.2)  # unwinding takes a while
            finished.set()
            raise

    child = asyncio.create_task(stubborn())
    await asyncio.sleep(0.01)
    await settle(child)
    assert finished.is_set() and child.cancelled()


async def test_a_caller_cancelled_twice_still_waits_for_the_child() -> None:
    release = threading.Event()
    stops: list[float] = []

    def blocking() -> str:
        release.wait(5)
        return "done"

    child = asyncio.ensure_future(asyncio.to_thread(blocking))

    def stop() -> None:
        stops.append(time.monotonic())
        if len(stops) == 2:
            asyncio.get_running_loop().call_later(0.2, release.set)

    async def caller() -> None:
        await settle(child, stop)

    task = asyncio.create_task(caller())
    await asyncio.sleep(0.01)
    task.cancel()  # the caller is cancelled while it waits for the child
    with pytest.raises(asyncio.CancelledError):
        await task
    assert child.done() and child.result() == "done"  # it was not abandoned
    assert len(stops) == 2  # asked to stop once, and again when the caller was cancelled


async def test_settle_of_a_done_child_does_not_stop_it() -> None:
    child = asyncio.ensure_future(asyncio.sleep(0))
    await child

    def stop() -> None:
        raise AssertionError("a finished child is never stopped")

    await settle(child, stop)
