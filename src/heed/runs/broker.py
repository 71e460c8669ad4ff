"""Fan-out of committed events to live subscribers (the Signals/Broker interface).

The journal in the database is the truth; the broker only carries *hints* so
that live readers wake at once instead of polling. Everything published has
already been written durably, so a subscriber that misses a message loses
nothing: it re-reads the journal (see :mod:`heed.runs.journal`). That is what
lets a Redis pub/sub implementation replace :class:`InProcessBroker` later
without changing readers.

Contract of a :class:`Broker`:

- ``publish(topic, message)`` never blocks and never raises for slow
  subscribers; it may be called from any thread.
- ``subscribe(topic)`` returns a :class:`Subscription` that receives messages
  published after it was created, in publish order. When its bounded buffer
  overflows, the overflowing messages are dropped and the next
  :meth:`Subscription.get` returns :data:`LAGGED` once, so the reader re-syncs
  from the durable source. :meth:`Subscription.stop` (any thread) makes the
  reader's pending or next ``get`` return :data:`STOPPED` -- how a stream
  whose client left ends at once.

Topics used by heed: ``run:<run_id>`` (messages are
:class:`~heed.runs.model.RunEvent`) and ``session:<session_id>`` (dicts with a
``type``: ``turn_started``, ``session_updated``, ``task_complete``).
"""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict, deque
from typing import Final, Protocol

__all__ = ["LAGGED", "STOPPED", "Broker", "InProcessBroker", "Subscription"]


class _Lagged:
    def __repr__(self) -> str:
        return "LAGGED"


#: Returned by :meth:`Subscription.get` after messages were dropped for this subscriber.
LAGGED: Final = _Lagged()


class _Stopped:
    def __repr__(self) -> str:
        return "STOPPED"


#: Returned by :meth:`Subscription.get` once :meth:`Subscription.stop` was called.
STOPPED: Final = _Stopped()


class Subscription(Protocol):
    """One subscriber's view of a topic."""

    async def ready(self, wait_seconds: float = 1.0) -> bool:
        """Wait (at most *wait_seconds*) until messages other processes publish reach this
        subscription; ``True`` once they do. Readers call it before replaying the durable
        source, so nothing committed after the replay is missed. Local messages always do."""
        ...

    async def get(self, wait_seconds: float | None = None) -> object | None:
        """The next message, :data:`LAGGED`, :data:`STOPPED`, or ``None`` after
        *wait_seconds*."""
        ...

    def get_nowait(self) -> object | None:
        """Like :meth:`get` without waiting: ``None`` when nothing is ready."""
        ...

    def stop(self) -> None:
        """Wake the reader with :data:`STOPPED` (callable from any thread)."""
        ...

    def close(self) -> None:
        """Stop receiving; idempotent."""
        ...


class Broker(Protocol):
    """Publish/subscribe of hints about committed state. See the module docstring."""

    async def start(self) -> None:
        """Connect, before the server serves; raises when the broker cannot be reached (so a
        server fails fast rather than serving without its signals)."""
        ...

    async def aclose(self) -> None:
        """Release what :meth:`start` opened; idempotent."""
        ...

    async def ping(self) -> None:
        """Return once the broker's bus answered (readiness); raise when it cannot be
        reached. The caller bounds the wait."""
        ...

    def publish(self, topic: str, message: object) -> None: ...

    def subscribe(self, topic: str, *, maxsize: int = 4096) -> Subscription: ...


class _LocalSubscription:
    def __init__(self, broker: InProcessBroker, topic: str, maxsize: int) -> None:
        self._broker = broker
        self._topic = topic
        self._maxsize = maxsize
        self._items: deque[object] = deque()
        self._ready = asyncio.Event()
        self._lagged = False
        self._stopped = False
        self._closed = False
        self.loop = asyncio.get_running_loop()

    async def ready(self, wait_seconds: float = 1.0) -> bool:
        return True  # one process: every publisher is local

    def deliver(self, message: object) -> None:
        if self._closed:
            return
        if len(self._items) >= self._maxsize:
            self._lagged = True
        else:
            self._items.append(message)
        self._ready.set()

    def _stop(self) -> None:
        self._stopped = True
        self._ready.set()

    def stop(self) -> None:
        """Make the next (or a pending) ``get`` return :data:`STOPPED`; any thread."""
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            self._stop()
        else:
            self.loop.call_soon_threadsafe(self._stop)

    def get_nowait(self) -> object | None:
        if self._stopped:
            return STOPPED
        if self._lagged:
            self._lagged = False
            self._items.clear()
            return LAGGED
        if self._items:
            return self._items.popleft()
        return None

    async def get(self, wait_seconds: float | None = None) -> object | None:
        message = self.get_nowait()
        if message is not None:
            return message
        self._ready.clear()
        try:
            async with asyncio.timeout(wait_seconds):
                await self._ready.wait()
        except TimeoutError:
            return None
        return self.get_nowait()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._broker._remove(self._topic, self)


class InProcessBroker:
    """A :class:`Broker` for one process: per-topic bounded asyncio queues."""

    def __init__(self) -> None:
        self._topics: dict[str, set[_LocalSubscription]] = defaultdict(set)
        self._lock = threading.Lock()

    async def start(self) -> None:
        """Nothing to connect: every subscriber is in this process."""

    async def aclose(self) -> None:
        """Nothing to release."""

    async def ping(self) -> None:
        """Always reachable: the bus is this process."""

    def subscribe(self, topic: str, *, maxsize: int = 4096) -> _LocalSubscription:
        """Must be called on an event loop; messages are delivered on that loop."""
        sub = _LocalSubscription(self, topic, maxsize)
        with self._lock:
            self._topics[topic].add(sub)
        return sub

    def publish(self, topic: str, message: object) -> None:
        with self._lock:
            subs = list(self._topics.get(topic, ()))
        if not subs:
            return
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        for sub in subs:
            if sub.loop is running:
                sub.deliver(message)
            else:
                sub.loop.call_soon_threadsafe(sub.deliver, message)

    def subscriber_count(self, topic: str) -> int:
        with self._lock:
            return len(self._topics.get(topic, ()))

    def _remove(self, topic: str, sub: _LocalSubscription) -> None:
        with self._lock:
            subs = self._topics.get(topic)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self._topics[topic]
