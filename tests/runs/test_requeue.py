"""Background operations survive dead workers: requeued up to ``max_attempts``, then
quarantined (issue 30). A kind without ``max_attempts`` is still interrupted, and a cancel
is never requeued."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from heed.runs.events import EventType
from heed.runs.journal import Gap
from heed.runs.kinds import KindSpec, RunContext
from heed.runs.manager import RunManager
from heed.runs.model import Phase, Run, RunEvent, new_run_id
from heed.runs.reaper import finalize, reap_once, renew_leases
from heed.runs.recovery import recover
from heed.runs.state import is_quarantined
from heed.runtime import CancellationToken
from heed.storage import SqlDatabase
from heed.storage.run_store import SqlRunStore
from tests.pg_support import fresh_schema

from .conftest import build_manager
from .requeue_worker import KIND, MAX_ATTEMPTS, open_database

ROOT = Path(__file__).resolve().parents[2]


def wait_for(predicate: Callable[[], object], seconds: float = 10.0) -> None:
    """Poll *predicate* until it is true; fail after *seconds*. (Not ``tests.support``'s:
    that one imports the API, which these tests do not need.)"""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


@dataclass
class Starts:
    """What the blocking executors saw: one entry per start, ``(worker_id, attempts)``."""

    seen: list[tuple[str, int]] = field(default_factory=list)
    tokens: list[CancellationToken] = field(default_factory=list)


def op_manager(database: SqlDatabase, starts: Starts, **kwargs: Any) -> RunManager:
    """A manager ("a process") with the test kinds and two blocking background kinds: ``op``
    (``max_attempts`` 3) and ``plain`` (none)."""
    manager = build_manager(database, **kwargs)

    async def blocking(rc: RunContext) -> dict[str, Any]:
        starts.tokens.append(rc.token)
        await rc.emit(EventType.PROGRESS, {"attempt": rc.run.attempts + 1})
        starts.seen.append((manager.worker_id, rc.run.attempts))  # after its event
        await rc.token.wait()
        rc.token.raise_if_cancelled()
        return {}

    manager.register(KIND, KindSpec(execute=blocking, max_attempts=MAX_ATTEMPTS))
    manager.register("plain", KindSpec(execute=blocking))
    return manager


def kill(manager: RunManager) -> None:
    """The manager's process dies: it stops renewing, starting and writing; its workers'
    leases expire now. (Its worker tasks stay blocked until the test releases them: a dead
    process never writes again, and a released one must not either.)"""
    manager._closing = True
    manager.workers.clear()
    with manager.store.db.write() as conn:  # type: ignore[attr-defined]
        conn.execute(
            "UPDATE runs SET lease_expires_at = ? WHERE worker_id = ?",
            (time.time() - 1, manager.worker_id),
        )


async def close_all(managers: list[RunManager], starts: Starts) -> None:
    for token in starts.tokens:
        token.cancel("test over")
    await asyncio.sleep(0.05)
    for manager in managers:
        await manager.close(grace=2)


async def running(manager: RunManager, starts: Starts, run_id: str, seconds: float = 5) -> Run:
    """The run once *manager*'s worker holds it and its executor has started (and written
    its ``progress`` event)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        run = await manager.get(run_id)
        mine = run.phase == "running" and run.worker_id == manager.worker_id
        if mine and (manager.worker_id, run.attempts) in starts.seen:
            return await manager.get(run_id)
        await asyncio.sleep(0.01)
    raise AssertionError(f"{run_id} is not running in this manager: {await manager.get(run_id)}")


async def until(predicate: Callable[[], object], seconds: float = 5) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def journal(manager: RunManager, run_id: str) -> list[RunEvent]:
    return manager.store.events_after(run_id, 0)


# -- the reaper's path, on both databases -------------------------------------------------


