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
  from the durable source.

Topics used by heed: ``run:<run_id>`` (messages are
:class:`~heed.runs.model.RunEvent`) and ``session:<session_id>`` (dicts with a
``type``: ``turn_started``, ``session_updated``, ``task_complete``).
"""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from typing import Final, Protocol

__all__ = ["LAGGED", "Broker", "InProcessBroker", "Subscription"]


class _Lagged:
    def __repr__(self) -> str:
        return "LAGGED"


#: Returned by :meth:`Subscription.get` after messages were dropped for this subscriber.
LAGGED: Final = _Lagged()


class Subscription(Protocol):
    """One subscriber's view of a topic."""

    async def get(self, wait_seconds: float | None = None) -> object | None:
        """The next message, :data:`LAGGED`, or ``None`` after *wait_seconds*."""
        ...

    def close(self) -> None:
        """Stop receiving; idempotent."""
        ...


class Broker(Protocol):
    """Publish/subscribe of hints about committed state. See the module docstring."""

    def publish(self, topic: str, message: object) -> None: ...

    def subscribe(self, topic: str, *, maxsize: int = 4096) -> Subscription: ...


class _LocalSubscription:
    def __init__(self, broker: InProcessBroker, topic: str, maxsize: int) -> None:
        self._broker = broker
        self._topic = topic
        self._queue: asyncio.Queue[object] = asyncio.Queue(maxsize)
        self._lagged = False
        self._closed = False
        self.loop = asyncio.get_running_loop()

    def deliver(self, message: object) -> None:
        if self._closed:
            return
        try:
            self._queue.put_nowait(message)
        except asyncio.QueueFull:
            self._lagged = True

    async def get(self, wait_seconds: float | None = None) -> object | None:
        if self._lagged:
            self._lagged = False
            while not self._queue.empty():
                self._queue.get_nowait()
            return LAGGED
        if not self._queue.empty():
            return self._queue.get_nowait()
        try:
            return await asyncio.wait_for(self._queue.get(), wait_seconds)
        except TimeoutError:
            return None

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._broker._remove(self._topic, self)


class InProcessBroker:
    """A :class:`Broker` for one process: per-topic bounded asyncio queues."""

    def __init__(self) -> None:
        self._topics: dict[str, set[_LocalSubscription]] = defaultdict(set)
        self._lock = threading.Lock()

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
