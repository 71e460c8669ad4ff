"""The run manager: admission strategies, cancel semantics, reaper, recovery."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from heed.runs.manager import RunConflict, RunManager, RunNotFound
from heed.runs.model import Phase
from heed.runs.reaper import Reaper, reap_once, renew_leases
from heed.runs.recovery import recover
from heed.runs.state import is_attachable, is_lifecycle_busy
from heed.runtime import OperationCancelled
from heed.storage import SqlDatabase

from .conftest import WEDGE_RELEASE, build_manager


async def wait_phase(manager: RunManager, run_id: str, phase: str, seconds: float = 5) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if (await manager.get(run_id)).phase == phase:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{run_id} never reached {phase}: {(await manager.get(run_id)).phase}")


async def events(manager: RunManager, run_id: str) -> list[str]:
    return [e.type for e in manager.store.events_after(run_id, 0)]


async def orphaned_running_run(manager: RunManager, *, worker_id: str) -> str:
    """A one-token turn run to completion, then its row rewritten as ``running`` under
    *worker_id*'s expired lease (a worker that died mid-run); returns the run id."""
    run = await manager.submit("turn", tenant="t", session_id="s", payload={"n": 1})
    assert run is not None
    await wait_phase(manager, run.id, "completed")
    with manager.store.db.write() as conn:
        conn.execute(
            "UPDATE runs SET phase='running', lease_expires_at=?, worker_id=?,"
            " journal_closed=0 WHERE id=?",
            (time.time() - 1, worker_id, run.id),
        )
    return run.id


async def test_run_completes_with_terminal_event(manager: RunManager) -> None:
    run = await manager.submit("turn", tenant="t", session_id="s", payload={"n": 2})
    assert run is not None
    await wait_phase(manager, run.id, "completed")
    assert await events(manager, run.id) == ["started", "text_delta", "text_delta", "completed"]


async def test_reject_names_the_busy_run(manager: RunManager) -> None:
    first = await manager.submit("turn", tenant="t", session_id="s", payload={"n": 50})
    assert first is not None
    with pytest.raises(RunConflict) as info:
        await manager.submit("turn", tenant="t", session_id="s", strategy="reject")
    assert info.value.busy.id == first.id
    assert first.id in info.value.message and info.value.headers["Retry-After"]


async def test_enqueue_starts_after_the_busy_run(manager: RunManager) -> None:
    first = await manager.submit("turn", tenant="t", session_id="s", payload={"n": 5})
    second = await manager.submit("turn", tenant="t", session_id="s", strategy="enqueue")
    assert first is not None and second is not None
    assert second.phase == "queued"
    await wait_phase(manager, second.id, "completed")
    a, b = await manager.get(first.id), await manager.get(second.id)
    assert a.finished_at is not None and b.started_at is not None
    assert b.started_at >= a.finished_at


async def test_cancel_queued_run_never_starts(manager: RunManager) -> None:
    first = await manager.submit("turn", tenant="t", session_id="s", payload={"n": 30})
    second = await manager.submit("turn", tenant="t", session_id="s", strategy="enqueue")
    assert first is not None and second is not None
    cancelled = await manager.cancel(second.id)
    assert cancelled.phase == "cancelled"
    await manager.cancel(first.id, wait=True)
    await asyncio.sleep(0.2)
    again = await manager.get(second.id)
    assert again.phase == "cancelled" and again.started_at is None
    assert await events(manager, second.id) == ["cancelled"]


async def test_cancel_running_is_immediate_for_clients_and_idempotent(
    manager: RunManager,
) -> None:
    run = await manager.submit("turn", tenant="t", session_id="s", payload={"n": 1000})
    assert run is not None
    await asyncio.sleep(0.05)
    cancelled = await manager.cancel(run.id, "stop")
    assert cancelled.phase in ("cancelling", "cancelled")
    assert (await events(manager, run.id))[-1] == "cancelled"
    final = await manager.cancel(run.id, wait=True)
    assert final.phase == "cancelled"
    assert final.cancel_reason == "stop"
    # idempotent, and terminal is absorbing
    assert (await manager.cancel(run.id, "again")).phase == "cancelled"
    assert (await events(manager, run.id)).count("cancelled") == 1