async def test_three_lost_leases_requeue_twice_then_quarantine(sql_database: SqlDatabase) -> None:
    starts = Starts()
    managers: list[RunManager] = []
    try:
        first = op_manager(sql_database, starts)
        managers.append(first)
        submitted = await first.submit(KIND, tenant="t", summary={"what": "consolidate"})
        assert submitted is not None
        run_id = submitted.id
        await running(first, starts, run_id)
        holder = first
        for death in (1, 2):
            kill(holder)
            holder = op_manager(sql_database, starts)  # the next process, its reaper
            managers.append(holder)
            acted = await reap_once(holder, sweep=False)
            # requeued (the list holds the row as the reaper left it), then started again
            assert [(r.id, r.phase, r.attempts) for r in acted] == [(run_id, "queued", death)]
            run = await running(holder, starts, run_id)
            assert run.attempts == death and run.error is None
            assert starts.seen[-1] == (holder.worker_id, death)
            assert holder.requeued_total == 1
        kill(holder)
        last = op_manager(sql_database, starts)
        managers.append(last)
        acted = await reap_once(last)
        assert [r.id for r in acted] == [run_id]
        run = await last.get(run_id)
        assert run.phase == "failed" and run.attempts == MAX_ATTEMPTS
        assert run.error is not None and run.error.startswith("quarantined")
        assert is_quarantined(run)
        assert last.quarantined_total == 1 and last.interrupted_total == 0
        # terminal: no pass, sweep or recovery claims it again
        await reap_once(last)
        await recover(last)
        await last.start_queued()
        assert len(starts.seen) == 3 and not last.workers
        assert [a for _, a in starts.seen] == [0, 1, 2]
        # the journal: each attempt, the requeues in order, one terminal failure
        events = journal(last, run_id)
        assert [e.type for e in events] == [
            "started",
            "progress",
            "requeued",
            "started",
            "progress",
            "requeued",
            "started",
            "progress",
            "failed",
        ]
        requeues = [e.data for e in events if e.type == EventType.REQUEUED]
        assert [r["attempt"] for r in requeues] == [1, 2]
        assert all(r["reason"] for r in requeues)
        assert events[-1].data["error"] == run.error
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        # the dead workers, released, write nothing over the quarantine
        for token in starts.tokens:
            token.cancel("a dead worker wakes up")
        await asyncio.sleep(0.2)
        after = await last.get(run_id)
        assert after.phase == "failed" and after.attempts == MAX_ATTEMPTS
        assert after.last_seq == run.last_seq
    finally:
        await close_all(managers, starts)


async def test_a_kind_without_max_attempts_is_still_interrupted(
    sql_database: SqlDatabase,
) -> None:
    starts = Starts()
    managers: list[RunManager] = []
    try:
        first = op_manager(sql_database, starts)
        managers.append(first)
        run = await first.submit("plain", tenant="t")
        assert run is not None
        await running(first, starts, run.id)
        kill(first)
        second = op_manager(sql_database, starts)
        managers.append(second)
        acted = await reap_once(second)
        assert [(r.id, r.phase, r.attempts) for r in acted] == [(run.id, "interrupted", 0)]
        await asyncio.sleep(0.1)
        assert len(starts.seen) == 1 and second.requeued_total == 0
        assert EventType.REQUEUED not in [e.type for e in journal(second, run.id)]
    finally:
        await close_all(managers, starts)


async def test_a_cancelling_run_whose_worker_died_is_cancelled_not_requeued(
    sql_database: SqlDatabase,
) -> None:
    starts = Starts()
    managers: list[RunManager] = []
    try:
        first = op_manager(sql_database, starts)
        managers.append(first)
        run = await first.submit(KIND, tenant="t")
        assert run is not None
        await running(first, starts, run.id)
        kill(first)
        second = op_manager(sql_database, starts)
        managers.append(second)
        cancelling = await second.cancel(run.id, "stop it")
        assert cancelling.phase == "cancelling"
        with second.store.db.write() as conn:  # type: ignore[attr-defined]
            conn.execute(  # past the unwind window (1 s in these managers)
                "UPDATE runs SET cancelled_at = ? WHERE id = ?", (time.time() - 60, run.id)
            )
        acted = await reap_once(second)
        assert [(r.id, r.phase, r.attempts) for r in acted] == [(run.id, "cancelled", 0)]
        await asyncio.sleep(0.1)
        assert len(starts.seen) == 1
        assert [e.type for e in journal(second, run.id)] == ["started", "progress", "cancelled"]
    finally:
        await close_all(managers, starts)


