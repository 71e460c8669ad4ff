"""Lanes: bounded slots, bounded queues, cancelled waiters never start."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from heed.runtime import (
    CancellationToken,
    Lane,
    LaneFull,
    OperationCancelled,
    RequestContext,
    use_context,
)


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


def _as(tenant: str) -> RequestContext:
    return RequestContext(tenant=tenant, token=CancellationToken())


async def _hold_until(lane: Lane, tenant: str, release: asyncio.Event, order: list[str]) -> None:
    with use_context(_as(tenant)):
        async with lane.slot():
            order.append(tenant)
            await release.wait()


async def test_freed_slots_go_round_robin_over_waiting_tenants() -> None:
    lane = Lane("recall", capacity=1, max_queue=100)
    order: list[str] = []
    release = asyncio.Event()
    blocker = asyncio.create_task(_hold_until(lane, "storm", asyncio.Event(), []))
    await asyncio.sleep(0)

    async def quick(tenant: str) -> None:
        with use_context(_as(tenant)):
            async with lane.slot():
                order.append(tenant)

    storm = [asyncio.create_task(quick("storm")) for _ in range(10)]
    await asyncio.sleep(0)
    calm = asyncio.create_task(quick("calm"))  # arrives after ten of the storm's
    await asyncio.sleep(0)
    blocker.cancel()
    await asyncio.gather(*storm, calm, return_exceptions=True)
    release.set()
    # FIFO would put "calm" last; fairness lets it in right after the storm's first waiter.
    assert order.index("calm") <= 1
    assert order.count("storm") == 10


async def test_a_full_queue_refuses_the_busiest_tenant_not_the_newcomer() -> None:
    lane = Lane("recall", capacity=1, max_queue=4)
    release = asyncio.Event()
    order: list[str] = []
    holder = asyncio.create_task(_hold_until(lane, "storm", release, order))
    await asyncio.sleep(0)
    storm = [asyncio.create_task(_hold_until(lane, "storm", release, order)) for _ in range(4)]
    await asyncio.sleep(0)
    assert lane.stats().queued == 4
    calm = asyncio.create_task(_hold_until(lane, "calm", release, order))
    await asyncio.sleep(0)
    displaced = storm[-1]
    with pytest.raises(LaneFull, match="this tenant holds most of its queue"):
        await displaced
    assert lane.stats().queued == 4 and lane.stats().shed_total == 1
    release.set()
    await asyncio.gather(holder, *storm[:-1], calm)
    assert order.count("calm") == 1 and order.count("storm") == 4
    # a lone tenant filling the queue is refused as before (nobody to displace)
    assert lane.stats().rejected_total == 0


async def test_the_expected_wait_sheds_at_once_and_a_long_wait_is_shed() -> None:
    lane = Lane("recall", capacity=1, max_queue=100, max_wait=0.3)
    # teach the lane that a slot is held ~0.2 s
    async with lane.slot():
        await asyncio.sleep(0.2)
    release = asyncio.Event()
    holder = asyncio.create_task(_hold_until(lane, "a", release, []))
    await asyncio.sleep(0)
    waiting = asyncio.create_task(_hold_until(lane, "a", release, []))  # expected 0.2 s: queues
    await asyncio.sleep(0)
    assert lane.stats().queued == 1
    with pytest.raises(LaneFull, match="would make this wait"):
        async with lane.slot():  # expected 0.4 s > 0.3 s: shed before it queues
            pass
    # the queued one is shed once it has waited max_wait
    with pytest.raises(LaneFull, match="kept this waiting"):
        await asyncio.wait_for(waiting, 2)
    assert lane.stats().queued == 0 and lane.stats().shed_total == 2
    release.set()
    await holder


async def test_cheap_work_overtakes_a_few_dear_waiters_but_not_all() -> None:
    lane = Lane("recall", capacity=1, max_queue=100)
    async with lane.slot():  # teach the lane that a slot is held ~0.05 s
        await asyncio.sleep(0.05)
    release = asyncio.Event()
    order: list[str] = []
    holder = asyncio.create_task(_hold_until(lane, "t", release, []))
    await asyncio.sleep(0)

    async def work(name: str, cost: float) -> None:
        with use_context(_as("t")):
            async with lane.slot(cost=cost):
                order.append(name)

    dear = [asyncio.create_task(work(f"dear{i}", 5.0)) for i in range(3)]
    await asyncio.sleep(0.3)  # long past the dear ones' handicap (4 x ~0.05 s)
    late_dear = asyncio.create_task(work("late-dear", 5.0))
    await asyncio.sleep(0)
    cheap = asyncio.create_task(work("cheap", 1.0))
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(holder, *dear, late_dear, cheap)
    # the cheap one overtakes the dear one that arrived just before it, not those that
    # have waited longer than their handicap
    assert order == ["dear0", "dear1", "dear2", "cheap", "late-dear"]


async def _hold(
    lane: Lane,
    name: str,
    release: asyncio.Event,
    order: list[str],
    *,
    cost: float = 1.0,
    dear: bool = False,
) -> None:
    with use_context(_as("t")):
        async with lane.slot(cost=cost, dear=dear):
            order.append(name)
            await release.wait()


async def test_dear_work_leaves_a_slot_for_cheap_work() -> None:
    lane = Lane("recall", capacity=2, max_queue=100, dear_capacity=1)
    order: list[str] = []
    releases = {name: asyncio.Event() for name in ("dear1", "dear2", "cheap")}
    dear1 = asyncio.create_task(_hold(lane, "dear1", releases["dear1"], order, cost=5.0, dear=True))
    await asyncio.sleep(0)
    dear2 = asyncio.create_task(_hold(lane, "dear2", releases["dear2"], order, cost=5.0, dear=True))
    await asyncio.sleep(0)
    # a slot is free, but not for dear work: the second dear request waits
    assert order == ["dear1"]
    assert (lane.stats().in_use, lane.stats().queued) == (1, 1)
    cheap = asyncio.create_task(_hold(lane, "cheap", releases["cheap"], order))
    await asyncio.sleep(0)
    assert order == ["dear1", "cheap"]  # at once, past the waiting dear request
    releases["cheap"].set()
    await cheap
    assert order == ["dear1", "cheap"]  # the freed slot stays kept for cheap work
    releases["dear1"].set()
    await dear1
    await asyncio.sleep(0)
    assert order == ["dear1", "cheap", "dear2"]
    releases["dear2"].set()
    await dear2
    assert lane.stats().in_use == 0 and lane.stats().queued == 0


async def test_a_freed_slot_skips_dear_waiters_at_their_limit() -> None:
    lane = Lane("recall", capacity=2, max_queue=100, dear_capacity=1)
    order: list[str] = []
    release_dear, release_first, release_rest = (asyncio.Event() for _ in range(3))
    holders = [
        asyncio.create_task(_hold(lane, "dear1", release_dear, order, cost=5.0, dear=True)),
        asyncio.create_task(_hold(lane, "cheap1", release_first, order)),
    ]
    await asyncio.sleep(0)
    # both slots held; a dear request queues ahead of a cheap one
    waiting = [
        asyncio.create_task(_hold(lane, "dear2", release_rest, order, cost=5.0, dear=True)),
        asyncio.create_task(_hold(lane, "cheap2", release_rest, order)),
    ]
    await asyncio.sleep(0)
    assert lane.stats().queued == 2
    release_first.set()  # cheap1's slot frees; dear work is at its limit of one
    await holders[1]
    await asyncio.sleep(0)
    assert order == ["dear1", "cheap1", "cheap2"]
    release_dear.set()
    await holders[0]
    await asyncio.sleep(0)
    assert order == ["dear1", "cheap1", "cheap2", "dear2"]
    release_rest.set()
    await asyncio.gather(*waiting)


async def test_without_a_dear_limit_dear_work_takes_every_slot() -> None:
    lane = Lane("recall", capacity=2, max_queue=100)
    order: list[str] = []
    release = asyncio.Event()
    tasks = [
        asyncio.create_task(_hold(lane, f"dear{i}", release, order, cost=5.0, dear=True))
        for i in range(2)
    ]
    await asyncio.sleep(0)
    assert order == ["dear0", "dear1"]
    release.set()
    await asyncio.gather(*tasks)


async def test_costly_work_not_marked_dear_takes_the_kept_slot() -> None:
    # A mid-budget recall costs more than a low one but is not dear: with one dear
    # recall running, it takes the slot kept from dear work instead of waiting.
    lane = Lane("recall", capacity=2, max_queue=100, dear_capacity=1)
    order: list[str] = []
    release = asyncio.Event()
    tasks = [
        asyncio.create_task(_hold(lane, "dear", release, order, cost=5.0, dear=True)),
        asyncio.create_task(_hold(lane, "mid", release, order, cost=2.0)),
    ]
    await asyncio.sleep(0)
    assert order == ["dear", "mid"]
    assert (lane.stats().in_use, lane.stats().queued) == (2, 0)
    release.set()
    await asyncio.gather(*tasks)


def test_only_high_budget_recalls_are_dear() -> None:
    from heed.memory.bank_config.view import settings_of_config
    from heed.memory.models import Budget
    from heed.memory.recall.budget import recall_size
    from heed.memory.recall.pipeline import slot_terms

    budgets: tuple[Budget, ...] = ("low", "mid", "high")
    sizes = (
        recall_size(settings_of_config({}), budget, 4096) for budget in budgets
    )  # a bank that sets nothing
    (low, low_dear), (mid, mid_dear), (high, high_dear) = map(slot_terms, sizes)
    assert (low_dear, mid_dear, high_dear) == (False, False, True)
    assert low == 1.0 < mid < high


def test_lane_rejects_a_dear_capacity_below_one() -> None:
    with pytest.raises(ValueError, match="dear_capacity >= 1"):
        Lane("recall", capacity=2, max_queue=1, dear_capacity=0)


def test_the_recall_lane_keeps_one_slot_for_low_budget_recalls(tmp_path: Path) -> None:
    from heed.services import build_lanes
    from heed.settings import Settings

    lanes = build_lanes(Settings(data_dir=tmp_path, recall_concurrency=4))
    assert (lanes["recall"].capacity, lanes["recall"].dear_capacity) == (4, 3)
    assert lanes["reflect"].dear_capacity == lanes["reflect"].capacity
    one = build_lanes(Settings(data_dir=tmp_path, recall_concurrency=1))
    assert one["recall"].dear_capacity == 1  # nothing to keep aside
    named = build_lanes(
        Settings(data_dir=tmp_path, recall_concurrency=4, recall_dear_concurrency=4)
    )
    assert named["recall"].dear_capacity == 4
