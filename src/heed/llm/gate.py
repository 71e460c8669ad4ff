"""A remote provider's concurrency: how many of its calls are in flight, users' first.

A remote model's call is a wait on the network, not CPU work. Bounding it by the CPU lanes,
as the embedded model's calls are, leaves a provider that serves many calls at once doing
one at a time. So every remote provider (``openai``) is wrapped, when it is built
(:func:`heed.llm.factory.build_provider`), in a :class:`GatedProvider` over the
:class:`ProviderGate` of its upstream: one gate per base URL, shared by every operation
(reflect, turns, retain) that calls it. The gate promises:

- **A bound that follows the provider.** At most ``HEED_LLM_CONCURRENCY`` calls (default 8)
  are in flight to the upstream at once; the rest wait in the gate's
  :class:`~heed.runtime.Lane` (tenant-fair; at most ``HEED_LLM_QUEUE`` users' calls queued,
  beyond that :class:`~heed.runtime.LaneFull`, a 503).
- **Users first.** A call made inside background work (``llm_work(..., background=True)``:
  a consolidation, a mental-model refresh, an asynchronous retain's extraction) is a
  background waiter of that lane: it takes a free slot at once when there is one, holds at
  most all but one of the slots, and a freed slot goes to a waiting user's call first
  (:mod:`heed.runtime.slots`). The lane is not CPU-bound: a background call does not wait
  for users' recalls to leave the cores, but that work's embedding and recalls still do.
- **429 honoured.** A call that ends in :class:`~heed.llm.base.UpstreamRateLimited` (the
  provider's own retries spent, or a ``Retry-After`` longer than it waits) pauses the gate:
  no call starts before the ``Retry-After`` has passed. A background call then waits and
  tries again (at most :data:`RATE_LIMIT_ATTEMPTS` times, the wait doubling while the
  upstream keeps refusing, at most :data:`MAX_PAUSE` seconds), so a rate-limited
  consolidation slows down instead of failing; a user's call arriving while the gate is
  paused for longer than :data:`USER_PAUSE_WAIT` seconds gets the 503 with the remaining
  ``Retry-After`` at once, without a call the upstream would refuse.
- **Cancellation.** A call waiting for a slot or for a pause to end leaves at once when its
  token is cancelled; a slot is held until the provider's stream is closed.

The embedded model (``local``) is CPU work: it is not gated here, and the code that calls it
holds a CPU lane's slot instead (:func:`model_slot`). So is the ``scripted`` provider, which
stands in for a model in tests: its calls keep the CPU lanes' bounds, as before.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final

from heed.llm.base import (
    ChatMessage,
    ChatProvider,
    ProviderBase,
    StreamEvent,
    StreamOptions,
    UpstreamRateLimited,
)
from heed.llm.usage import current_work
from heed.runtime import Lane, LaneStats, sleep_unless_cancelled

__all__ = [
    "MAX_PAUSE",
    "RATE_LIMIT_ATTEMPTS",
    "USER_PAUSE_WAIT",
    "GatedProvider",
    "ProviderGate",
    "ProviderGates",
    "call_concurrency",
    "model_slot",
]

#: How many times a background call is tried while the upstream answers 429.
RATE_LIMIT_ATTEMPTS: Final = 8
#: The longest pause one 429 causes (seconds), whatever its ``Retry-After``.
MAX_PAUSE: Final = 300.0
#: A user's call waits for a pause this short (seconds); a longer one is answered 503.
USER_PAUSE_WAIT: Final = 5.0


class ProviderGate:
    """The calls in flight to one upstream (see the module docstring)."""

    def __init__(
        self,
        name: str,
        concurrency: int,
        max_queue: int,
        *,
        background_max_defer: float | None = 10.0,
        background_max_queue: int = 64,
    ) -> None:
        self.name = name
        self.provider = name.split("#")[0]
        self.lane = Lane(
            f"llm:{name}",
            concurrency,
            max_queue,
            background_max_defer=background_max_defer,
            background_max_queue=background_max_queue,
        )
        self._resume_at = 0.0
        #: How many times a 429 paused the gate (a figure for tests and metrics).
        self.pauses = 0

    @property
    def concurrency(self) -> int:
        return self.lane.capacity

    @property
    def background_concurrency(self) -> int:
        """How many background calls may be in flight at once."""
        return self.lane.background_capacity

    def stats(self) -> LaneStats:
        return self.lane.stats()

    def paused_for(self) -> float:
        """Seconds until calls may start again (0 when the gate is not paused)."""
        return max(0.0, self._resume_at - time.monotonic())

    def pause(self, seconds: float) -> None:
        """Start no call for *seconds* (a longer pause already set is kept)."""
        self.pauses += 1
        self._resume_at = max(self._resume_at, time.monotonic() + min(MAX_PAUSE, seconds))

    async def wait_unpaused(self, *, background: bool) -> None:
        """Return once the gate is not paused; wakes and raises when the token is cancelled.

        A user's call (not *background*) facing a pause longer than :data:`USER_PAUSE_WAIT`
        raises :class:`UpstreamRateLimited` with the remaining time instead of waiting."""
        while (remaining := self.paused_for()) > 0:
            if not background and remaining > USER_PAUSE_WAIT:
                raise UpstreamRateLimited(
                    f"{self.name}: upstream is rate limiting; calls resume in {remaining:.0f} s",
                    provider=self.name,
                    retry_after=int(remaining + 0.999),
                )
            await sleep_unless_cancelled(remaining)


class ProviderGates:
    """One :class:`ProviderGate` per upstream, built on first use, for one server."""

    def __init__(
        self,
        concurrency: int,
        max_queue: int,
        *,
        background_max_defer: float | None = 10.0,
        background_max_queue: int = 64,
    ) -> None:
        self.concurrency = concurrency
        self.max_queue = max_queue
        self.background_max_defer = background_max_defer
        self.background_max_queue = background_max_queue
        self._gates: dict[str, ProviderGate] = {}

    def for_upstream(self, upstream: str, provider: str = "openai") -> ProviderGate:
        """The gate of *upstream* (its base URL), built on first use and named after its
        *provider* (``openai``; ``openai#2`` for a second upstream, and so on): the name
        shows in ``/metrics`` and in a 503's message, the URL never does."""
        gate = self._gates.get(upstream)
        if gate is None:
            same = sum(1 for g in self._gates.values() if g.provider == provider)
            name = provider if not same else f"{provider}#{same + 1}"
            gate = self._gates[upstream] = ProviderGate(
                name,
                self.concurrency,
                self.max_queue,
                background_max_defer=self.background_max_defer,
                background_max_queue=self.background_max_queue,
            )
        return gate

    def all(self) -> list[ProviderGate]:
        return list(self._gates.values())


class GatedProvider(ProviderBase):
    """*inner*, with every call passing *gate* (see the module docstring)."""

    def __init__(self, inner: ChatProvider, gate: ProviderGate) -> None:
        self.inner = inner
        self.gate = gate

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def model(self) -> str:
        return self.inner.model

    @property
    def follows_tools(self) -> bool:
        return self.inner.follows_tools

    async def load(self) -> None:
        await self.inner.load()

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def _stream(
        self, messages: Sequence[ChatMessage], options: StreamOptions
    ) -> AsyncGenerator[StreamEvent, None]:
        """The inner provider's stream, once the gate lets the call start; a background
        call refused with a 429 before its first event is tried again after the pause."""
        work = current_work()
        background = work is not None and work.background
        schema = options.json_schema
        extra: dict[str, Any] = {} if schema is None else {"json_schema": schema}
        for attempt in range(1, RATE_LIMIT_ATTEMPTS + 1):
            await self.gate.wait_unpaused(background=background)
            started = False
            async with self.gate.lane.slot(background=background):
                try:
                    events = self.inner.stream(
                        messages,
                        tools=options.tools,
                        max_tokens=options.max_tokens,
                        temperature=options.temperature,
                        **extra,
                    )
                    async with contextlib.aclosing(events) as stream:
                        async for event in stream:
                            started = True
                            yield event
                    return
                except UpstreamRateLimited as exc:
                    # Doubling while the upstream keeps refusing: its Retry-After is a floor.
                    self.gate.pause(max(float(exc.retry_after), 2.0 ** (attempt - 1)))
                    if started or not background or attempt == RATE_LIMIT_ATTEMPTS:
                        raise


def call_concurrency(provider: ChatProvider, *, background: bool) -> int:
    """How many calls to *provider* one piece of work should have in flight at once: what
    its gate lets through for such work, or 1 for a provider that is not gated (the
    embedded model is CPU work)."""
    if isinstance(provider, GatedProvider):
        gate = provider.gate
        return gate.background_concurrency if background else gate.concurrency
    return 1


@asynccontextmanager
async def model_slot(
    provider: ChatProvider, cpu_lane: Lane, *, background: bool
) -> AsyncIterator[None]:
    """Where a model call waits its turn: nowhere here for a gated (remote) provider, whose
    gate bounds it; else a slot of *cpu_lane* (the embedded model's calls are CPU work)."""
    if isinstance(provider, GatedProvider):
        yield
        return
    async with cpu_lane.slot(background=background):
        yield