async def test_cancelling_run_blocks_successor_until_worker_exits(manager: RunManager) -> None:
    run = await manager.submit("wedge", tenant="t", session_id="s")
    assert run is not None
    await asyncio.sleep(0.05)
    cancelling = await manager.cancel(run.id)
    assert cancelling.phase == "cancelling"
    assert not is_attachable(cancelling)
    assert is_lifecycle_busy(cancelling, time.time(), manager.unwind_window)
    with pytest.raises(RunConflict):
        await manager.submit("turn", tenant="t", session_id="s", strategy="reject")
    WEDGE_RELEASE.set()
    await wait_phase(manager, run.id, "cancelled")
    ok = await manager.submit("turn", tenant="t", session_id="s", strategy="reject")
    assert ok is not None


async def test_interrupt_cancels_busy_run_and_starts_after_it_stops(manager: RunManager) -> None:
    first = await manager.submit("turn", tenant="t", session_id="s", payload={"n": 1000})
    assert first is not None
    await asyncio.sleep(0.05)
    second = await manager.submit("turn", tenant="t", session_id="s", strategy="interrupt")
    assert second is not None
    await wait_phase(manager, second.id, "completed")
    a, b = await manager.get(first.id), await manager.get(second.id)
    assert a.phase == "cancelled" and a.finished_at is not None
    assert b.started_at is not None and b.started_at >= a.finished_at


async def test_reaper_never_reclaims_a_live_wedged_worker(manager: RunManager) -> None:
    run = await manager.submit("wedge", tenant="t", session_id="s")
    assert run is not None
    await asyncio.sleep(0.05)
    await manager.cancel(run.id)
    await asyncio.sleep(1.5)  # past the 1 s unwind window and the 1 s lease
    assert await reap_once(manager) == []
    got = await manager.get(run.id)
    assert got.phase == "cancelling"
    assert manager.wedged == 1
    assert got.lease_expires_at is not None and got.lease_expires_at > time.time()


async def test_reaper_reclaims_stale_cancelling_run_without_worker(
    sql_database: SqlDatabase,
) -> None:
    manager = build_manager(sql_database)
    try:
        run = await manager.submit("turn", tenant="t", session_id="s", payload={"n": 1})
        assert run is not None
        await wait_phase(manager, run.id, "completed")
        # Fabricate the abandoned row a dead worker leaves: cancelling, lease gone.
        now = time.time()
        with manager.store.db.write() as conn:
            conn.execute(
                "UPDATE runs SET phase='cancelling', cancelled_at=?, lease_expires_at=?,"
                " worker_id='elsewhere:1:x' WHERE id=?",
                (now - 0.2, now - 5, run.id),
            )
        stuck = await manager.get(run.id)
        assert is_lifecycle_busy(stuck, time.time(), manager.unwind_window)
        assert await reap_once(manager) == []  # too young: 0.2 s < 1 s window
        await asyncio.sleep(1.0)
        finalized = await reap_once(manager)
        assert [r.id for r in finalized] == [run.id]
        assert (await manager.get(run.id)).phase == "cancelled"
        ok = await manager.submit("turn", tenant="t", session_id="s", strategy="reject")
        assert ok is not None
    finally:
        await manager.close()


async def test_expired_lease_running_run_becomes_interrupted(sql_database: SqlDatabase) -> None:
    manager = build_manager(sql_database)
    try:
        run_id = await orphaned_running_run(manager, worker_id="other:1:x")
        finalized = await reap_once(manager)
        assert [r.phase for r in finalized] == ["interrupted"]
        assert (await events(manager, run_id))[-1] == "interrupted"
    finally:
        await manager.close()


