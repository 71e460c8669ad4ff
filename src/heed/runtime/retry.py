"""Retrying transient failures without ever retrying, or burying, a cancellation."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from heed.runtime.cancellation import reraise_cancellation
from heed.runtime.context import current_token

__all__ = ["retry_async"]

T = TypeVar("T")


async def retry_async(
    operation: Callable[[], Awaitable[T]],
    *,
    attempts: int = 3,
    base_delay: float = 0.2,
    max_delay: float = 5.0,
    retry_on: Callable[[Exception], bool] = lambda exc: True,
) -> T:
    """Await ``operation()`` up to *attempts* times with jittered exponential backoff.

    A cancellation (``OperationCancelled`` or ``asyncio.CancelledError``) is
    re-raised at once and never retried. The backoff sleep wakes early when the
    active token is cancelled. The last failure is re-raised unchanged.
    """
    if attempts < 1:
        raise ValueError("attempts must be >= 1")
    token = current_token()
    for attempt in range(1, attempts + 1):
        try:
            return await operation()
        except Exception as exc:
            reraise_cancellation(exc)
            if attempt == attempts or not retry_on(exc):
                raise
        delay = min(max_delay, base_delay * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)
        if token is None:
            await asyncio.sleep(delay)
        else:
            await token.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover
