"""Cancellation tokens: the one signal that tells work to stop.

A :class:`CancellationToken` is a one-shot flag with a reason. It is cancelled
at most once (the first reason wins), can be read and cancelled from any thread,
and can be awaited. Work checks it at checkpoints with
:meth:`CancellationToken.raise_if_cancelled`, which raises
:class:`OperationCancelled`.

Why a token and not ``asyncio.Task.cancel()``: work offloaded to a thread keeps
running when the coroutine awaiting it is cancelled. A token is visible inside
the thread, so the work itself can stop (see :mod:`heed.runtime.offload`).

:class:`OperationCancelled` is an ``Exception`` subclass on purpose, so code that
gathers with ``return_exceptions=True`` still sees it. The price is that a broad
``except Exception`` would swallow it; every broad handler on a cancellable path
therefore starts with the one idiom heed uses::

    except Exception as exc:
        reraise_cancellation(exc)
        ...  # handle real failures

``tests/test_cancellation_idiom.py`` checks the source tree for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import weakref
from collections.abc import Callable
from typing import Final

__all__ = [
    "DEADLINE_EXCEEDED",
    "CancelCallback",
    "CancellationToken",
    "OperationCancelled",
    "reraise_cancellation",
]

DEADLINE_EXCEEDED: Final = "deadline exceeded"

CancelCallback = Callable[[str], object]


class OperationCancelled(Exception):
    """Raised by a checkpoint when its token has been cancelled.

    ``reason`` is the token's first cancellation reason, for logs and metrics.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def reraise_cancellation(exc: BaseException) -> None:
    """Re-raise *exc* if it is a cancellation; otherwise return.

    Call it first in every broad ``except Exception`` handler on a cancellable
    path, so that retry wrappers and error translators never bury a
    cancellation. ``asyncio.CancelledError`` is a ``BaseException`` and is not
    caught by ``except Exception``, but is re-raised here too for handlers that
    catch ``BaseException``.
    """
    if isinstance(exc, OperationCancelled | asyncio.CancelledError):
        raise exc


class _CallbackHandle:
    """Returned by :meth:`CancellationToken.on_cancel`; ``remove()`` unregisters."""

    __slots__ = ("_key", "_token_ref")

    def __init__(self, token: CancellationToken, key: int) -> None:
        self._token_ref = weakref.ref(token)
        self._key = key

    def remove(self) -> None:
        token = self._token_ref()
        if token is not None:
            token._remove_callback(self._key)


