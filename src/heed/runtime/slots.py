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
- **Fair between tenants.** Waiters queue per tenant (the active context's), and
  freed slots go round-robin over the tenants that wait, so one tenant's storm
  delays its own requests, not everybody's. When the queue is full, the newcomer
  of a tenant with fewer waiters than the busiest tenant takes the place of that
  tenant's newest waiter, which is refused instead.
- **Cheap work first, without starving dear work.** Within a tenant's queue, a
  waiter that said its work costs ``cost`` times the usual (a high-budget recall)
  is served as if it had arrived ``(cost - 1)`` x the recent slot hold time later:
  a cheap request overtakes a few dear ones, never an unbounded number.
- **A slot kept for cheap work.** Work acquired with ``dear=True`` (a high-budget
  recall) holds at most ``dear_capacity`` slots at once; the rest wait for usual
  work, which takes a free one at once. A lane saturated by dear work (a client
  looping high-budget recalls) then never makes a cheap request wait for a dear
  one to finish. Whether work is dear is the caller's call, apart from its cost:
  a mid-budget recall waits a little behind low-budget ones but may take any slot.
- **Sheds rather than queues.** A full queue refuses at once, and so does a queue
  whose expected wait (waiters ahead / capacity x the recent slot hold time, an
  exponential moving average) exceeds ``max_wait``; a waiter still waiting after
  ``max_wait`` is refused too. Refusal is :class:`LaneFull`, with a
  ``retry_after`` hint (the HTTP layer answers 503 with ``Retry-After``).

Background work (consolidation, mental-model refreshes, bank transfers:
``lane.slot(background=True)``) goes through the same lanes, with a lower priority rather
than a pool of its own:

- **Interactive first.** A background waiter is granted a slot only when no interactive
  waiter is queued in the lane; a freed slot goes to interactive waiters first (by the
  rules above), to background waiters only when no interactive waiter is queued. With
  spare capacity, background work takes a free slot at once.
- **Interactive first across lanes, for the CPU.** Lanes that do CPU work (``cpu_bound``:
  recall and retain) share a :class:`CpuBudget`: while interactive work holds as many of
  their slots as the budget (the machine's cores), background work in *any* lane waits,
  so a consolidation's recalls do not take a core a user's retain is using, although the
  recall lane itself is idle. When the interactive work drops below the budget, waiting
  background work is dispatched in every lane.
- **A reserve for interactive work.** Background work holds at most
  ``background_capacity`` slots at once (by default all but one: on a 2-slot lane one
  slot stays free for a user's request while background work runs); a background
  acquire that finds a free slot but the background limit reached queues.
- **The reserve lent while unused.** Short pieces of background CPU work (a bulk
  retain's embedding) may also take the reserved slot, without waiting, when nothing waits
  in the lane and no interactive CPU work has held or waited for a slot for a while
  (:meth:`Lane.lent_slot`): an idle machine's cores all work on a backlog, and a user
  arriving meanwhile waits at most one such piece, once.
- **Never starved forever.** A background waiter that has waited over
  ``background_max_defer`` seconds is served as if it were interactive (cheap) work: it
  takes the next freed slot unless an interactive waiter that may take it arrived
  before it (still within ``background_capacity``). Aging orders background work against
  interactive work only: between tenants the ring decides (the first tenant in it whose
  oldest waiter has aged competes), so an aged backlog never jumps another tenant.
- **Fair between tenants, never refused.** Background waiters queue per tenant (the
  active context's: a run's), first in, first out within a tenant (cost and ``dear`` do
  not apply), and a slot free for background work goes round-robin over the tenants
  that wait, as interactive slots do: one tenant's flood of consolidations or mental-model
  refreshes delays its own background work, and another tenant's waits for at most one
  turn of the ring. A tenant's queue holds at most ``background_max_queue`` waiters; its
  waiters past that are *deferred*: they wait behind its queued ones, in order, and join
  its queue as places in it free up (their ``background_max_defer`` counts from then).
  Background work is never refused (no :class:`LaneFull`), and no tenant's work waits
  behind another tenant's backlog. Background waiters do not count in ``max_queue``, the
  expected wait or the shedding of interactive waiters and have no ``max_wait``:
  background work waits patiently. A cancelled token takes a background waiter (queued or
  deferred) out at once, as it does an interactive one, and the slot still belongs to the
  work.

Lanes are used from one event loop; the token may be cancelled from any thread.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Iterator, MutableSequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

from heed.runtime.cancellation import CancellationToken, OperationCancelled
from heed.runtime.context import _current

__all__ = ["CpuBudget", "Lane", "LaneFull", "LaneStats", "Lanes"]

#: Weight of the newest slot hold time in the moving average.
_EWMA_WEIGHT = 0.2


class LaneFull(Exception):
    """The lane sheds this work; the caller should retry after ``retry_after`` seconds."""

    def __init__(self, lane: str, retry_after: int, why: str = "is at capacity") -> None:
        super().__init__(f"the {lane} lane {why}; retry after {retry_after} s")
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
    shed_total: int = 0
    """Work refused for its expected or actual queue wait, or displaced by fairness."""
    hold_seconds: float = 0.0
    """The moving average of how long a slot is held."""
    background_in_use: int = 0
    """Slots held by background work (part of ``in_use``)."""
    background_queued: int = 0
    """Background waiters in the tenants' queues (not part of ``queued``, which counts
    interactive waiters)."""
    background_deferred: int = 0
    """Background waiters deferred past their tenant's ``background_max_queue`` (not part
    of ``background_queued``)."""


class CpuBudget:
    """How many interactive slots of ``cpu_bound`` lanes may be held before background work
    in every lane waits (see the module docstring). One per :class:`Lanes`."""

    def __init__(self, cores: int) -> None:
        if cores < 1:
            raise ValueError(f"a CPU budget needs cores >= 1, got {cores}")
        self.cores = cores
        self.held = 0
        #: When interactive CPU work last held a slot (``monotonic``).
        self.busy_at = -math.inf
        self._lanes: list[Lane] = []

    def full(self) -> bool:
        """Whether interactive CPU work uses every core: background work waits."""
        return self.held >= self.cores

    def wanted(self) -> bool:
        """Whether users' CPU work holds every core or waits for a slot in some lane: then
        background CPU work should hold a core for as short a time as it can."""
        return self.full() or any(lane._queued for lane in self._lanes)

    def quiet(self, seconds: float) -> bool:
        """Whether no interactive CPU work has held or waited for a slot of any lane for
        *seconds*: the cores are idle of users' work (see :meth:`Lane.lent_slot`)."""
        if self.held or any(lane._queued for lane in self._lanes):
            return False
        return time.monotonic() - self.busy_at >= seconds

    def _attach(self, lane: Lane) -> None:
        self._lanes.append(lane)

    def _dispatch(self) -> None:
        """A core came free: background work waiting in any lane may go."""
        for lane in self._lanes:
            if lane._background_queued:
                lane._dispatch()


class _Slot:
    __slots__ = ("background", "dear", "granted_at", "lent", "token")

    def __init__(
        self, token: CancellationToken | None, dear: bool, background: bool, lent: bool = False
    ) -> None:
        self.token = token
        self.dear = dear
        self.background = background
        #: Background work in the reserved slot (:meth:`Lane.lent_slot`): not counted in
        #: ``background_capacity``, so it never keeps queued background work waiting.
        self.lent = lent
        self.granted_at = time.monotonic()


@dataclass(eq=False, slots=True)
class _Waiter:
    future: asyncio.Future[_Slot]
    token: CancellationToken | None
    tenant: str
    dear: bool = False
    background: bool = False
    #: When it arrived (a deferred background waiter: when it joined its tenant's queue).
    arrived_at: float = field(default_factory=time.monotonic)
    #: When it is served, in its tenant's queue: arrival, later for dearer work.
    virtual_at: float = 0.0
    #: A background waiter that has waited over ``background_max_defer`` in its queue.
    aged: bool = False
    #: A background waiter past its tenant's ``background_max_queue`` (not yet queued).
    deferred: bool = False
    #: Its timer (shedding an interactive waiter, aging a background one), if any.
    timer: asyncio.TimerHandle | None = None


#: A tenant's queue of waiters (the interactive ones' list, a background deque).
Q = TypeVar("Q", bound=MutableSequence[_Waiter])


def _virtual_at(waiter: _Waiter) -> float:
    return waiter.virtual_at


class Lane:
    """A bounded pool of slots with a bounded, tenant-fair queue (see the module docstring)."""

    def __init__(
        self,
        name: str,
        capacity: int,
        max_queue: int,
        retry_after: int = 1,
        max_wait: float | None = None,
        dear_capacity: int | None = None,
        background_capacity: int | None = None,
        background_max_defer: float | None = 10.0,
        background_max_queue: int = 64,
        cpu_bound: bool = False,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"lane {name!r} needs capacity >= 1, got {capacity}")
        if dear_capacity is not None and dear_capacity < 1:
            raise ValueError(f"lane {name!r} needs dear_capacity >= 1, got {dear_capacity}")
        if background_capacity is not None and background_capacity < 1:
            raise ValueError(
                f"lane {name!r} needs background_capacity >= 1, got {background_capacity}"
            )
        if background_max_defer is not None and background_max_defer < 0:
            raise ValueError(
                f"lane {name!r} needs background_max_defer >= 0 or None, got {background_max_defer}"
            )
        if background_max_queue < 1:
            raise ValueError(
                f"lane {name!r} needs background_max_queue >= 1, got {background_max_queue}"
            )
        if max_queue < 0:
            raise ValueError(f"lane {name!r} needs max_queue >= 0, got {max_queue}")
        if max_wait is not None and max_wait <= 0:
            raise ValueError(f"lane {name!r} needs max_wait > 0 or None, got {max_wait}")
        self.name = name
        self.capacity = capacity
        self.max_queue = max_queue
        self.retry_after = retry_after
        self.max_wait = max_wait
        self.dear_capacity = capacity if dear_capacity is None else min(capacity, dear_capacity)
        self._dear_held = 0
        self.background_capacity = (
            max(1, capacity - 1)
            if background_capacity is None
            else min(capacity, background_capacity)
        )
        self.background_max_defer = background_max_defer
        self.background_max_queue = background_max_queue
        #: Whether its interactive slots count in the :class:`CpuBudget` of its lanes.
        self.cpu_bound = cpu_bound
        self._budget: CpuBudget | None = None
        self._background_held = 0
        #: Background waiters per tenant, first in first out; the dict's order is the
        #: round-robin ring. At most ``background_max_queue`` each.
        self._background_queues: dict[str, deque[_Waiter]] = {}
        #: Each tenant's background waiters past ``background_max_queue``, in arrival order.
        self._background_deferred: dict[str, deque[_Waiter]] = {}
        self._background_queued = 0
        self._background_deferred_count = 0
        self._held: set[_Slot] = set()
        #: Interactive waiters per tenant, in the order they are served (``virtual_at``);
        #: the dict's order is the round-robin ring.
        self._queues: dict[str, list[_Waiter]] = {}
        #: Interactive waiters (background ones are in ``_background_queues``).
        self._queued = 0
        self._hold_seconds = 0.0
        self._rejected_total = 0
        self._cancelled_in_queue_total = 0
        self._shed_total = 0

    # -- counters ----------------------------------------------------------------

    def stats(self) -> LaneStats:
        held = list(self._held)
        return LaneStats(
            name=self.name,
            capacity=self.capacity,
            max_queue=self.max_queue,
            in_use=len(held),
            queued=self._queued,
            abandoned=sum(1 for s in held if s.token is not None and s.token.cancelled),
            rejected_total=self._rejected_total,
            cancelled_in_queue_total=self._cancelled_in_queue_total,
            shed_total=self._shed_total,
            hold_seconds=self._hold_seconds,
            background_in_use=self._background_held,
            background_queued=self._background_queued,
            background_deferred=self._background_deferred_count,
        )

    def expected_wait(self, dear: bool = False) -> float:
        """Seconds an interactive newcomer (dear work if *dear*) would wait now (0 when a
        slot is free). Background waiters do not count: interactive work goes first."""
        if len(self._held) < self.capacity and not self._queued:
            return 0.0
        slots = self.dear_capacity if dear else self.capacity
        return math.ceil((self._queued + 1) / slots) * self._hold_seconds

    # -- acquiring ---------------------------------------------------------------

    @asynccontextmanager
    async def slot(
        self,
        token: CancellationToken | None = None,
        *,
        cost: float = 1.0,
        dear: bool = False,
        background: bool = False,
    ) -> AsyncIterator[None]:
        """Hold a slot for the duration of the block.

        *token* defaults to the active request context's token; the waiter's tenant is
        the active context's; *cost* is how dear the work is relative to the usual (it
        orders waiters within a tenant), and *dear* work holds at most
        ``dear_capacity`` slots (see the module docstring). *background* work yields to
        interactive work, holds at most ``background_capacity`` slots and waits in its
        tenant's first-in first-out background queue (served round-robin over tenants),
        deferred past ``background_max_queue``, never shed or refused (*cost* does not
        apply to it; it cannot be *dear*: :class:`ValueError`). Raises :class:`LaneFull`
        when the lane sheds interactive work, and :class:`OperationCancelled` if the token
        is cancelled before a slot is granted (the work never starts). The slot is
        released when the block exits, whatever the reason.
        """
        if background and dear:
            raise ValueError("background work cannot be dear (it yields to all interactive work)")
        ctx = _current.get()
        if token is None and ctx is not None:
            token = ctx.token
        tenant = ctx.tenant if ctx is not None else ""
        if background:
            slot = await self._acquire_background(token, tenant)
        else:
            slot = await self._acquire(token, tenant, cost, dear)
        try:
            yield
        finally:
            self._release(slot)

    async def _acquire(
        self, token: CancellationToken | None, tenant: str, cost: float, dear: bool
    ) -> _Slot:
        if token is not None:
            token.raise_if_cancelled()
        # Waiters queue only while no slot they may take is free (see _release), so a free
        # slot with waiters means they are all dear work at its limit.
        if len(self._held) < self.capacity and (
            not dear or (not self._queued and self._dear_held < self.dear_capacity)
        ):
            return self._grant(token, dear, False)
        expected = self.expected_wait(dear)
        if self.max_wait is not None and expected > self.max_wait:
            self._shed_total += 1
            raise LaneFull(
                self.name,
                max(1, math.ceil(expected - self.max_wait)),
                f"would make this wait {expected:.1f} s (the limit is {self.max_wait:g} s)",
            )
        if self._queued >= self.max_queue and not self._displace_for(tenant):
            self._rejected_total += 1
            raise LaneFull(self.name, self._retry_after_hint())

        loop = asyncio.get_running_loop()
        waiter = _Waiter(loop.create_future(), token, tenant, dear)
        waiter.virtual_at = waiter.arrived_at + max(0.0, cost - 1.0) * self._hold_seconds
        bisect.insort(self._queues.setdefault(tenant, []), waiter, key=_virtual_at)
        self._queued += 1
        if self.max_wait is not None:
            waiter.timer = loop.call_later(self.max_wait, self._shed_late, waiter)
        return await self._wait(loop, waiter)

    async def _acquire_background(self, token: CancellationToken | None, tenant: str) -> _Slot:
        if token is not None:
            token.raise_if_cancelled()
        if (
            len(self._held) < self.capacity
            and self._background_held < self.background_capacity
            and not self._queued
            and not self._background_queued
            and not self._cpu_full()
        ):
            return self._grant(token, False, True)
        loop = asyncio.get_running_loop()
        waiter = _Waiter(loop.create_future(), token, tenant, background=True)
        queue = self._background_queues.get(tenant)
        if queue is not None and len(queue) >= self.background_max_queue:
            waiter.deferred = True  # behind its tenant's queue, not in anyone's way
            self._background_deferred.setdefault(tenant, deque()).append(waiter)
            self._background_deferred_count += 1
        else:
            self._queue_background(
                loop, waiter, self._background_queues.setdefault(tenant, deque())
            )
        return await self._wait(loop, waiter)

    def _queue_background(
        self, loop: asyncio.AbstractEventLoop, waiter: _Waiter, queue: deque[_Waiter]
    ) -> None:
        """Put *waiter* at the back of its tenant's background *queue*; its
        ``background_max_defer`` counts from now."""
        waiter.deferred = False
        waiter.arrived_at = time.monotonic()
        queue.append(waiter)
        self._background_queued += 1
        if self.background_max_defer is not None:
            waiter.timer = loop.call_later(self.background_max_defer, self._age, waiter)

    def _promote(self, tenant: str, queue: deque[_Waiter]) -> None:
        """Move *tenant*'s oldest deferred waiters into its *queue* while it has room."""
        deferred = self._background_deferred.get(tenant)
        if not deferred:
            return
        loop = asyncio.get_running_loop()
        while deferred and len(queue) < self.background_max_queue:
            self._background_deferred_count -= 1
            self._queue_background(loop, deferred.popleft(), queue)
        if not deferred:
            del self._background_deferred[tenant]

    async def _wait(self, loop: asyncio.AbstractEventLoop, waiter: _Waiter) -> _Slot:
        """Wait in the queue *waiter* was put in until it is granted a slot, refused or
        cancelled; it leaves the queue whatever happens."""
        token = waiter.token

        def abandon(reason: str) -> None:
            def fail() -> None:
                if not waiter.future.done():
                    waiter.future.set_exception(OperationCancelled(reason))

            loop.call_soon_threadsafe(fail)

        handle = token.on_cancel(abandon) if token is not None else None
        try:
            return await waiter.future
        except OperationCancelled:
            self._cancelled_in_queue_total += 1
            raise
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():
                # A slot was granted just as the awaiting task was cancelled: give it back.
                self._release(waiter.future.result())
            raise
        finally:
            if handle is not None:
                handle.remove()
            if waiter.timer is not None:
                waiter.timer.cancel()
            self._remove(waiter)

    def _displace_for(self, tenant: str) -> bool:
        """Make room for *tenant* in a full queue by refusing the newest waiter of the tenant
        with the most waiters, if that tenant has more than *tenant* would. Fairness, not
        arrival order, decides who is refused."""
        mine = len(self._queues.get(tenant, ()))
        busiest = max(self._queues, key=lambda t: len(self._queues[t]), default=None)
        if busiest is None or busiest == tenant or len(self._queues[busiest]) <= mine + 1:
            return False
        victim = self._queues[busiest][-1]
        self._remove(victim)
        self._shed_total += 1
        if not victim.future.done():
            victim.future.set_exception(
                LaneFull(
                    self.name,
                    self._retry_after_hint(),
                    "is full and this tenant holds most of its queue",
                )
            )
        return True

    def _shed_late(self, waiter: _Waiter) -> None:
        if waiter.future.done():
            return
        self._remove(waiter)
        self._shed_total += 1
        waiter.future.set_exception(
            LaneFull(
                self.name, self._retry_after_hint(), f"kept this waiting over {self.max_wait:g} s"
            )
        )

    def _age(self, waiter: _Waiter) -> None:
        """A background waiter has waited ``background_max_defer`` in its tenant's queue:
        from now on it competes with interactive waiters in arrival order."""
        if waiter.future.done():
            return
        waiter.aged = True
        self._dispatch()

    def _cpu_full(self) -> bool:
        return self._budget is not None and self._budget.full()

    def _grant(
        self, token: CancellationToken | None, dear: bool, background: bool, lent: bool = False
    ) -> _Slot:
        slot = _Slot(token, dear, background, lent)
        self._held.add(slot)
        self._dear_held += dear
        self._background_held += background and not lent
        if self._counts(slot) and self._budget is not None:
            self._budget.held += 1
        return slot

    def users_waiting(self) -> bool:
        """Whether users' work waits for a slot in this lane, or, when it shares a CPU budget,
        users' CPU work wants more cores than it has (:meth:`CpuBudget.wanted`)."""
        return self._budget.wanted() if self._budget is not None else bool(self._queued)

    @contextmanager
    def lent_slot(self, quiet: float) -> Iterator[bool]:
        """Hold, for the block, the slot kept for interactive work while nobody uses it: when
        a slot is free, nothing waits in this lane (background work included: a lent slot
        never jumps its queue) and the CPU budget has been quiet for *quiet* seconds
        (:meth:`CpuBudget.quiet`), background work may take it beyond
        ``background_capacity`` (yields ``True``); otherwise it holds nothing (yields
        ``False``). Never waits. A user's request arriving meanwhile waits for this slot or
        another at most as long as the block runs, so the block must be short (a piece of
        work of a few tenths of a second). The slot is released when the block exits."""
        lendable = (
            self._budget is not None
            and len(self._held) < self.capacity
            and not self._queued
            and not self._background_queued
            and self._budget.quiet(quiet)
        )
        slot = self._grant(None, False, True, lent=True) if lendable else None
        try:
            yield slot is not None
        finally:
            if slot is not None:
                self._release(slot)

    def _counts(self, slot: _Slot) -> bool:
        """Whether *slot* counts in the CPU budget (interactive work of a CPU-bound lane)."""
        return self.cpu_bound and not slot.background

    def _release(self, slot: _Slot) -> None:
        if slot not in self._held:
            return
        self._held.discard(slot)
        self._dear_held -= slot.dear
        self._background_held -= slot.background and not slot.lent
        budget = self._budget if self._counts(slot) else None
        if budget is not None:
            budget.held -= 1
            budget.busy_at = time.monotonic()
        held = time.monotonic() - slot.granted_at
        self._hold_seconds = (
            held
            if self._hold_seconds == 0.0
            else (1 - _EWMA_WEIGHT) * self._hold_seconds + _EWMA_WEIGHT * held
        )
        self._dispatch()  # this lane's interactive waiters first
        if budget is not None and not budget.full():
            budget._dispatch()

    def _dispatch(self) -> None:
        """Hand free slots to waiters: interactive ones one tenant at a time in turn, then
        background ones one tenant at a time in turn (an aged one in arrival order with the
        interactive ones). The slot is counted as held from this moment, not from when the
        waiter resumes."""
        while len(self._held) < self.capacity:
            waiter = self._next_any()
            if waiter is None:
                return
            if not waiter.future.done():
                waiter.future.set_result(self._grant(waiter.token, waiter.dear, waiter.background))

    def _next_any(self) -> _Waiter | None:
        """The waiter a free slot goes to, taken out of its queue, or ``None``."""
        background = (
            self._background_queued > 0 and self._background_held < self.background_capacity
        )
        if not background:
            return self._next_waiter() if self._queued else None
        if not self._queued and not self._cpu_full():
            # Nothing interactive wants it: the next tenant in the ring, aged or not (aging
            # is about interactive work, not an order between tenants).
            return self._next_background(next(iter(self._background_queues)))
        # The first tenant in the ring whose head has aged (its oldest waiter: first in,
        # first out within a tenant) competes with interactive waiters by arrival.
        aged = next((t for t, q in self._background_queues.items() if q[0].aged), None)
        if aged is not None:
            first = self._first_interactive_arrival()
            if first is None or self._background_queues[aged][0].arrived_at <= first:
                return self._next_background(aged)
        waiter = self._next_waiter() if self._queued else None
        if waiter is not None:
            return waiter
        return self._next_background(aged) if aged is not None else None

    def _next_background(self, tenant: str) -> _Waiter:
        """*tenant*'s oldest background waiter, taken out of its queue; the tenant goes to
        the back of the ring and its oldest deferred waiter, if any, joins its queue."""
        queue = self._background_queues.pop(tenant)
        waiter = queue.popleft()
        self._background_queued -= 1
        self._promote(tenant, queue)
        if queue:
            self._background_queues[tenant] = queue  # re-inserted: now last in the ring
        return waiter

    def _first_interactive_arrival(self) -> float | None:
        """When the longest-waiting interactive waiter that may take a slot now arrived."""
        dear_ok = self._dear_held < self.dear_capacity
        return min(
            (
                w.arrived_at
                for queue in self._queues.values()
                for w in queue
                if (dear_ok or not w.dear) and not w.future.done()
            ),
            default=None,
        )

    def _next_waiter(self) -> _Waiter | None:
        """The first waiter that may take a slot now, in the next tenant's queue in the ring
        (its head, or its first cheap waiter while dear work is at its limit); that tenant
        goes to the back. ``None`` when every waiter is dear work at its limit."""
        dear_ok = self._dear_held < self.dear_capacity
        for tenant, queue in self._queues.items():
            index = next((i for i, w in enumerate(queue) if dear_ok or not w.dear), None)
            if index is None:
                continue
            waiter = queue.pop(index)
            self._queued -= 1
            del self._queues[tenant]
            if queue:
                self._queues[tenant] = queue  # re-inserted: now last in the ring
            return waiter
        return None

    @staticmethod
    def _unqueue(queues: dict[str, Q], waiter: _Waiter, *, drop_empty: bool = True) -> Q | None:
        """*waiter* taken out of its tenant's queue in *queues*: that queue, or ``None`` when
        it was in none. A queue left empty is dropped from *queues* (``drop_empty=False``:
        left there, the caller drops it)."""
        queue = queues.get(waiter.tenant)
        if queue is None:
            return None
        try:
            queue.remove(waiter)
        except ValueError:
            return None
        if drop_empty and not queue:
            del queues[waiter.tenant]
        return queue

    def _remove(self, waiter: _Waiter) -> None:
        if waiter.background and waiter.deferred:
            if self._unqueue(self._background_deferred, waiter) is not None:
                self._background_deferred_count -= 1
            return
        if waiter.background:
            ring = self._unqueue(self._background_queues, waiter, drop_empty=False)
            if ring is None:
                return
            self._background_queued -= 1
            self._promote(waiter.tenant, ring)
            if not ring:
                del self._background_queues[waiter.tenant]
        else:
            if self._unqueue(self._queues, waiter) is None:
                return
            self._queued -= 1
        if self._background_queued:
            # The last interactive waiter leaving may let background work take a free slot.
            self._dispatch()

    def _retry_after_hint(self) -> int:
        return max(1, math.ceil(self.retry_after))


class Lanes:
    """The lanes of one server, by name; its ``cpu_bound`` lanes share one
    :class:`CpuBudget` of *cores* (default: the machine's)."""

    def __init__(self, lanes: Iterable[Lane], cores: int | None = None) -> None:
        self._lanes = {lane.name: lane for lane in lanes}
        self.cpu_budget = CpuBudget(cores or os.cpu_count() or 1)
        for lane in self._lanes.values():
            lane._budget = self.cpu_budget
            self.cpu_budget._attach(lane)

    def __getitem__(self, name: str) -> Lane:
        return self._lanes[name]

    def __contains__(self, name: object) -> bool:
        return name in self._lanes

    def all(self) -> list[Lane]:
        return list(self._lanes.values())