async def test_two_reapers_requeue_a_dead_workers_run_once(sql_database: SqlDatabase) -> None:
    starts = Starts()
    managers: list[RunManager] = []
    try:
        first = op_manager(sql_database, starts)
        managers.append(first)
        run = await first.submit(KIND, tenant="t")
        assert run is not None
        await running(first, starts, run.id)
        kill(first)
        one, two = op_manager(sql_database, starts), op_manager(sql_database, starts)
        managers += [one, two]
        await asyncio.gather(reap_once(one), reap_once(two), reap_once(one))
        assert one.requeued_total + two.requeued_total == 1
        types = [e.type for e in journal(one, run.id)]
        assert types.count("requeued") == 1 and types.count("started") == 2
        assert (await one.get(run.id)).attempts == 1
        await until(lambda: len(starts.seen) == 2)
        await asyncio.sleep(0.1)
        assert len(starts.seen) == 2
    finally:
        await close_all(managers, starts)


async def test_a_reaper_that_read_the_row_before_the_requeue_writes_nothing(
    sql_database: SqlDatabase,
) -> None:
    """The requeue is guarded by the worker that died: a stale snapshot (the row as it was
    before another process requeued the run and claimed it again) requeues nothing."""
    starts = Starts()
    managers: list[RunManager] = []
    try:
        first = op_manager(sql_database, starts)
        managers.append(first)
        run = await first.submit(KIND, tenant="t")
        assert run is not None
        await running(first, starts, run.id)
        kill(first)
        stale = await first.get(run.id)  # what a slow reaper read
        second = op_manager(sql_database, starts)
        managers.append(second)
        await reap_once(second)
        claimed = await running(second, starts, run.id)
        slow = op_manager(sql_database, starts)
        managers.append(slow)
        assert await finalize(slow, stale, Phase.QUEUED) is None
        assert await finalize(slow, stale, Phase.FAILED) is None
        now = await second.get(run.id)
        assert (now.phase, now.worker_id, now.attempts) == ("running", second.worker_id, 1)
        assert now.last_seq == claimed.last_seq  # nothing written since
    finally:
        await close_all(managers, starts)


async def test_a_slow_worker_whose_run_was_requeued_stops_and_writes_nothing(
    sql_database: SqlDatabase,
) -> None:
    """A process alive but stalled past its lease: another process requeues and claims the
    run; the slow one's next lease renewal stops its worker, whose end is refused."""
    starts = Starts()
    managers: list[RunManager] = []
    try:
        slow = op_manager(sql_database, starts, lease_seconds=0.2)
        managers.append(slow)
        run = await slow.submit(KIND, tenant="t")
        assert run is not None
        await running(slow, starts, run.id)
        await asyncio.sleep(0.3)  # no reaper renews: the lease runs out
        other = op_manager(sql_database, starts, lease_seconds=60)
        managers.append(other)
        await reap_once(other)
        await running(other, starts, run.id)
        assert run.id in slow.workers
        await renew_leases(slow)  # reads the row: no longer its own
        deadline = time.monotonic() + 5
        while run.id in slow.workers and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert run.id not in slow.workers
        now = await other.get(run.id)
        assert (now.phase, now.worker_id, now.attempts) == ("running", other.worker_id, 1)
        assert starts.tokens[0].cancelled and not starts.tokens[1].cancelled
        assert "cancelled" not in [e.type for e in journal(other, run.id)]
    finally:
        await close_all(managers, starts)