class CancellationToken:
    """A one-shot, thread-safe, awaitable cancellation flag.

    - ``cancel(reason)`` is idempotent: the first reason wins and callbacks run
      once, in the cancelling thread, outside the token's lock.
    - ``child()`` returns a token cancelled with this one (never the reverse).
    - ``with_deadline`` / ``deadline=`` make the token cancel itself with reason
      ``"deadline exceeded"`` at a ``time.monotonic()`` instant.
    """

    __slots__ = (
        "__weakref__",
        "_callbacks",
        "_deadline",
        "_event",
        "_lock",
        "_next_key",
        "_parent_handle",
        "_reason",
        "_timer",
        "cancelled_at",
    )

    def __init__(self, *, deadline: float | None = None) -> None:
        self._lock = threading.Lock()
        # Made by the first wait_sync only: most tokens (one per request, per offload call)
        # are never waited on from a thread, and an Event costs a lock and a condition.
        self._event: threading.Event | None = None
        self._reason: str | None = None
        self._callbacks: dict[int, CancelCallback] = {}
        self._next_key = 0
        self._deadline: float | None = None
        self._timer: threading.Timer | asyncio.TimerHandle | None = None
        self._parent_handle: _CallbackHandle | None = None
        #: ``time.monotonic()`` when the token was cancelled, else ``None``.
        self.cancelled_at: float | None = None
        if deadline is not None:
            self.set_deadline(deadline)

    # -- reading -----------------------------------------------------------------

    @property
    def cancelled(self) -> bool:
        """True once cancelled (a passed deadline counts, even before its timer fires)."""
        if self._reason is not None:
            return True
        deadline = self._deadline
        if deadline is not None and time.monotonic() >= deadline:
            self.cancel(DEADLINE_EXCEEDED)
            return True
        return False

    @property
    def reason(self) -> str | None:
        """The first cancellation reason, or ``None`` while not cancelled."""
        return self._reason if self.cancelled else None

    @property
    def deadline(self) -> float | None:
        """The ``time.monotonic()`` instant at which the token cancels itself."""
        return self._deadline

    def raise_if_cancelled(self) -> None:
        """A checkpoint: raise :class:`OperationCancelled` if cancelled."""
        if self.cancelled:
            raise OperationCancelled(self._reason or "cancelled")

    # -- cancelling --------------------------------------------------------------

    def cancel(self, reason: str = "cancelled") -> bool:
        """Cancel the token. Returns True if this call cancelled it, False if it already was."""
        with self._lock:
            if self._reason is not None:
                return False
            self._reason = reason
            self.cancelled_at = time.monotonic()
            callbacks = list(self._callbacks.values())
            self._callbacks.clear()
            timer = self._timer
            self._timer = None
            if self._event is not None:
                self._event.set()
        if timer is not None:
            timer.cancel()
        for callback in callbacks:
            callback(reason)
        return True

    def on_cancel(self, callback: CancelCallback) -> _CallbackHandle:
        """Run ``callback(reason)`` when cancelled, at once if already cancelled.

        Returns a handle whose ``remove()`` unregisters the callback. Callbacks
        may run in any thread: one that touches an event loop must use
        ``loop.call_soon_threadsafe``.
        """
        with self._lock:
            key = self._next_key
            self._next_key += 1
            if self._reason is None:
                self._callbacks[key] = callback
                return _CallbackHandle(self, key)
            reason = self._reason
        callback(reason)
        return _CallbackHandle(self, key)

    def _remove_callback(self, key: int) -> None:
        with self._lock:
            self._callbacks.pop(key, None)

    # -- relations ---------------------------------------------------------------

    def child(self, *, deadline: float | None = None) -> CancellationToken:
        """A new token cancelled whenever this one is (with the same reason).

        Cancelling the child never cancels the parent. The parent holds the child
        only weakly, so abandoned children do not accumulate.
        """
        child = CancellationToken(deadline=deadline)
        child_ref = weakref.ref(child)

        def propagate(reason: str) -> None:
            target = child_ref()
            if target is not None:
                target.cancel(reason)

        child._parent_handle = self.on_cancel(propagate)
        return child

    def release_parent(self) -> None:
        """Stop listening to the parent token (for children that finished their work)."""
        handle, self._parent_handle = self._parent_handle, None
        if handle is not None:
            handle.remove()

    def set_deadline(self, deadline: float) -> None:
        """Cancel with reason ``"deadline exceeded"`` at ``time.monotonic()`` *deadline*.

        An earlier deadline replaces a later one; a later one is ignored. The
        timer uses the running event loop when there is one, else a daemon
        thread timer; reads check the deadline lazily as well.
        """
        with self._lock:
            if self._reason is not None:
                return
            if self._deadline is not None and self._deadline <= deadline:
                return
            self._deadline = deadline
            old = self._timer
            delay = max(0.0, deadline - time.monotonic())
            timer: threading.Timer | asyncio.TimerHandle
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                thread_timer = threading.Timer(delay, self.cancel, args=(DEADLINE_EXCEEDED,))
                thread_timer.daemon = True
                timer = thread_timer
                thread_timer.start()
            else:
                timer = loop.call_later(delay, self.cancel, DEADLINE_EXCEEDED)
            self._timer = timer
        if old is not None:
            old.cancel()

    def with_deadline(self, seconds: float) -> CancellationToken:
        """Set a deadline *seconds* from now and return ``self``."""
        self.set_deadline(time.monotonic() + seconds)
        return self

    # -- waiting -----------------------------------------------------------------

    async def wait(self) -> str:
        """Wait until cancelled; return the reason. Wakes promptly from any thread."""
        if self.cancelled:
            return self._reason or "cancelled"
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[str] = loop.create_future()

        def wake(reason: str) -> None:
            def resolve() -> None:
                if not waiter.done():
                    waiter.set_result(reason)

            loop.call_soon_threadsafe(resolve)

        handle = self.on_cancel(wake)
        try:
            deadline = self._deadline
            if deadline is None:
                return await waiter
            try:
                return await asyncio.wait_for(
                    asyncio.shield(waiter), max(0.0, deadline - time.monotonic())
                )
            except TimeoutError:
                self.cancel(DEADLINE_EXCEEDED)
                return self._reason or DEADLINE_EXCEEDED
        finally:
            handle.remove()

    async def sleep(self, seconds: float) -> None:
        """Sleep *seconds* (a backoff, a pause), waking early when the token is cancelled:
        then raise :class:`OperationCancelled` (at once when it already is)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wait(), seconds)
        self.raise_if_cancelled()

    def wait_sync(self, timeout: float | None = None) -> bool:
        """Block the calling thread until cancelled or *timeout*; True if cancelled."""
        if self._deadline is not None:
            remaining = self._deadline - time.monotonic()
            timeout = remaining if timeout is None else min(timeout, remaining)
        with self._lock:
            if self._reason is not None:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        event.wait(None if timeout is None else max(0.0, timeout))
        return self.cancelled

    def __repr__(self) -> str:
        state = f"cancelled {self._reason!r}" if self._reason is not None else "active"
        return f"<CancellationToken {state}>"
