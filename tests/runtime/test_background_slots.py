"""Background work in lanes: interactive first, a reserved slot, aging, fair between tenants,
never shed or refused."""

from __future__ import annotations

import asyncio

import pytest

from heed.runtime import (
    CancellationToken,
    Lane,
    LaneFull,
    OperationCancelled,
    RequestContext,
    use_context,
)


def _as(tenant: str) -> RequestContext:
    return RequestContext(tenant=tenant, token=CancellationToken())


async def _hold(
    lane: Lane,
    name: str,
    release: asyncio.Event,
    order: list[str],
    *,
    background: bool = False,
    token: CancellationToken | None = None,
    tenant: str = "t",
) -> None:
    with use_context(_as(tenant)):
        async with lane.slot(token, background=background):
            order.append(name)
            await release.wait()


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_background_work_leaves_a_slot_for_interactive_work() -> None:
    lane = Lane("recall", capacity=2, max_queue=10)
    assert lane.background_capacity == 1
    order: list[str] = []
    releases = {name: asyncio.Event() for name in ("bg1", "bg2", "user")}
    bg1 = asyncio.create_task(_hold(lane, "bg1", releases["bg1"], order, background=True))
    await _settle()
    bg2 = asyncio.create_task(_hold(lane, "bg2", releases["bg2"], order, background=True))
    await _settle()
    # a slot is free, but it is kept for interactive work: the second background one queues
    assert order == ["bg1"]
    stats = lane.stats()
    assert (stats.in_use, stats.queued) == (1, 0)
    assert (stats.background_in_use, stats.background_queued) == (1, 1)
    user = asyncio.create_task(_hold(lane, "user", releases["user"], order))
    await _settle()
    assert order == ["bg1", "user"]  # at once, past the waiting background work
    releases["user"].set()
    await user
    await _settle()
    assert order == ["bg1", "user"]  # the freed slot stays kept for interactive work
    releases["bg1"].set()
    await bg1
    await _settle()
    assert order == ["bg1", "user", "bg2"]
    releases["bg2"].set()
    await bg2
    stats = lane.stats()
    assert (stats.in_use, stats.background_in_use, stats.background_queued) == (0, 0, 0)


async def test_with_spare_capacity_background_work_takes_every_slot_it_may() -> None:
    lane = Lane("retain", capacity=4, max_queue=10, background_capacity=3)
    order: list[str] = []
    release = asyncio.Event()
    tasks = [
        asyncio.create_task(_hold(lane, f"bg{i}", release, order, background=True))
        for i in range(3)
    ]
    await _settle()
    assert order == ["bg0", "bg1", "bg2"]
    assert lane.stats().background_in_use == 3
    release.set()
    await asyncio.gather(*tasks)


async def test_a_freed_slot_serves_interactive_waiters_before_background_ones() -> None:
    lane = Lane("recall", capacity=1, max_queue=10)
    order: list[str] = []
    release_holder, release_rest = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(_hold(lane, "holder", release_holder, order))
    await _settle()
    # the background waiter arrives first, then interactive ones of two tenants
    bg = asyncio.create_task(_hold(lane, "bg", release_rest, order, background=True))
    await _settle()
    users = [
        asyncio.create_task(_hold(lane, f"user{i}", release_rest, order, tenant=f"t{i % 2}"))
        for i in range(3)
    ]
    await _settle()
    assert (lane.stats().queued, lane.stats().background_queued) == (3, 1)
    release_rest.set()
    release_holder.set()
    await asyncio.gather(holder, bg, *users)
    assert order[0] == "holder"
    assert sorted(order[1:4]) == ["user0", "user1", "user2"]
    assert order[-1] == "bg"


