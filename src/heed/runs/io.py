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

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

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

    def close(self) -> None:
        """Wait for calls in flight, then stop the threads."""
        self._pool.shutdown(wait=True)