async def test_a_process_does_not_start_a_second_worker_beside_its_lost_one(
    sql_database: SqlDatabase,
) -> None:
    """A requeued run whose lost worker is still in this process (stalled, not yet told) is
    not claimed here until that worker is gone: never two workers of one run."""
    starts = Starts()
    managers: list[RunManager] = []
    try:
        slow = op_manager(sql_database, starts, lease_seconds=0.2)
        managers.append(slow)
        run = await slow.submit(KIND, tenant="t")
        assert run is not None
        lost = await running(slow, starts, run.id)
        await asyncio.sleep(0.3)  # the lease runs out
        other = op_manager(sql_database, starts)
        managers.append(other)
        requeued = await finalize(other, lost, Phase.QUEUED)  # requeued, not started
        assert requeued is not None and requeued.phase == "queued"
        await slow.start(requeued)
        await asyncio.sleep(0.1)
        assert (await slow.get(run.id)).phase == "queued" and len(starts.seen) == 1
        await renew_leases(slow)  # its worker learns the run is not its own and stops
        await until(lambda: run.id not in slow.workers)
        await slow.start(requeued)
        again = await running(slow, starts, run.id)
        assert again.attempts == 1 and len(starts.seen) == 2
    finally:
        await close_all(managers, starts)


# -- restart recovery's path, on both databases -------------------------------------------


def dead_pid() -> int:
    """The pid of a process of this host that has exited."""
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(proc.stdout)


async def test_restart_recovery_requeues_then_quarantines(sql_database: SqlDatabase) -> None:
    """Deaths found by the restart rule (the worker's pid is gone, its lease still valid)."""
    starts = Starts()
    managers: list[RunManager] = []
    store = SqlRunStore(sql_database)
    store.migrate()
    run = store.create(
        Run(id=new_run_id(), kind=KIND, tenant="t", phase=Phase.QUEUED, created_at=time.time())
    )
    try:
        for death in range(MAX_ATTEMPTS + 1):
            if death:
                # the previous process died: its pid is gone, its long lease is not
                with store.db.write() as conn:
                    conn.execute(
                        "UPDATE runs SET worker_id = ? WHERE id = ?",
                        (f"{socket.gethostname()}:{dead_pid()}:x", run.id),
                    )
                managers[-1]._closing = True
                managers[-1].workers.clear()
            manager = op_manager(sql_database, starts, lease_seconds=60)
            managers.append(manager)
            acted = await recover(manager)
            assert len(acted) == (1 if death else 0)
            if death < MAX_ATTEMPTS:
                now = await running(manager, starts, run.id)
                assert now.attempts == death
                assert len(starts.seen) == death + 1
        final = await managers[-1].get(run.id)
        assert (final.phase, final.attempts) == ("failed", MAX_ATTEMPTS) and is_quarantined(final)
        assert len(starts.seen) == MAX_ATTEMPTS and not managers[-1].workers
        types = [e.type for e in journal(managers[-1], run.id)]
        assert types.count("requeued") == MAX_ATTEMPTS - 1 and types[-1] == "failed"
    finally:
        await close_all(managers, starts)


# -- a client following the run --------------------------------------------------------------


async def collect(manager: RunManager, run_id: str, after: int) -> list[RunEvent]:
    got: list[RunEvent] = []
    async for item in manager.journal.follow(run_id, after, heartbeat=0.5):
        assert not isinstance(item, Gap)
        if isinstance(item, list):
            got.extend(item)
    return got