async def test_a_background_waiter_takes_a_freed_slot_when_no_user_waits() -> None:
    lane = Lane("recall", capacity=1, max_queue=10)
    order: list[str] = []
    release_holder, release_bg = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(_hold(lane, "holder", release_holder, order))
    await _settle()
    bg = asyncio.create_task(_hold(lane, "bg", release_bg, order, background=True))
    await _settle()
    assert order == ["holder"] and lane.stats().background_queued == 1
    release_holder.set()
    await holder
    await _settle()
    assert order == ["holder", "bg"]
    assert lane.stats().background_in_use == 1 and lane.stats().background_queued == 0
    release_bg.set()
    await bg


async def test_an_interactive_waiter_leaving_lets_background_work_take_a_free_slot() -> None:
    # A dear waiter at its limit queues beside a free slot; background work waits behind it
    # and takes the slot as soon as the dear waiter leaves the queue.
    lane = Lane("recall", capacity=2, max_queue=10, dear_capacity=1, background_capacity=2)
    order: list[str] = []
    release = asyncio.Event()

    async def dear(name: str, token: CancellationToken | None = None) -> None:
        with use_context(_as("t")):
            async with lane.slot(token, cost=5.0, dear=True):
                order.append(name)
                await release.wait()

    dear1 = asyncio.create_task(dear("dear1"))
    await _settle()
    token = CancellationToken()
    dear2 = asyncio.create_task(dear("dear2", token))
    await _settle()
    bg = asyncio.create_task(_hold(lane, "bg", release, order, background=True))
    await _settle()
    assert order == ["dear1"]  # an interactive waiter is queued: background work waits
    token.cancel("client left")
    with pytest.raises(OperationCancelled):
        await asyncio.wait_for(dear2, 1)
    await _settle()
    assert order == ["dear1", "bg"]
    release.set()
    await asyncio.gather(dear1, bg)


async def _users_forever(lane: Lane, stop: asyncio.Event, order: list[str], i: int) -> None:
    with use_context(_as(f"user{i}")):
        while not stop.is_set():
            async with lane.slot():
                order.append(f"user{i}")
                await asyncio.sleep(0.01)


async def _background_behind_a_stream(max_defer: float | None, patience: float) -> list[str]:
    """A background waiter behind interactive workers that always keep a waiter queued;
    the order of grants until the background one ran or *patience* seconds passed."""
    lane = Lane("turn", capacity=1, max_queue=100, background_max_defer=max_defer)
    order: list[str] = []
    stop = asyncio.Event()
    users = [asyncio.create_task(_users_forever(lane, stop, order, i)) for i in range(3)]
    await asyncio.sleep(0.02)
    assert lane.stats().queued >= 1
    ran = asyncio.Event()

    async def background() -> None:
        async with lane.slot(background=True):
            order.append("bg")
            ran.set()

    bg = asyncio.create_task(background())
    try:
        await asyncio.wait_for(ran.wait(), patience)
    except TimeoutError:
        pass
    finally:
        stop.set()
    await asyncio.gather(*users)
    await asyncio.wait_for(bg, 5)
    return order


async def test_an_aged_background_waiter_is_served_behind_a_stream_of_users() -> None:
    order = await _background_behind_a_stream(max_defer=0.2, patience=10.0)
    # it ran while the users still queued (not only after they stopped): users kept
    # running after it
    index = order.index("bg")
    assert index < len(order) - 1, order
    assert any(name.startswith("user") for name in order[index + 1 :])


async def test_without_aging_background_work_waits_for_every_user() -> None:
    order = await _background_behind_a_stream(max_defer=None, patience=0.5)
    # over 0.5 s of users always queued, background work never got the slot
    assert order[-1] == "bg", order
    assert len(order) > 10


