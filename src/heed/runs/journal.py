"""The run journal: durable append, then fan-out; and gap-free replay-then-tail reads.

Writers call :meth:`Journal.append` (or publish events a store transition
returned with :meth:`Journal.publish`). An event is committed to the store
*before* it is published to the :class:`~heed.runs.broker.Broker`, so anything a
subscriber hears about can also be read back.

Readers call :meth:`Journal.follow`, which yields what a resumable stream needs:

1. it subscribes to the run's topic first (so nothing published during the
   replay is missed),
2. replays retained events with ``seq > after`` from the store (a cursor older
   than the retained range yields a :class:`Gap` first -- never a silent clamp),
3. then tails: a broker message with ``seq == cursor + 1`` is yielded, one at or
   below the cursor is dropped (it was already replayed: no duplicate at the
   seam), one beyond ``cursor + 1`` or a lag signal triggers a re-read from the
   store (no gap). An idle reader waits on the broker alone: only every
   ``poll_interval`` without news (a fallback, 20 s by default) does it check the
   store itself, which covers a lost hint. Heartbeats read nothing.
4. It stops after yielding a terminal event, and at once when the journal is
   closed and the cursor is already at (or past) its end: nothing can follow.
   Otherwise it yields :data:`HEARTBEAT` every ``heartbeat`` seconds of silence
   and never ends on its own (``after`` beyond the end of a live run's journal
   waits for new events).

Events are yielded in batches (lists) so a replay of a long run can be written
to a socket in few sends.

**The watch** (``watch_interval`` > 0; for a broker that carries no hints between
processes, the in-process one): writers in other processes sharing the database publish
nothing this process hears. So while anyone here follows a run, one task reads the
``last_seq`` of every followed run in one query every ``watch_interval`` seconds and, for
each run whose journal grew by events this process did not publish, publishes
:data:`~heed.runs.broker.LAGGED` on its topic: its readers re-read the store. That costs
one query per interval for the whole process, however many streams are open, and
nothing at all once nobody follows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from heed.runs.broker import LAGGED, STOPPED, Broker
from heed.runs.io import BlockingIO
from heed.runs.model import RunEvent
from heed.runs.store import RunStore
from heed.runtime import CancellationToken, settle

__all__ = ["HEARTBEAT", "Gap", "Heartbeat", "Journal", "run_topic"]

_BATCH: Final = 1000

log = logging.getLogger("heed.runs.journal")


def run_topic(run_id: str) -> str:
    """The broker topic of a run's journal."""
    return f"run:{run_id}"


@dataclass(frozen=True, slots=True)
class Gap:
    """Events ``after+1 .. first_retained-1`` are no longer retained; reload durable state."""

    after: int
    first_retained: int


class Heartbeat:
    """Nothing happened for a while (the HTTP layer sends an SSE comment)."""


HEARTBEAT: Final = Heartbeat()

FollowItem = list[RunEvent] | Gap | Heartbeat


@dataclass(slots=True)
class _Position:
    """A reader's place in one journal: the last seq it has, and whether it has ended."""

    cursor: int
    ended: bool = False


