"""Turning the request token's cancellation into something an event loop can race.

A :class:`CancelWatch` is made at the start of one provider stream. It holds
the active token (or none, for internal callers) and an ``asyncio`` future that
resolves, on the stream's loop, the moment the token is cancelled from any
thread. Providers then:

- ``await watch.race(aw)``: await *aw* unless the token is cancelled first, in
  which case *aw* is cancelled, awaited to its end, and
  :class:`~heed.runtime.OperationCancelled` is raised;
- ``await watch.sleep(seconds)``: a per-token delay that wakes on cancel;
- ``watch.close()`` when the stream ends (unregisters the callback).

Outside a stream, :func:`heed.runtime.sleep_unless_cancelled` is a delay (a backoff, a
pause) under the active token, without a watch.

No polling: the wake-up is a ``call_soon_threadsafe`` from the token's callback.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from heed.runtime import CancellationToken, OperationCancelled, current_token, settle

__all__ = ["CancelWatch"]

T = TypeVar("T")


class CancelWatch:
    """Watches one token for one stream; use from the loop that created it."""

    def __init__(self, token: CancellationToken | None = None, *, use_active: bool = True) -> None:
        if token is None and use_active:
            token = current_token()
        self.token = token
        self._loop = asyncio.get_running_loop()
        self.cancelled: asyncio.Future[str] = self._loop.create_future()
        self._handle = token.on_cancel(self._wake) if token is not None else None

    def _wake(self, reason: str) -> None:
        # May run in any thread (whoever cancels the token).
        # A closed loop raises RuntimeError: nobody is waiting any more.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._resolve, reason)

    def _resolve(self, reason: str) -> None:
        if not self.cancelled.done():
            self.cancelled.set_result(reason)

    @property
    def is_cancelled(self) -> bool:
        return self.token is not None and self.token.cancelled

    def check(self) -> None:
        """A checkpoint: raise :class:`OperationCancelled` if the token is cancelled."""
        if self.token is not None:
            self.token.raise_if_cancelled()

    def _raise(self) -> None:
        reason = self.token.reason if self.token is not None else None
        raise OperationCancelled(reason or "cancelled")

    async def race(self, aw: Awaitable[T]) -> T:
        """Await *aw*, or cancel it and raise :class:`OperationCancelled` on token cancel.

        When the token wins, *aw* (wrapped in a task) is cancelled and awaited
        until it has finished, so its ``finally`` blocks (closing a response) have
        run before this raises. If the awaiting task itself is cancelled, *aw* is
        cancelled too.
        """
        task = asyncio.ensure_future(aw)  # wrapped first, so *aw* is never left un-awaited
        if not self.is_cancelled:
            waiters: set[asyncio.Future[object]] = {task, self.cancelled}  # type: ignore[arg-type]
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            except BaseException:
                await settle(task)
                raise
            if task.done():
                return task.result()
        await settle(task)
        self._raise()
        raise AssertionError("unreachable")  # pragma: no cover

    async def sleep(self, seconds: float) -> None:
        """Sleep *seconds*, waking at once (raising) if the token is cancelled."""
        self.check()
        if seconds > 0:
            await asyncio.wait({self.cancelled}, timeout=seconds)
            self.check()

    def close(self) -> None:
        """Unregister from the token; idempotent."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        if not self.cancelled.done():
            self.cancelled.cancel()
