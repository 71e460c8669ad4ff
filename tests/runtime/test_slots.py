"""Lanes: bounded slots, bounded queues, cancelled waiters never start."""

from __future__ import annotations

import asyncio

import pytest

from heed.runtime import CancellationToken, Lane, LaneFull, OperationCancelled


async def test_slots_bound_concurrency_and_queue_is_fifo() -> None:
    lane = Lane("recall", capacity=2, max_queue=10)
    running = 0
    peak = 0
    order: list[int] = []

    async def work(i: int) -> None:
        nonlocal running, peak
        async with lane.slot():
            running += 1
            peak = max(peak, running)
            order.append(i)
            await asyncio.sleep(0.01)
            running -= 1

    await asyncio.gather(*(work(i) for i in range(8)))
    assert peak == 2
    assert order == list(range(8))
    assert lane.stats().in_use == 0 and lane.stats().queued == 0


async def test_full_queue_rejects_at_once() -> None:
    lane = Lane("recall", capacity=1, max_queue=1, retry_after=3)
    release = asyncio.Event()

    async def hold() -> None:
        async with lane.slot():
            await release.wait()

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0)
    waiter = asyncio.create_task(hold())
    await asyncio.sleep(0)
    assert lane.stats().queued == 1
    with pytest.raises(LaneFull) as caught:
        async with lane.slot():
            pass
    assert caught.value.retry_after == 3
    assert lane.stats().rejected_total == 1
    release.set()
    await asyncio.gather(holder, waiter)


async def test_work_cancelled_in_queue_never_starts() -> None:
    lane = Lane("recall", capacity=1, max_queue=5)
    release = asyncio.Event()
    started: list[str] = []

    async def hold() -> None:
        async with lane.slot():
            await release.wait()

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0)
    token = CancellationToken()

    async def queued() -> None:
        async with lane.slot(token):
            started.append("queued work")

    task = asyncio.create_task(queued())
    await asyncio.sleep(0.01)
    assert lane.stats().queued == 1
    token.cancel("client disconnected")
    with pytest.raises(OperationCancelled):
        await asyncio.wait_for(task, 1)
    assert lane.stats().queued == 0
    assert lane.stats().cancelled_in_queue_total == 1
    release.set()
    await holder
    assert started == []
    assert lane.stats().in_use == 0


async def test_already_cancelled_token_never_takes_a_slot() -> None:
    lane = Lane("recall", capacity=1, max_queue=1)
    token = CancellationToken()
    token.cancel("gone")
    with pytest.raises(OperationCancelled):
        async with lane.slot(token):
            pytest.fail("must not start")
    assert lane.stats().in_use == 0


async def test_task_cancelled_while_queued_leaves_the_queue() -> None:
    lane = Lane("recall", capacity=1, max_queue=5)
    release = asyncio.Event()

    async def hold() -> None:
        async with lane.slot():
            await release.wait()

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0)
    queued = asyncio.create_task(hold())
    await asyncio.sleep(0.01)
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    release.set()
    await holder
    stats = lane.stats()
    assert stats.in_use == 0 and stats.queued == 0


async def test_abandoned_counts_slots_of_cancelled_work() -> None:
    lane = Lane("recall", capacity=2, max_queue=0)
    token = CancellationToken()
    inside = asyncio.Event()
    release = asyncio.Event()

    async def hold() -> None:
        async with lane.slot(token):
            inside.set()
            await release.wait()

    task = asyncio.create_task(hold())
    await inside.wait()
    token.cancel("client disconnected")
    assert lane.stats().abandoned == 1 and lane.stats().in_use == 1
    release.set()
    await task
    assert lane.stats().abandoned == 0 and lane.stats().in_use == 0


def test_lane_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError):
        Lane("x", capacity=0, max_queue=1)
    with pytest.raises(ValueError):
        Lane("x", capacity=1, max_queue=-1)