async def test_a_client_following_a_requeued_run_sees_every_event_once(
    sql_database: SqlDatabase,
) -> None:
    starts = Starts()
    managers: list[RunManager] = []
    try:
        reader = op_manager(sql_database, starts)  # a process that only streams
        managers.append(reader)
        holder = op_manager(sql_database, starts)
        managers.append(holder)
        run = await holder.submit(KIND, tenant="t")
        assert run is not None
        await running(holder, starts, run.id)
        live: asyncio.Task[list[RunEvent]] = asyncio.create_task(collect(reader, run.id, 0))
        resumed_from: int | None = None
        resumed: asyncio.Task[list[RunEvent]] | None = None
        for death in range(1, MAX_ATTEMPTS + 1):
            kill(holder)
            holder = op_manager(sql_database, starts)
            managers.append(holder)
            await reap_once(holder)
            if death < MAX_ATTEMPTS:
                await running(holder, starts, run.id)
            if death == 1:
                # a client that left and comes back with the cursor it had
                resumed_from = (await holder.get(run.id)).last_seq - 2
                resumed = asyncio.create_task(collect(reader, run.id, resumed_from))
        assert resumed is not None and resumed_from is not None
        seen = await asyncio.wait_for(live, 10)
        again = await asyncio.wait_for(resumed, 10)
        stored = journal(holder, run.id)
        assert [(e.seq, e.type) for e in seen] == [(e.seq, e.type) for e in stored]
        assert [e.seq for e in again] == [e.seq for e in stored if e.seq > resumed_from]
        assert [e.data["attempt"] for e in seen if e.type == "requeued"] == [1, 2]
        assert seen[-1].type == "failed" and seen[-1].data["error"].startswith("quarantined")
    finally:
        await close_all(managers, starts)


# -- kill -9: real processes ----------------------------------------------------------------


@dataclass
class Target:
    """A database both this test and its worker processes open."""

    arg: str  # a SQLite path or a PostgreSQL URL

    def store(self) -> SqlRunStore:
        return SqlRunStore(open_database(self.arg))


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    if request.param == "sqlite":
        yield Target(str(tmp_path / "heed.db"))
        return
    with fresh_schema() as url:
        yield Target(url)


@contextmanager
def worker_process(target: Target, directory: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``tests.runs.requeue_worker`` as a real process, once it has recovered and is up."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.runs.requeue_worker", target.arg, str(directory)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:

        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(proc.stderr.read().decode() if proc.stderr else "died")
            return (directory / f"ready-{proc.pid}").exists()

        wait_for(up, seconds=30)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        if proc.stderr is not None:
            proc.stderr.close()


def start_lines(directory: Path) -> list[list[str]]:
    path = directory / "starts"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def test_three_worker_deaths_quarantine_an_operation(target: Target, tmp_path: Path) -> None:
    """kill -9 during one operation, three times: each next process requeues it and runs it
    again; the fourth process quarantines it and does not claim it."""
    directory = tmp_path / "procs"
    directory.mkdir()
    store = target.store()
    store.migrate()
    run = store.create(
        Run(id=new_run_id(), kind=KIND, tenant="t", phase=Phase.QUEUED, created_at=time.time())
    )
    try:
        for death in range(1, MAX_ATTEMPTS + 1):
            with worker_process(target, directory) as proc:
                wait_for(lambda: len(start_lines(directory)) == death, seconds=20)  # noqa: B023
                pid, run_id, attempts = start_lines(directory)[-1]
                assert (int(pid), run_id, int(attempts)) == (proc.pid, run.id, death - 1)
                row = store.get(run.id)
                assert row is not None and row.phase == "running"
                assert row.worker_id is not None and f":{proc.pid}:" in row.worker_id
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
        with worker_process(target, directory) as fourth:
            row = store.get(run.id)
            assert row is not None
            assert (row.phase, row.attempts) == ("failed", MAX_ATTEMPTS)
            assert is_quarantined(row) and row.error and row.error.startswith("quarantined")
            time.sleep(1.0)  # five reaper passes and its first sweep: nothing claims it
            assert fourth.poll() is None
            assert len(start_lines(directory)) == MAX_ATTEMPTS
            assert [int(line[2]) for line in start_lines(directory)] == [0, 1, 2]
            assert store.get(run.id) == row
        types = [e.type for e in store.events_after(run.id, 0)]
        assert types == ["started", "progress", "requeued"] * 2 + ["started", "progress", "failed"]
    finally:
        store.db.close()