async def test_restart_recovery_interrupts_runs_of_a_dead_process(
    sql_database: SqlDatabase,
) -> None:
    WEDGE_RELEASE.clear()
    first = build_manager(sql_database, lease_seconds=60)
    run = await first.submit("wedge", tenant="t", session_id="s")
    queued = await first.submit("turn", tenant="t", session_id="s", strategy="enqueue")
    assert run is not None and queued is not None
    await asyncio.sleep(0.05)
    # Simulate a crash: the process stops renewing and writing, its rows stay as they are.
    first._closing = True
    first.workers.clear()
    # The same pid in a new incarnation: its lease is still valid, yet it is dead.
    second = build_manager(sql_database, lease_seconds=60)
    try:
        stale = await second.get(run.id)
        assert stale.lease_expires_at is not None and stale.lease_expires_at > time.time()
        finalized = await recover(second)
        assert [r.id for r in finalized] == [run.id]
        assert (await second.get(run.id)).phase == "interrupted"
        await wait_phase(second, queued.id, "completed")
        assert (await events(second, run.id))[-1] == "interrupted"
    finally:
        WEDGE_RELEASE.set()
        await second.close()


async def test_unknown_run_raises_not_found(manager: RunManager) -> None:
    with pytest.raises(RunNotFound):
        await manager.cancel("run_nope")
    run = await manager.submit("task", tenant="a", payload={"n": 1})
    assert run is not None
    with pytest.raises(RunNotFound):
        await manager.get(run.id, tenant="b")


async def test_fifty_concurrent_starts_admit_one(manager: RunManager) -> None:
    async def start() -> str:
        try:
            await manager.submit(
                "turn", tenant="t", session_id="s50", payload={"n": 5}, strategy="reject"
            )
            return "ok"
        except RunConflict:
            return "409"

    results = await asyncio.gather(*(start() for _ in range(50)))
    assert results.count("ok") == 1 and results.count("409") == 49


