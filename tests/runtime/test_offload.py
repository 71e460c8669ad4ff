"""Offload: a slot is held until the offloaded work has really stopped."""

from __future__ import annotations

import asyncio
import os
import statistics
import threading
import time
from pathlib import Path

import pytest

from heed.runtime import (
    CancellationToken,
    Lane,
    OperationCancelled,
    RequestContext,
    WorkerProcessDied,
    current_context,
    raise_if_cancelled,
    run_in_process,
    run_in_thread,
    use_context,
)
from tests.runtime import workers


def _busy(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(i * i for i in range(100))


def cooperative(stopped: list[float], chunk: float = 0.001) -> None:
    """Burns CPU in small chunks, checking the token between them."""
    try:
        while True:
            _busy(chunk)
            raise_if_cancelled()
    finally:
        stopped.append(time.monotonic())


def stubborn(ignore_for: float, stopped: list[float]) -> None:
    """Ignores cancellation for *ignore_for* seconds after it is cancelled."""
    token = current_context().token
    try:
        while not token.cancelled:
            _busy(0.001)
        _busy(ignore_for)
    finally:
        stopped.append(time.monotonic())


async def test_thread_sees_the_request_context() -> None:
    ctx = RequestContext(tenant="acme")
    with use_context(ctx):
        tenant = await run_in_thread(lambda: current_context().tenant)
    assert tenant == "acme"


async def test_cooperative_thread_frees_its_slot_promptly() -> None:
    lane = Lane("recall", capacity=1, max_queue=0)
    latencies = []
    for _ in range(5):
        ctx = RequestContext()
        stopped: list[float] = []

        async def work(ctx: RequestContext = ctx, stopped: list[float] = stopped) -> None:
            with use_context(ctx):
                async with lane.slot():
                    await run_in_thread(cooperative, stopped)

        task = asyncio.create_task(work())
        await asyncio.sleep(0.05)
        assert lane.stats().in_use == 1
        cancelled_at = time.monotonic()
        ctx.token.cancel("client disconnected")
        with pytest.raises(OperationCancelled):
            await task
        released_at = time.monotonic()
        assert lane.stats().in_use == 0
        assert stopped and stopped[0] <= released_at
        latencies.append(released_at - cancelled_at)
    # The bound is 20 ms; the median guards against one noisy sample.
    assert statistics.median(latencies) <= 0.020, latencies
    assert max(latencies) <= 0.200, latencies


async def test_stubborn_thread_keeps_its_slot_until_it_stops() -> None:
    lane = Lane("recall", capacity=1, max_queue=4)
    ctx = RequestContext()
    stopped: list[float] = []

    async def work() -> None:
        with use_context(ctx):
            async with lane.slot():
                await run_in_thread(stubborn, 0.3, stopped)

    task = asyncio.create_task(work())
    await asyncio.sleep(0.05)
    cancelled_at = time.monotonic()
    ctx.token.cancel("client disconnected")
    await asyncio.sleep(0.15)
    stats = lane.stats()
    assert stats.in_use == 1 and stats.abandoned == 1, "slot must stay with the running thread"
    await task  # the stubborn function returns normally after ignoring the token
    released_at = time.monotonic()
    assert lane.stats().in_use == 0
    assert stopped[0] - cancelled_at >= 0.29
    assert released_at >= stopped[0]


async def test_cancelling_the_awaiting_task_still_waits_for_the_thread() -> None:
    """The leak the seed describes: task cancellation must not free the slot early."""
    lane = Lane("recall", capacity=1, max_queue=4)
    stopped: list[float] = []

    async def work() -> None:
        async with lane.slot(CancellationToken()):
            await run_in_thread(stubborn, 0.2, stopped)

    task = asyncio.create_task(work())
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.sleep(0.1)
    assert not task.done(), "the awaiting task must wait for the thread"
    assert lane.stats().in_use == 1
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stopped, "thread finished before the task completed"
    assert lane.stats().in_use == 0


async def test_cancelled_before_start_never_runs() -> None:
    ctx = RequestContext()
    ctx.token.cancel("gone")
    ran = threading.Event()
    with use_context(ctx), pytest.raises(OperationCancelled):
        await run_in_thread(ran.set)
    assert not ran.is_set()


async def test_process_result_and_errors() -> None:
    assert await run_in_process(workers.square, 7) == 49
    with pytest.raises(ValueError, match="boom"):
        await run_in_process(workers.fail, "boom")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    if status.exists():
        return status.read_text().split()[2] != "Z"
    return True


async def test_process_that_never_checks_is_killed_and_slot_freed_after(tmp_path: Path) -> None:
    lane = Lane("recall", capacity=1, max_queue=0)
    ctx = RequestContext()
    pid_file = tmp_path / "pid"

    async def work() -> None:
        with use_context(ctx):
            async with lane.slot():
                await run_in_process(workers.spin_forever, str(pid_file))

    task = asyncio.create_task(work())
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.monotonic() < deadline, "worker process did not start"
        await asyncio.sleep(0.01)
    pid = int(pid_file.read_text())
    assert _alive(pid)
    ctx.token.cancel("client disconnected")
    with pytest.raises(OperationCancelled):
        await asyncio.wait_for(task, 10)
    assert not _alive(pid), "the slot was released while the worker process still existed"
    assert lane.stats().in_use == 0


async def test_process_killed_externally_is_reported() -> None:
    ctx = RequestContext()

    async def kill_soon() -> None:
        await asyncio.sleep(0.5)
        for child in __import__("multiprocessing").active_children():
            child.kill()

    with use_context(ctx):
        killer = asyncio.create_task(kill_soon())
        with pytest.raises(WorkerProcessDied):
            await run_in_process(workers.sleep_then_return, 30)
        await killer


async def test_run_blocking_ignores_tokens_and_outlives_task_cancel() -> None:
    """A store write must complete even when its caller is cancelled."""
    from concurrent.futures import ThreadPoolExecutor

    from heed.runtime import run_blocking

    pool = ThreadPoolExecutor(1)
    ctx = RequestContext()
    ctx.token.cancel("client disconnected")
    finished: list[float] = []

    def write() -> str:
        time.sleep(0.2)
        finished.append(time.monotonic())
        return "committed"

    with use_context(ctx):
        assert await run_blocking(pool, write) == "committed"  # a cancelled token does not stop it
        task = asyncio.create_task(run_blocking(pool, write))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        cancelled_returned = time.monotonic()
    assert len(finished) == 2 and finished[1] <= cancelled_returned
    pool.shutdown()
