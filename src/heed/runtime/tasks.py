"""Waiting for a child task to settle: the one idiom for "stop it, and wait until it stopped".

A stream that hands work to a child task (an upstream pump, a generation thread, an agent
loop) must not return, or raise, before the child has finished: the child may hold a lane
slot's real work, an open upstream response or a thread. The hand-written form,
``child.cancel(); await asyncio.wait({child})``, has a hole: when the awaiting task is
cancelled a second time while it waits, ``asyncio.wait`` raises at once and the child is
abandoned while it still runs. :func:`settle` closes the hole.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

__all__ = ["settle"]


async def settle(child: asyncio.Future[Any], stop: Callable[[], object] | None = None) -> None:
    """Stop *child* (call *stop*, by default ``child.cancel``) unless it is done, and return
    only once it has finished.

    - Cancelling the caller while it waits (once or many times) does not abandon *child*: it
      is asked to stop again and still awaited; the caller's ``CancelledError`` is re-raised
      after *child* settled.
    - *child*'s own outcome (result, exception, cancellation) is retrieved and dropped: the
      caller reads it from *child* if it wants it.
    """
    stop_child = stop if stop is not None else child.cancel
    if not child.done():
        stop_child()
    interrupted: asyncio.CancelledError | None = None
    while not child.done():
        try:
            await asyncio.wait({child})
        except asyncio.CancelledError as exc:
            interrupted = exc
            stop_child()
    if not child.cancelled():
        child.exception()  # retrieved, so asyncio never logs it as unhandled
    if interrupted is not None:
        raise interrupted