async def test_an_aged_background_waiter_goes_before_users_who_came_after_it() -> None:
    lane = Lane("turn", capacity=1, max_queue=100, background_max_defer=0.1)
    order: list[str] = []
    release_holder, release_rest = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(_hold(lane, "holder", release_holder, order))
    await _settle()
    early = asyncio.create_task(_hold(lane, "early", release_rest, order, tenant="a"))
    await asyncio.sleep(0.01)
    bg = asyncio.create_task(_hold(lane, "bg", release_rest, order, background=True))
    await asyncio.sleep(0.01)
    late = [
        asyncio.create_task(_hold(lane, f"late{i}", release_rest, order, tenant=f"b{i}"))
        for i in range(2)
    ]
    await asyncio.sleep(0.3)  # long past the background waiter's deferral
    assert order == ["holder"]
    release_rest.set()
    release_holder.set()
    await asyncio.gather(holder, early, bg, *late)
    assert order[:3] == ["holder", "early", "bg"]


async def test_cancelling_a_background_waiter_takes_it_out_at_once() -> None:
    lane = Lane("recall", capacity=2, max_queue=10)
    order: list[str] = []
    release = asyncio.Event()
    bg1 = asyncio.create_task(_hold(lane, "bg1", release, order, background=True))
    await _settle()
    token = CancellationToken()
    bg2 = asyncio.create_task(_hold(lane, "bg2", release, order, background=True, token=token))
    await _settle()
    assert lane.stats().background_queued == 1
    token.cancel("the bank was deleted")
    with pytest.raises(OperationCancelled):
        await asyncio.wait_for(bg2, 1)
    stats = lane.stats()
    assert stats.background_queued == 0 and stats.cancelled_in_queue_total == 1
    release.set()
    await bg1
    await _settle()
    assert order == ["bg1"]  # the cancelled one never started
    assert lane.stats().in_use == 0


async def test_a_background_slot_granted_as_its_task_is_cancelled_is_given_back() -> None:
    lane = Lane("recall", capacity=1, max_queue=10)
    started: list[str] = []

    async def background() -> None:
        async with lane.slot(background=True):
            started.append("bg")

    async with lane.slot():
        bg = asyncio.create_task(background())
        await _settle()
        assert lane.stats().background_queued == 1
    # the slot was just granted to the background waiter; cancel it before it resumes
    assert lane.stats().background_in_use == 1
    bg.cancel()
    with pytest.raises(asyncio.CancelledError):
        await bg
    assert started == []
    stats = lane.stats()
    assert (stats.in_use, stats.background_in_use, stats.background_queued) == (0, 0, 0)


async def test_background_waiters_are_never_shed_and_do_not_count_in_the_wait() -> None:
    lane = Lane("recall", capacity=1, max_queue=1, max_wait=0.3)
    async with lane.slot():  # teach the lane that a slot is held ~0.2 s
        await asyncio.sleep(0.2)
    order: list[str] = []
    release = asyncio.Event()
    holder = asyncio.create_task(_hold(lane, "holder", release, order))
    await _settle()
    expected = lane.expected_wait()
    bgs = [
        asyncio.create_task(_hold(lane, f"bg{i}", release, order, background=True))
        for i in range(3)
    ]
    await _settle()
    assert lane.stats().background_queued == 3
    assert lane.expected_wait() == expected  # 0.2 s: still under max_wait
    # an interactive waiter still queues: neither max_queue nor the expected wait
    # counts the background waiters
    user = asyncio.create_task(_hold(lane, "user", release, order))
    await _settle()
    assert lane.stats().queued == 1
    await asyncio.sleep(0.6)  # twice max_wait
    # the interactive waiter is shed for its wait; the background ones still wait
    with pytest.raises(LaneFull, match="kept this waiting"):
        await asyncio.wait_for(user, 1)
    stats = lane.stats()
    assert stats.background_queued == 3 and stats.shed_total == 1 and stats.rejected_total == 0
    release.set()
    await asyncio.gather(holder, *bgs)
    assert order == ["holder", "bg0", "bg1", "bg2"]


async def test_past_its_queue_a_tenants_background_work_is_deferred_not_refused() -> None:
    lane = Lane("retain", capacity=1, max_queue=10, background_max_queue=2, retry_after=4)
    order: list[str] = []
    release = asyncio.Event()
    holder = asyncio.create_task(_hold(lane, "holder", release, order))
    await _settle()
    waiting = [
        asyncio.create_task(_hold(lane, f"bg{i}", release, order, background=True))
        for i in range(5)
    ]
    await _settle()
    stats = lane.stats()
    # two queued, three deferred behind them; nothing refused
    assert (stats.background_queued, stats.background_deferred) == (2, 3)
    assert stats.rejected_total == 0 and not any(task.done() for task in waiting)
    release.set()
    await asyncio.wait_for(asyncio.gather(holder, *waiting), 5)
    assert order == ["holder", "bg0", "bg1", "bg2", "bg3", "bg4"]  # in order, all ran
    stats = lane.stats()
    assert (stats.background_queued, stats.background_deferred, stats.in_use) == (0, 0, 0)


async def test_background_slots_go_round_robin_over_tenants() -> None:
    """Finding 8 of issue 37: tenant A's 70 background waiters (mental-model refreshes)
    used to fill the one FIFO queue of 64, so B's refresh was refused at once. Now B's
    waits behind at most one of A's, and none of A's is refused either."""
    lane = Lane("reflect", capacity=2, max_queue=10, background_max_queue=64)
    assert lane.background_capacity == 1
    order: list[str] = []
    release = {name: asyncio.Event() for name in ("first", "rest")}
    first = asyncio.create_task(_hold(lane, "a0", release["first"], order, background=True))
    await _settle()
    flood = [
        asyncio.create_task(
            _hold(lane, f"a{i}", release["rest"], order, background=True, tenant="a")
        )
        for i in range(1, 70)
    ]
    await _settle()
    other = asyncio.create_task(
        _hold(lane, "b", release["rest"], order, background=True, tenant="b")
    )
    await _settle()
    stats = lane.stats()
    assert stats.rejected_total == 0 and not other.done()
    assert (stats.background_queued, stats.background_deferred) == (64 + 1, 5)
    release["rest"].set()
    release["first"].set()
    await asyncio.wait_for(asyncio.gather(first, other, *flood), 10)
    # a0 held the slot; a1 arrived first in A's queue, then B's turn came
    assert order[:3] == ["a0", "a1", "b"], order[:5]
    assert sorted(order) == sorted(["b", *(f"a{i}" for i in range(70))])


async def test_an_aged_tenant_does_not_jump_the_ring_over_a_younger_one() -> None:
    # Aging lets background work compete with interactive work; between tenants the ring
    # still decides: A's aged backlog does not keep B's newer waiter behind it.
    lane = Lane("reflect", capacity=2, max_queue=10, background_max_defer=0.05)
    order: list[str] = []
    release_first, release_rest = asyncio.Event(), asyncio.Event()
    first = asyncio.create_task(_hold(lane, "a0", release_first, order, background=True))
    await _settle()
    flood = [
        asyncio.create_task(_hold(lane, f"a{i}", release_rest, order, background=True, tenant="a"))
        for i in range(1, 6)
    ]
    await asyncio.sleep(0.2)  # A's waiters have aged
    other = asyncio.create_task(_hold(lane, "b", release_rest, order, background=True, tenant="b"))
    await _settle()
    release_rest.set()
    release_first.set()
    await asyncio.wait_for(asyncio.gather(first, other, *flood), 5)
    assert order[:3] == ["a0", "a1", "b"], order