def test_phase_changes_are_guarded_dataclass_copy() -> None:
    # Run snapshots are immutable: readers cannot mutate the registry by accident.
    from heed.runs.model import Run

    run = Run(id="r", kind="turn", tenant="t", phase=Phase.RUNNING, created_at=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.phase = "completed"  # type: ignore[misc]


LONGER = {"n": 100, "delay": 0.02}


async def test_racing_interrupts_leave_exactly_the_last_one_running(manager: RunManager) -> None:
    busy = await manager.submit("turn", tenant="t", session_id="s", payload={"n": 1000})
    assert busy is not None
    await asyncio.sleep(0.05)
    first, second = await asyncio.gather(
        # Long enough that neither can finish before the other's interrupt reaches it.
        manager.submit("turn", tenant="t", session_id="s", strategy="interrupt", payload=LONGER),
        manager.submit("turn", tenant="t", session_id="s", strategy="interrupt", payload=LONGER),
    )
    assert first is not None and second is not None
    last = max((first, second), key=lambda r: (r.created_at, r.id))
    other = first if last is second else second
    await wait_phase(manager, last.id, "completed", seconds=15)
    assert (await manager.get(other.id)).phase == "cancelled"
    assert (await manager.get(busy.id)).phase == "cancelled"


async def test_retention_keeps_only_the_terminal_event_and_readers_get_a_gap(
    sql_database: SqlDatabase,
) -> None:
    from heed.runs.journal import Gap

    manager = build_manager(sql_database, journal_retention=0.3)
    try:
        run = await manager.submit("task", tenant="t", payload={"n": 5})
        assert run is not None
        await wait_phase(manager, run.id, "completed")
        await asyncio.sleep(0.4)
        fresh = await manager.submit("task", tenant="t", payload={"n": 2})
        assert fresh is not None
        await wait_phase(manager, fresh.id, "completed")
        await reap_once(manager)
        kept = manager.store.events_after(run.id, 0)
        assert [e.type for e in kept] == ["completed"]
        assert len(manager.store.events_after(fresh.id, 0)) == 4  # too young to trim
        items = [item async for item in manager.journal.follow(run.id, 0)]
        assert isinstance(items[0], Gap) and items[0].first_retained == kept[0].seq
        assert [e.type for e in items[1]] == ["completed"]
    finally:
        await manager.close()


async def test_concurrent_reapers_finalize_a_row_once(sql_database: SqlDatabase) -> None:
    one = build_manager(sql_database)
    two = build_manager(sql_database)  # another process on the same database
    try:
        run_id = await orphaned_running_run(one, worker_id="dead:1:x")
        results = await asyncio.gather(reap_once(one), reap_once(two), reap_once(one))
        assert sum(len(r) for r in results) == 1
        assert (await events(one, run_id)).count("interrupted") == 1
        assert one.interrupted_total + two.interrupted_total == 1
    finally:
        await one.close()
        await two.close()


async def test_reaper_loop_survives_a_stray_cancellation(
    manager: RunManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An OperationCancelled escaping one pass must not end the loop (leases would expire)."""
    import heed.runs.reaper as reaper_module

    real = reaper_module.reap_once
    calls = {"n": 0}

    async def flaky(m: RunManager, **options: bool) -> list[object]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OperationCancelled("stray")
        return await real(m, **options)  # type: ignore[return-value]

    monkeypatch.setattr(reaper_module, "reap_once", flaky)
    manager.reaper_interval = 0.01
    reaper = Reaper(manager)
    reaper.start()
    try:
        for _ in range(500):
            if reaper.passes >= 3:
                break
            await asyncio.sleep(0.01)
        assert calls["n"] >= 3 and reaper.passes >= 3
    finally:
        await reaper.stop()


async def test_a_cancel_written_by_another_process_stops_the_local_worker(
    sql_database: SqlDatabase,
) -> None:
    here = build_manager(sql_database, lease_seconds=60)
    there = build_manager(sql_database, lease_seconds=60)
    try:
        run = await here.submit("task", tenant="t", payload={"n": 10_000, "delay": 0.05})
        assert run is not None
        await wait_phase(here, run.id, "running")
        await there.cancel(run.id, "stopped elsewhere")  # no local worker there: only the row
        assert run.id in here.workers, "the worker stopped before it could have known"
        await renew_leases(here)  # the lease renewal reads the row and stops the worker
        await wait_phase(here, run.id, "cancelled")
        assert run.id not in here.workers
    finally:
        await here.close(grace=2)
        await there.close(grace=2)


async def test_the_cancel_watch_stops_a_worker_cancelled_by_another_process(
    sql_database: SqlDatabase,
) -> None:
    """Without a broker between processes (no Redis), the cancel watch, not the lease
    renewal (no reaper runs here), brings another process's cancel to the worker; with
    the watch off the worker keeps running."""
    watched = build_manager(sql_database, lease_seconds=60, cancel_watch_interval=0.05)
    unwatched = build_manager(sql_database, lease_seconds=60)
    there = build_manager(sql_database, lease_seconds=60)
    try:
        runs = {}
        for name, manager in (("watched", watched), ("unwatched", unwatched)):
            run = await manager.submit("task", tenant="t", payload={"n": 10_000, "delay": 0.05})
            assert run is not None
            await wait_phase(manager, run.id, "running")
            runs[name] = run.id
        for run_id in runs.values():
            await there.cancel(run_id, "stopped elsewhere")
        await wait_phase(watched, runs["watched"], "cancelled")
        assert runs["watched"] not in watched.workers
        await asyncio.sleep(0.5)  # ten watch intervals
        assert runs["unwatched"] in unwatched.workers
        assert watched._cancel_watch is None  # no worker left: the watch has ended
    finally:
        await watched.close(grace=2)
        await unwatched.close(grace=2)
        await there.close(grace=2)
