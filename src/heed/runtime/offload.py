"""Offload: the one way heed runs blocking work off the event loop.

Two ways for engine work, with one contract:

- :func:`run_in_thread` for code that checks its token. The function runs in a
  worker thread with a copy of the caller's contextvars, so
  :func:`heed.runtime.context.raise_if_cancelled` inside it sees the request's
  token (through a child token owned by this call).
- :func:`run_in_process` for code that cannot check a token (a third-party
  loop) or whose work does not follow its input's size (a parser). It runs in
  a child process that is terminated when the token is cancelled, and may be
  given :class:`ProcessLimits`: CPU time and memory enforced by the kernel in
  the child (``setrlimit``), wall-clock time by the parent.

The contract, for both: the awaiting coroutine does not return or raise until
the work has really stopped. If the awaiting task itself is cancelled
(``asyncio.CancelledError``), the work's token is cancelled and the coroutine
still waits for the thread to finish or the process to be reaped before it
re-raises. That is what lets a lane slot (:mod:`heed.runtime.slots`) held
around an offload bound real CPU: the ``async with`` cannot exit early.

Work whose token is cancelled before it starts never starts.

A third, :func:`run_blocking`, is for short blocking calls that must complete
even when the caller is cancelled (a store transaction recording that a run was
cancelled): it checks no token, and it too waits for the call to return before
the awaiting coroutine re-raises its own cancellation.

Blocking code that itself needs threads (a database's cancel requests, a write split
among connections) takes them from :func:`helper_pool`: one pool per name in the process,
made on first use, shared by every caller naming it and owned here (never one per module
or per call); :func:`run_concurrently` runs a list of jobs on the calling thread and such
helpers.
"""

from __future__ import annotations

import asyncio
import contextvars
import multiprocessing
import multiprocessing.connection
import os
import resource
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any, Literal, ParamSpec, TypeVar

from heed.runtime.cancellation import CancellationToken, OperationCancelled
from heed.runtime.context import _current, current_context

__all__ = [
    "ChildFd",
    "ProcessLimits",
    "WorkerLimitExceeded",
    "WorkerProcessDied",
    "configure_thread_pool",
    "helper_pool",
    "preload_in_processes",
    "run_blocking",
    "run_concurrently",
    "run_in_process",
    "run_in_thread",
    "start_process_server",
]

P = ParamSpec("P")
T = TypeVar("T")

_TASK_CANCELLED = "awaiting task cancelled"

_executor_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_max_threads = 32


def configure_thread_pool(max_threads: int) -> None:
    """Set the offload pool's size before first use (lanes bound real concurrency)."""
    global _max_threads
    _max_threads = max_threads


def _thread_pool() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(_max_threads, thread_name_prefix="heed-offload")
        return _executor


_helper_pools: dict[str, ThreadPoolExecutor] = {}


def helper_pool(name: str, threads: int) -> Executor:
    """The process's pool *name* (its threads' name prefix) of *threads* threads for
    short blocking helpers, made on first use and shared by every caller naming it (the
    first call's *threads* sizes it). Owned by this module: callers submit to it and never
    shut it down."""
    with _executor_lock:
        pool = _helper_pools.get(name)
        if pool is None:
            pool = _helper_pools[name] = ThreadPoolExecutor(threads, thread_name_prefix=name)
        return pool


def run_concurrently(
    jobs: Sequence[Callable[[], None]], workers: int, *, pool: str, threads: int
) -> None:
    """Run *jobs* on up to *workers* threads, this one among them, the others from
    :func:`helper_pool` (*pool*, *threads*), each helper in a copy of this thread's context
    (its token: a cancel reaches every job). Returns once no job runs any more; raises the
    first error, after which no job starts."""
    if workers <= 1 or len(jobs) <= 1:
        for job in jobs:
            job()
        return
    pending = iter(jobs)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def drain() -> None:
        while True:
            with lock:
                job = None if errors else next(pending, None)
            if job is None:
                return
            try:
                job()
            except BaseException as exc:  # noqa: BLE001 -- raised by the calling thread below
                with lock:
                    errors.append(exc)
                return

    executor = helper_pool(pool, threads)
    helpers = [
        executor.submit(contextvars.copy_context().run, drain)
        for _ in range(min(workers, len(jobs)) - 1)
    ]
    drain()
    for helper in helpers:
        if not helper.cancel():  # one not started yet has nothing left to do
            helper.result()
    if errors:
        raise errors[0]


