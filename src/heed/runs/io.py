"""A small thread pool for the run store's blocking calls.

Store calls are short (indexed reads, one small transaction) but block, and
SQLite serializes writers with a lock; running them here keeps the event loop
responsive when another thread holds the write lock. Calls are not
cancellable: a write that started commits or rolls back on its own, and the
awaiting coroutine is told the outcome unless it was cancelled itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

__all__ = ["BlockingIO"]

P = ParamSpec("P")
T = TypeVar("T")


class BlockingIO:
    """Runs blocking store calls on a dedicated pool of *threads*."""

    def __init__(self, threads: int = 4, name: str = "heed-runs-io") -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix=name)

    async def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` on the pool; its result or exception."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    def close(self) -> None:
        """Wait for calls in flight, then stop the threads."""
        self._pool.shutdown(wait=True)
