"""A small thread pool for the run store's blocking calls.

Store calls are short (indexed reads, one small transaction) but block, and
SQLite serializes writers with a lock; running them here keeps the event loop
responsive when another thread holds the write lock. Calls are not
cancellable: a write that started commits or rolls back on its own (the cancel
of a run is itself such a write). They go through
:func:`heed.runtime.offload.run_blocking`, so an awaiting coroutine that is
cancelled still waits for its call to return before it unwinds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from heed.runtime.cancellation import reraise_cancellation
from heed.runtime.offload import run_blocking

__all__ = ["BlockingIO"]

P = ParamSpec("P")
T = TypeVar("T")


class BlockingIO:
    """Runs blocking store calls on a dedicated pool of *threads*."""

    def __init__(self, threads: int = 4, name: str = "heed-runs-io") -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix=name)

    async def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` on the pool; its result or exception."""
        return await run_blocking(self._pool, fn, *args, **kwargs)

    async def watch_round(
        self,
        interval: float,
        run_ids: Callable[[], list[str]],
        read: Callable[[list[str]], dict[str, T]],
        log: logging.Logger,
        what: str,
    ) -> dict[str, T]:
        """One round of a periodic watch over runs: after *interval* seconds, ``read`` of the
        runs *run_ids* then names, on the pool, and its result. Empty when it names none, or
        when the read raised (logged on *log*: *what* could not read the runs, and the watch
        goes on at its next round); a cancellation propagates."""
        await asyncio.sleep(interval)
        ids = run_ids()
        if not ids:
            return {}
        try:
            return await self.call(read, ids)
        except Exception as exc:
            reraise_cancellation(exc)
            log.exception("%s could not read the runs; it goes on", what)
            return {}

    def close(self) -> None:
        """Wait for calls in flight, then stop the threads."""
        self._pool.shutdown(wait=True)
