"""Child tasks that always settle: the one idiom for "stop it, and wait until it stopped",
for running pieces of work side by side (:func:`run_all`), and for waiting on an event as
long as the work is wanted (:func:`wait_for_event`).

A stream that hands work to a child task (an upstream pump, a generation thread, an agent
loop) must not return, or raise, before the child has finished: the child may hold a lane
slot's real work, an open upstream response or a thread. The hand-written form,
``child.cancel(); await asyncio.wait({child})``, has a hole: when the awaiting task is
cancelled a second time while it waits, ``asyncio.wait`` raises at once and the child is
abandoned while it still runs. :func:`settle` closes the hole.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from heed.runtime.context import current_token

__all__ = ["run_all", "settle", "sleep_unless_cancelled", "wait_for_event"]

T = TypeVar("T")


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


async def run_all(work: Sequence[Callable[[], Awaitable[T]]], limit: int) -> list[T]:
    """Await every ``work[i]()``, at most *limit* at once, and return their results in order.

    Each piece runs in a child task of the caller's context (its token, tenant, LLM work and
    tally). The first failure stops the others (they are cancelled), and it is re-raised
    itself, not wrapped in an ``ExceptionGroup``, once every child has finished: a caller
    handles an ``OperationCancelled`` or a provider error as if the work had run one piece
    after another. Cancelling the caller cancels every child and returns only once they
    stopped (``asyncio.TaskGroup``'s promise). With *limit* 1, or one piece, nothing runs
    concurrently.
    """
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    if len(work) <= 1 or limit == 1:
        return [await piece() for piece in work]
    gate = asyncio.Semaphore(limit)

    async def bounded(piece: Callable[[], Awaitable[T]]) -> T:
        async with gate:
            return await piece()

    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(bounded(piece)) for piece in work]
    except BaseExceptionGroup as group_error:
        raise _first_cause(group_error) from None
    return [task.result() for task in tasks]


def _first_cause(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The failure that stopped a group: its first exception that is not a child's
    ``CancelledError`` (the siblings it cancelled), else the first one."""
    leaves: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        exc = pending.pop(0)
        if isinstance(exc, BaseExceptionGroup):
            pending[:0] = list(exc.exceptions)
        else:
            leaves.append(exc)
    for exc in leaves:
        if not isinstance(exc, asyncio.CancelledError):
            return exc
    return leaves[0]


async def wait_for_event(event: asyncio.Event, seconds: float | None) -> bool:
    """Wait until *event* is set or *seconds* passed (``None``: no limit), and say
    whether it was set. Raises ``OperationCancelled`` as soon as the active token is
    cancelled: a wait for "something changed" never outlives the work that waits."""
    waits: set[asyncio.Future[Any]] = {asyncio.ensure_future(event.wait())}
    token = current_token()
    if token is not None:
        waits.add(asyncio.ensure_future(token.wait()))
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for future in waits:
            future.cancel()
    if token is not None:
        token.raise_if_cancelled()
    return event.is_set()


async def sleep_unless_cancelled(seconds: float) -> None:
    """Sleep *seconds* (a backoff, a pause) under the active token: wakes at once and raises
    ``OperationCancelled`` when it is (or was) cancelled; with no active token, a plain
    sleep."""
    token = current_token()
    if token is None:
        await asyncio.sleep(seconds)
    else:
        await token.sleep(seconds)