async def _await_until_settled(
    future: asyncio.Future[T], on_task_cancelled: Callable[[], object] | None = None
) -> T:
    """Await *future*. If the awaiting task is cancelled, call *on_task_cancelled*
    (to tell the work to stop), keep waiting until the future settles, then
    re-raise the cancellation: the caller never unwinds while the work runs."""
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        if on_task_cancelled is not None:
            on_task_cancelled()
        while not future.done():
            try:
                await asyncio.shield(future)
            except asyncio.CancelledError:
                continue
            except BaseException:  # noqa: BLE001 - the work's own outcome no longer matters
                break
        raise


async def run_in_thread(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """Run ``fn(*args, **kwargs)`` in a worker thread and return its result.

    Inside, the active context's token is a child of the caller's, so
    checkpoints in *fn* stop it when the request is cancelled. Raises
    :class:`OperationCancelled` if cancelled before the thread starts or if *fn*
    raises it. Returns or raises only once *fn* has returned.
    """
    ctx = current_context()
    ctx.raise_if_cancelled()
    token = ctx.token.child()
    context = contextvars.copy_context()
    context.run(_current.set, ctx.with_token(token))

    def runner() -> T:
        token.raise_if_cancelled()  # cancelled while queued in the pool: never start
        return context.run(fn, *args, **kwargs)

    loop = asyncio.get_running_loop()
    future = asyncio.wrap_future(_thread_pool().submit(runner), loop=loop)
    try:
        return await _await_until_settled(future, lambda: token.cancel(_TASK_CANCELLED))
    finally:
        token.release_parent()


async def run_blocking(
    executor: Executor, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
) -> T:
    """Run a short blocking call ``fn(*args, **kwargs)`` on *executor*; its result.

    No token is checked: the call always runs and completes (a write commits or
    rolls back on its own). If the awaiting task is cancelled, this still waits
    for the call to return, then re-raises the cancellation, so nothing the
    caller holds is released while the call is running.
    """
    context = contextvars.copy_context()

    def call() -> T:
        return context.run(fn, *args, **kwargs)

    loop = asyncio.get_running_loop()
    return await _await_until_settled(asyncio.wrap_future(executor.submit(call), loop=loop))


class WorkerProcessDied(Exception):
    """The worker process exited without a result (crashed or was killed externally)."""


@dataclass(frozen=True, slots=True)
class ProcessLimits:
    """Bounds on one :func:`run_in_process` child (``None``: unbounded).

    ``cpu_seconds`` is CPU time (the kernel ends the child with ``SIGXCPU``),
    ``memory_bytes`` the address space the child may add to what it was started
    with (its allocations past it fail: ``MemoryError``), ``wall_seconds`` the
    time from start to result (the parent kills the child). ``nice`` lowers the
    child's scheduling priority by that much, so the server's own threads (a
    user's recall or retain) win the cores when both want them.
    """

    cpu_seconds: int | None = None
    memory_bytes: int | None = None
    wall_seconds: float | None = None
    nice: int = 0


class WorkerLimitExceeded(WorkerProcessDied):
    """The worker process passed one of its :class:`ProcessLimits`; ``limit`` says which."""

    def __init__(self, limit: Literal["cpu", "memory", "wall"], message: str) -> None:
        super().__init__(message)
        self.limit = limit

    def __reduce__(self) -> tuple[Any, ...]:  # sent from the child to the parent
        return (type(self), (self.limit, str(self)))


class ChildFd:
    """An open file handed to a :func:`run_in_process` child among its arguments: the
    descriptor is passed as the child starts (``SCM_RIGHTS``, as multiprocessing passes its
    own pipes), and in the child :attr:`fd` is the child's descriptor of the same open file
    (one file offset: the parent must not read it meanwhile)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, ...]:
        from multiprocessing.reduction import DupFd  # only while a child is being started

        return (_inherited, (DupFd(self.fd),))


def _inherited(dup: Any) -> ChildFd:
    return ChildFd(dup.detach())


def _apply_limits(limits: ProcessLimits | None) -> None:
    """In the child: set its CPU and address-space limits."""
    if limits is None:
        return
    if limits.nice:
        os.nice(limits.nice)
    if limits.cpu_seconds is not None:
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 1))
    if limits.memory_bytes is not None:
        # On top of the address space the child starts with (inherited mappings of the
        # libraries its fork server preloaded), so the bound is on what the work adds.
        with open("/proc/self/statm") as statm:
            mapped = int(statm.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (mapped + limits.memory_bytes,) * 2)


def _process_entry(
    conn: multiprocessing.connection.Connection,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    limits: ProcessLimits | None = None,
) -> None:
    try:
        _apply_limits(limits)
        result: tuple[bool, Any] = (True, fn(*args))
    except MemoryError:
        limit = limits.memory_bytes if limits is not None else None
        result = (
            False,
            WorkerLimitExceeded("memory", f"the worker needed more than {limit} bytes"),
        )
    except BaseException as exc:  # noqa: BLE001 - shipped back to the parent as the outcome
        result = (False, exc)
    try:
        conn.send(result)
    finally:
        conn.close()


_mp_context = multiprocessing.get_context("forkserver" if os.name == "posix" else "spawn")


def preload_in_processes(*modules: str) -> None:
    """Import *modules* once in the fork server that starts :func:`run_in_process` children.

    A child then inherits them instead of importing its function's module afresh (about
    300 ms for heed's reflect, a few ms with the preload). Effective only before the first
    child starts; the composition root calls it at start-up.
    """
    if _mp_context.get_start_method() == "forkserver":
        _mp_context.set_forkserver_preload(["__main__", *modules])


def start_process_server() -> None:
    """Start the fork server children of :func:`run_in_process` are forked from, with its
    preloaded modules (seconds, once a process). Blocking: call it in a thread at start-up,
    so the first child does not wait for it."""
    if _mp_context.get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


async def run_in_process(
    fn: Callable[..., T],
    /,
    *args: Any,
    limits: ProcessLimits | None = None,
    on_start: Callable[[BaseProcess], None] | None = None,
    poll_interval: float = 0.005,
) -> T:
    """Run ``fn(*args)`` in a child process that is killed when the token is cancelled.

    *fn* and *args* must be picklable (a module-level function). On cancel the
    child gets SIGTERM, then SIGKILL after 1 s, and this coroutine raises
    :class:`OperationCancelled` only after the child has been reaped. Past one
    of its *limits* it raises :class:`WorkerLimitExceeded`, also once the child
    is gone. *on_start* is told the child once it started (tests watch it).

    Hand-written on top of :mod:`multiprocessing` rather than pebble: pebble's
    futures report "cancelled" as soon as termination is requested, before the
    process is gone, and a slot must not be released before that.
    """
    ctx = current_context()
    ctx.raise_if_cancelled()
    token = ctx.token.child()
    parent_conn, child_conn = _mp_context.Pipe(duplex=False)
    process: BaseProcess = _mp_context.Process(  # type: ignore[attr-defined]
        target=_process_entry, args=(child_conn, fn, args, limits), daemon=True
    )
    wall = limits.wall_seconds if limits is not None else None

    async def started_then_supervised() -> Any:
        # Started in a thread: a start sends the arguments down a pipe and, the first time
        # in a process, waits for the fork server to import what it preloads.
        try:
            await asyncio.to_thread(process.start)
        finally:
            child_conn.close()
        if on_start is not None:
            on_start(process)
        return await _supervise(process, parent_conn, token, poll_interval, wall)

    try:
        supervisor = asyncio.ensure_future(started_then_supervised())
        return await _await_until_settled(supervisor, lambda: token.cancel(_TASK_CANCELLED))
    finally:
        token.release_parent()
        parent_conn.close()


async def _supervise(
    process: BaseProcess,
    conn: multiprocessing.connection.Connection,
    token: CancellationToken,
    poll_interval: float,
    wall_seconds: float | None = None,
) -> Any:
    deadline = time.monotonic() + wall_seconds if wall_seconds is not None else None
    while True:
        if token.cancelled:
            await _terminate(process)
            raise OperationCancelled(token.reason or "cancelled")
        if deadline is not None and time.monotonic() > deadline:
            await _terminate(process)
            raise WorkerLimitExceeded("wall", f"the worker ran past {wall_seconds} s")
        if conn.poll():
            try:
                ok, value = conn.recv()
            except EOFError:
                await _terminate(process)
                raise _died(process) from None
            await asyncio.to_thread(process.join)
            if ok:
                return value
            raise value
        if not process.is_alive():
            process.join()
            raise _died(process)
        await asyncio.sleep(poll_interval)


def _died(process: BaseProcess) -> WorkerProcessDied:
    """Why a reaped child gave no result: its CPU limit (``SIGXCPU``), or a crash."""
    if process.exitcode == -signal.SIGXCPU:
        return WorkerLimitExceeded("cpu", "the worker used up its CPU time")
    return WorkerProcessDied(f"worker exited with code {process.exitcode}")


async def _terminate(process: BaseProcess) -> None:
    """SIGTERM, then SIGKILL after a grace period; returns once the child is reaped."""
    if process.is_alive():
        process.terminate()
        await asyncio.to_thread(process.join, 1.0)
    if process.is_alive():
        process.kill()
    await asyncio.to_thread(process.join)