async def test_a_deferred_waiter_ages_from_when_it_joined_its_queue() -> None:
    lane = Lane("turn", capacity=1, max_queue=10, background_max_queue=1, background_max_defer=0.1)
    order: list[str] = []
    release_holder, release_rest = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(_hold(lane, "holder", release_holder, order))
    await _settle()
    bgs = [
        asyncio.create_task(_hold(lane, f"bg{i}", release_rest, order, background=True))
        for i in range(2)
    ]
    await asyncio.sleep(0.3)  # past the deferral: the queued one has aged, the deferred not
    user = asyncio.create_task(_hold(lane, "user", release_rest, order, tenant="u"))
    await _settle()
    release_rest.set()
    release_holder.set()
    await asyncio.wait_for(asyncio.gather(holder, user, *bgs), 5)
    # bg0 aged before the user came: it goes first; bg1 joined the queue only then, so
    # the user (who arrived before it joined) goes next
    assert order == ["holder", "bg0", "user", "bg1"]


async def test_cancelling_a_deferred_background_waiter_takes_it_out_at_once() -> None:
    lane = Lane("retain", capacity=1, max_queue=10, background_max_queue=1)
    order: list[str] = []
    release = asyncio.Event()
    holder = asyncio.create_task(_hold(lane, "holder", release, order))
    await _settle()
    queued = asyncio.create_task(_hold(lane, "queued", release, order, background=True))
    token = CancellationToken()
    deferred = asyncio.create_task(
        _hold(lane, "deferred", release, order, background=True, token=token)
    )
    await _settle()
    assert lane.stats().background_deferred == 1
    token.cancel("the bank was deleted")
    with pytest.raises(OperationCancelled):
        await asyncio.wait_for(deferred, 1)
    stats = lane.stats()
    assert (stats.background_queued, stats.background_deferred) == (1, 0)
    release.set()
    await asyncio.gather(holder, queued)
    assert order == ["holder", "queued"]


async def test_background_work_cannot_be_dear() -> None:
    lane = Lane("recall", capacity=2, max_queue=1)
    with pytest.raises(ValueError, match="cannot be dear"):
        async with lane.slot(background=True, dear=True):
            pytest.fail("must not start")
    assert lane.stats().in_use == 0


def test_background_limits_default_and_are_checked() -> None:
    assert Lane("x", capacity=1, max_queue=1).background_capacity == 1
    assert Lane("x", capacity=4, max_queue=1).background_capacity == 3
    assert Lane("x", capacity=2, max_queue=1, background_capacity=9).background_capacity == 2
    with pytest.raises(ValueError, match="background_capacity >= 1"):
        Lane("x", capacity=2, max_queue=1, background_capacity=0)
    with pytest.raises(ValueError, match="background_max_defer"):
        Lane("x", capacity=2, max_queue=1, background_max_defer=-1.0)
    with pytest.raises(ValueError, match="background_max_queue >= 1"):
        Lane("x", capacity=2, max_queue=1, background_max_queue=0)


async def test_background_work_in_any_lane_waits_while_interactive_cpu_work_fills_the_cores() -> (
    None
):
    from heed.runtime import Lanes

    retain = Lane("retain", capacity=2, max_queue=10, cpu_bound=True)
    recall = Lane("recall", capacity=2, max_queue=10, cpu_bound=True)
    reflect = Lane("reflect", capacity=2, max_queue=10)
    lanes = Lanes([retain, recall, reflect], cores=2)
    order: list[str] = []
    releases = {name: asyncio.Event() for name in ("r1", "r2", "bg", "llm", "chat")}
    r1 = asyncio.create_task(_hold(retain, "r1", releases["r1"], order))
    r2 = asyncio.create_task(_hold(retain, "r2", releases["r2"], order))
    await _settle()
    assert lanes.cpu_budget.full()
    # The recall lane is idle, but both cores do a user's retains: background work waits,
    # in the recall lane and in the (not CPU-bound) reflect lane alike.
    bg = asyncio.create_task(_hold(recall, "bg", releases["bg"], order, background=True))
    llm = asyncio.create_task(_hold(reflect, "llm", releases["llm"], order, background=True))
    # Interactive work in a lane that is not CPU-bound is not counted and not held back.
    chat = asyncio.create_task(_hold(reflect, "chat", releases["chat"], order))
    await _settle()
    assert order == ["r1", "r2", "chat"]
    assert recall.stats().background_queued == 1 and reflect.stats().background_queued == 1
    releases["r1"].set()  # a core comes free: the waiting background work goes
    await _settle()
    assert sorted(order[3:]) == ["bg", "llm"]
    assert lanes.cpu_budget.held == 1  # background slots are not counted
    for event in releases.values():
        event.set()
    await asyncio.gather(r1, r2, bg, llm, chat)
    assert lanes.cpu_budget.held == 0