class Journal:
    """Durable per-run event log with live fan-out (see the module docstring)."""

    def __init__(
        self,
        store: RunStore,
        broker: Broker,
        io: BlockingIO,
        *,
        poll_interval: float = 20.0,
        watch_interval: float = 0.0,
        read_io: BlockingIO | None = None,
    ) -> None:
        self.store = store
        self.broker = broker
        self.io = io
        #: Readers use their own threads, so a storm of replays never delays appends.
        self.read_io = read_io or io
        self.poll_interval = poll_interval
        #: Seconds between the watch's reads (0: no watch); see the module docstring.
        self.watch_interval = watch_interval
        self._followers: dict[str, int] = {}  # run id -> readers in this process
        self._published: dict[str, int] = {}  # followed run id -> highest seq published here
        self._seen: dict[str, int] = {}  # followed run id -> last_seq the watch last read
        self._watch: asyncio.Task[None] | None = None
        self._closed = False

    async def append(self, run_id: str, type_: str, data: Mapping[str, Any]) -> RunEvent | None:
        """Append one event durably, then publish it; ``None`` if the journal is closed."""
        events = await self.append_many(run_id, [(type_, data)])
        return events[0] if events else None

    async def append_many(
        self, run_id: str, events: Sequence[tuple[str, Mapping[str, Any]]]
    ) -> list[RunEvent]:
        """Append events durably in one transaction, then publish them."""
        written = await self.io.call(self.store.append_events, run_id, events)
        self.publish(written)
        return written

    def publish(self, events: Sequence[RunEvent | None]) -> None:
        """Fan out already-committed events to live subscribers."""
        for event in events:
            if event is not None:
                if event.run_id in self._followers:
                    known = self._published.get(event.run_id, 0)
                    self._published[event.run_id] = max(known, event.seq)
                self.broker.publish(run_topic(event.run_id), event)

    # -- the watch (see the module docstring) ----------------------------------------

    def _follow_started(self, run_id: str) -> None:
        self._followers[run_id] = self._followers.get(run_id, 0) + 1
        if self.watch_interval > 0 and not self._closed and self._watch is None:
            self._watch = asyncio.create_task(self._watch_loop(), name="heed-journal-watch")

    def _follow_ended(self, run_id: str) -> None:
        left = self._followers.get(run_id, 0) - 1
        if left > 0:
            self._followers[run_id] = left
            return
        self._followers.pop(run_id, None)
        self._published.pop(run_id, None)
        self._seen.pop(run_id, None)

    async def _watch_loop(self) -> None:
        """Every ``watch_interval``: wake the readers of runs that other processes wrote to.
        Ends once nobody follows a run (the next reader starts it again)."""
        try:
            while self._followers and not self._closed:
                last_seqs = await self.read_io.watch_round(
                    self.watch_interval,
                    lambda: list(self._followers),
                    self.store.last_seqs,
                    log,
                    "the journal watch",
                )
                for run_id, last_seq in last_seqs.items():
                    if run_id not in self._followers:
                        continue
                    seen = self._seen.get(run_id, -1)
                    self._seen[run_id] = last_seq
                    if last_seq > seen and last_seq > self._published.get(run_id, 0):
                        self.broker.publish(run_topic(run_id), LAGGED)
        finally:
            self._watch = None

    async def aclose(self) -> None:
        """Stop the watch (readers still open end with their requests). Idempotent."""
        self._closed = True
        task = self._watch
        if task is not None:
            await settle(task)

    async def _read(
        self, run_id: str, cursor: int
    ) -> tuple[Gap | None, list[RunEvent], bool, bool]:
        """(gap before the retained range, events after cursor, more may follow,
        nothing can ever follow: the journal is closed and the cursor is at its end)."""
        run = await self.read_io.call(self.store.get, run_id)
        gap = None
        if run is not None and cursor < run.first_seq - 1:
            gap = Gap(cursor, run.first_seq)
            cursor = run.first_seq - 1
        events = await self.read_io.call(self.store.events_after, run_id, cursor, _BATCH)
        last = events[-1].seq if events else cursor
        finished = run is None or (run.journal_closed and last >= run.last_seq)
        return gap, events, len(events) == _BATCH, finished

    async def _from_store(
        self, run_id: str, position: _Position
    ) -> AsyncGenerator[list[RunEvent] | Gap, None]:
        """What the store retains after ``position.cursor``, batch by batch.

        Advances the cursor past everything it yields, and sets ``position.ended``
        when nothing can follow: the terminal event was yielded, or the journal is
        closed and the cursor is at (or past) its end.
        """
        more = True
        while more:
            gap, events, more, finished = await self._read(run_id, position.cursor)
            if gap is not None:
                yield gap
                position.cursor = gap.first_retained - 1
            if events:
                events, done = _until_terminal(events)
                position.cursor = events[-1].seq
                yield events
                if done:
                    position.ended = True
                    return
            if finished:
                position.ended = True
                return

    async def follow(
        self,
        run_id: str,
        after: int = 0,
        *,
        heartbeat: float = 10.0,
        token: CancellationToken | None = None,
    ) -> AsyncIterator[FollowItem]:
        """Replay after *after*, then tail live; see the module docstring.

        Ends (without raising) as soon as *token* is cancelled: a stream whose
        client left stops at once, even while idle.
        """
        sub = self.broker.subscribe(run_topic(run_id))
        handle = token.on_cancel(lambda _reason: sub.stop()) if token is not None else None
        position = _Position(cursor=max(0, after))
        self._follow_started(run_id)
        try:
            await sub.ready()  # other processes' events reach us before we replay
            async with contextlib.aclosing(self._from_store(run_id, position)) as stored:
                async for item in stored:
                    yield item
            if position.ended:
                return
            last_output = last_read = time.monotonic()
            while True:
                due = min(last_read + self.poll_interval, last_output + heartbeat)
                message = await sub.get(max(0.0, due - time.monotonic()))
                if message is STOPPED:
                    return
                if message is None and time.monotonic() < last_read + self.poll_interval:
                    last_output = time.monotonic()  # only the heartbeat is due: no store read
                    yield HEARTBEAT
                    continue
                if isinstance(message, RunEvent):
                    if message.seq <= position.cursor:
                        continue
                    if message.seq == position.cursor + 1:
                        more_message: object | None = None
                        # Take whatever else is already queued and in order: one write.
                        batch = [message]
                        while not batch[-1].is_terminal:
                            more_message = sub.get_nowait()
                            if not (
                                isinstance(more_message, RunEvent)
                                and more_message.seq == batch[-1].seq + 1
                            ):
                                break
                            batch.append(more_message)
                        position.cursor = batch[-1].seq
                        last_output = time.monotonic()
                        yield batch
                        if batch[-1].is_terminal:
                            return
                        if more_message is None:
                            continue
                        if more_message is STOPPED:
                            return
                        # out of order or lagged: fall through to re-read the store
                # A hole, a lag, or the fallback poll: the store is the truth.
                last_read = time.monotonic()
                caught_up = False
                async with contextlib.aclosing(self._from_store(run_id, position)) as stored:
                    async for item in stored:
                        caught_up = caught_up or isinstance(item, list)
                        yield item
                if position.ended:
                    return
                if caught_up:
                    last_output = time.monotonic()
                elif time.monotonic() - last_output >= heartbeat:
                    last_output = time.monotonic()
                    yield HEARTBEAT
        finally:
            self._follow_ended(run_id)
            if handle is not None:
                handle.remove()
            sub.close()


def _until_terminal(events: list[RunEvent]) -> tuple[list[RunEvent], bool]:
    for i, event in enumerate(events):
        if event.is_terminal:
            return events[: i + 1], True
    return events, False
