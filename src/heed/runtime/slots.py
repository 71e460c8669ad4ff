"""Work slots: concurrency limits that bound real work, not awaiting coroutines.

Each kind of work has a :class:`Lane` (recall, reflect, retain, turn) with a
number of slots and a bounded queue. The rules:

- A slot belongs to the work. ``async with lane.slot(token):`` releases it when
  the block exits, and the block does not exit while work it offloaded is still
  running (:mod:`heed.runtime.offload` waits for its thread or process to stop,
  even when the awaiting task is cancelled). So a lane of 4 never has more than
  4 pieces of real work in flight.
- Work whose token is cancelled while it waits in the queue leaves the queue at
  once and never starts.
- A full queue rejects at once with :class:`LaneFull`, which carries a
  ``retry_after`` hint (the HTTP layer answers 503 with ``Retry-After``).

Lanes are used from one event loop; the token may be cancelled from any thread.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from heed.runtime.cancellation import CancellationToken, OperationCancelled
from heed.runtime.context import current_token

__all__ = ["Lane", "LaneFull", "LaneStats", "Lanes"]


class LaneFull(Exception):
    """The lane's queue is full; the caller should retry after ``retry_after`` seconds."""

    def __init__(self, lane: str, retry_after: int) -> None:
        super().__init__(f"the {lane} lane is at capacity; retry after {retry_after} s")
        self.lane = lane
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class LaneStats:
    """A snapshot of a lane's live counters."""

    name: str
    capacity: int
    max_queue: int
    in_use: int
    queued: int
    abandoned: int
    """Slots still held by work whose token was cancelled (it has not stopped yet)."""
    rejected_total: int
    cancelled_in_queue_total: int


class _Slot:
    __slots__ = ("token",)

    def __init__(self, token: CancellationToken | None) -> None:
        self.token = token


class Lane:
    """A bounded pool of slots with a bounded FIFO queue."""

    def __init__(self, name: str, capacity: int, max_queue: int, retry_after: int = 1) -> None:
        if capacity < 1:
            raise ValueError(f"lane {name!r} needs capacity >= 1, got {capacity}")
        if max_queue < 0:
            raise ValueError(f"lane {name!r} needs max_queue >= 0, got {max_queue}")
        self.name = name
        self.capacity = capacity
        self.max_queue = max_queue
        self.retry_after = retry_after
        self._held: set[_Slot] = set()
        self._waiters: deque[tuple[asyncio.Future[_Slot], CancellationToken | None]] = deque()
        self._rejected_total = 0
        self._cancelled_in_queue_total = 0

    # -- counters ----------------------------------------------------------------

    def stats(self) -> LaneStats:
        held = list(self._held)
        return LaneStats(
            name=self.name,
            capacity=self.capacity,
            max_queue=self.max_queue,
            in_use=len(held),
            queued=sum(1 for w, _ in self._waiters if not w.done()),
            abandoned=sum(1 for s in held if s.token is not None and s.token.cancelled),
            rejected_total=self._rejected_total,
            cancelled_in_queue_total=self._cancelled_in_queue_total,
        )

    # -- acquiring ---------------------------------------------------------------

    @asynccontextmanager
    async def slot(self, token: CancellationToken | None = None) -> AsyncIterator[None]:
        """Hold a slot for the duration of the block.

        *token* defaults to the active request context's token. Raises
        :class:`LaneFull` when the queue is full, and :class:`OperationCancelled`
        if the token is cancelled before a slot is granted (the work never
        starts). The slot is released when the block exits, whatever the reason.
        """
        if token is None:
            token = current_token()
        slot = await self._acquire(token)
        try:
            yield
        finally:
            self._release(slot)

    async def _acquire(self, token: CancellationToken | None) -> _Slot:
        if token is not None:
            token.raise_if_cancelled()
        if len(self._held) < self.capacity and not self._waiters:
            return self._grant(token)
        if len(self._waiters) >= self.max_queue:
            self._rejected_total += 1
            raise LaneFull(self.name, self._retry_after_hint())

        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[_Slot] = loop.create_future()
        self._waiters.append((waiter, token))

        def abandon(reason: str) -> None:
            def fail() -> None:
                if not waiter.done():
                    waiter.set_exception(OperationCancelled(reason))

            loop.call_soon_threadsafe(fail)

        handle = token.on_cancel(abandon) if token is not None else None
        try:
            return await waiter
        except OperationCancelled:
            self._cancelled_in_queue_total += 1
            raise
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                # A slot was granted just as the awaiting task was cancelled: give it back.
                self._release(waiter.result())
            raise
        finally:
            if handle is not None:
                handle.remove()
            self._remove_waiter(waiter)

    def _grant(self, token: CancellationToken | None) -> _Slot:
        slot = _Slot(token)
        self._held.add(slot)
        return slot

    def _release(self, slot: _Slot) -> None:
        self._held.discard(slot)
        # Hand freed slots to the oldest waiters still waiting; the slot is
        # counted as held from this moment, not from when the waiter resumes.
        while self._waiters and len(self._held) < self.capacity:
            waiter, token = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(self._grant(token))

    def _remove_waiter(self, waiter: asyncio.Future[_Slot]) -> None:
        for i, (candidate, _) in enumerate(self._waiters):
            if candidate is waiter:
                del self._waiters[i]
                return

    def _retry_after_hint(self) -> int:
        return max(1, math.ceil(self.retry_after))


class Lanes:
    """The lanes of one server, by name."""

    def __init__(self, lanes: Iterable[Lane]) -> None:
        self._lanes = {lane.name: lane for lane in lanes}

    def __getitem__(self, name: str) -> Lane:
        return self._lanes[name]

    def __contains__(self, name: object) -> bool:
        return name in self._lanes

    def all(self) -> list[Lane]:
        return list(self._lanes.values())