async def test_aged_background_work_goes_even_while_the_cores_are_full() -> None:
    from heed.runtime import Lanes

    retain = Lane("retain", capacity=2, max_queue=10, cpu_bound=True)
    recall = Lane("recall", capacity=2, max_queue=10, cpu_bound=True, background_max_defer=0.05)
    Lanes([retain, recall], cores=2)
    order: list[str] = []
    hold = asyncio.Event()
    users = [asyncio.create_task(_hold(retain, f"u{i}", hold, order)) for i in range(2)]
    await _settle()
    bg = asyncio.create_task(_hold(recall, "bg", hold, order, background=True))
    await _settle()
    assert "bg" not in order
    await asyncio.sleep(0.2)  # past background_max_defer: never starved forever
    assert "bg" in order
    hold.set()
    await asyncio.gather(*users, bg)


async def test_the_reserved_slot_is_lent_to_background_work_only_after_users_went_quiet() -> None:
    from heed.runtime import Lanes

    retain = Lane("retain", capacity=2, max_queue=10, cpu_bound=True)
    lanes = Lanes([retain], cores=2)
    order: list[str] = []
    user_done, background_done = asyncio.Event(), asyncio.Event()
    bg = asyncio.create_task(_hold(retain, "bg", background_done, order, background=True))
    await _settle()
    # Nobody has used the machine yet: the reserved slot is lent, and not counted against
    # background_capacity.
    with retain.lent_slot(0.2) as lent:
        assert lent
        assert retain.stats().in_use == 2 and retain.stats().background_in_use == 1
    assert retain.stats().in_use == 1
    user = asyncio.create_task(_hold(retain, "user", user_done, order))
    await _settle()
    with retain.lent_slot(0.2) as lent:
        assert not lent  # no slot free, and a user's work holds one
    user_done.set()
    await user
    with retain.lent_slot(0.2) as lent:
        assert not lent  # a user's work held a slot within the last 0.2 s
    await asyncio.sleep(0.3)
    assert lanes.cpu_budget.quiet(0.2)
    with retain.lent_slot(0.2) as lent:
        assert lent
    background_done.set()
    await bg


async def test_a_lent_slot_never_jumps_queued_background_work_or_keeps_it_waiting() -> None:
    from heed.runtime import Lanes

    retain = Lane("retain", capacity=2, max_queue=10, cpu_bound=True)
    Lanes([retain], cores=2)
    order: list[str] = []
    first, second = asyncio.Event(), asyncio.Event()
    one = asyncio.create_task(_hold(retain, "one", first, order, background=True))
    await _settle()
    two = asyncio.create_task(_hold(retain, "two", second, order, background=True))
    await _settle()
    assert order == ["one"] and retain.stats().background_queued == 1
    with retain.lent_slot(0.0) as lent:
        assert not lent  # "two" waits for a background slot: it goes first
    first.set()
    await one
    await _settle()
    assert order == ["one", "two"]
    # A lent slot beside "two"; when "two" ends, queued background work gets its slot at
    # once although the lent one is still held.
    with retain.lent_slot(0.0) as lent:
        assert lent
        three_done = asyncio.Event()
        three = asyncio.create_task(_hold(retain, "three", three_done, order, background=True))
        await _settle()
        assert "three" not in order
        second.set()
        await two
        await _settle()
        assert order[-1] == "three"
        three_done.set()
        await three
