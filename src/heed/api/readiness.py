"""Readiness (``GET /health/ready``): can this process serve traffic now?

Each check answers within ``HEED_READY_TIMEOUT_SECONDS`` or counts as not ready:

- ``database``: a ``SELECT 1`` on a connection of the pool (SQLite's file, or PostgreSQL);
- ``broker``: Redis answers a ``PING`` when ``HEED_REDIS_URL`` is set (the in-process
  broker is always reachable);
- ``embeddings``: the embedding model embeds a word (once: a loaded model stays loaded);
  a remote embeddings API has nothing to load and is not called;
- ``llm``: when the embedded ``local`` model serves reflect or chat turns, it has loaded
  (``loading`` and ``failed`` are not ready); a remote or scripted provider has nothing
  to load.

A probe runs once at a time however many requests ask (they share it), in a context of
its own: a prober that leaves does not cancel it, and a probe stuck on an unreachable
database holds one worker thread, not one per request. Answers name the components and a
short reason; the full error goes to the log when a component stops being ready.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from heed.llm.factory import Operation, providers_of
from heed.llm.warmup import ModelWarmup
from heed.memory.embeddings import Embedder, OnnxMiniLM
from heed.runs.broker import Broker
from heed.runtime import reraise_cancellation, run_in_thread, settle
from heed.runtime.context import detached, use_context
from heed.settings import Settings

__all__ = ["Check", "Database", "Readiness"]

log = logging.getLogger("heed.health")

#: The operations whose provider the start-up warmup loads (heed.llm.warmup).
_WARMED: Final[tuple[Operation, ...]] = ("reflect", "turn")


class Database(Protocol):
    """What the database check needs of :class:`heed.storage.SqlDatabase`."""

    dialect: str

    def read(self) -> AbstractContextManager[Any]: ...


@dataclass(frozen=True, slots=True)
class Check:
    """One component's readiness: ``detail`` says what was found (or why not ready)."""

    name: str
    ready: bool
    detail: str


def _reason(exc: BaseException) -> str:
    """A short reason fit for an unauthenticated answer: the error's kind, not its text
    (which may name hosts or paths)."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    return f"unreachable ({type(cause).__name__})"


@dataclass(eq=False)
class Readiness:
    """The readiness checks of one server's parts (see the module docstring); each check
    may take *settings*' ``ready_timeout_seconds``."""

    settings: Settings
    database: Database
    broker: Broker
    embedder: Embedder
    warmup: ModelWarmup
    #: ``time.monotonic()`` when the app was built (liveness reports the uptime).
    started: float = field(init=False, default_factory=time.monotonic)
    _probes: dict[str, asyncio.Future[str]] = field(init=False, default_factory=dict)
    _was_ready: dict[str, bool] = field(init=False, default_factory=dict)
    _embedded: bool = field(init=False, default=False)

    @property
    def timeout(self) -> float:
        """Seconds one check may take (the settings' ``ready_timeout_seconds``)."""
        return self.settings.ready_timeout_seconds

    def uptime(self) -> float:
        """Seconds since the app was built."""
        return time.monotonic() - self.started

    async def checks(self) -> list[Check]:
        """Every component's readiness, probed concurrently."""
        probed = await asyncio.gather(
            self._probe("database", self._database),
            self._probe("broker", self._broker),
            self._probe("embeddings", self._embeddings),
        )
        return [*probed, self._llm()]

    async def _probe(self, name: str, probe: Callable[[], Awaitable[str]]) -> Check:
        task = self._probes.get(name)
        if task is None or task.done():
            with use_context(detached()):  # the probe is no request's: nobody cancels it
                task = asyncio.ensure_future(probe())
            task.add_done_callback(_retrieve)
            self._probes[name] = task
        try:
            async with asyncio.timeout(self.timeout):
                detail = await asyncio.shield(task)
        except TimeoutError:
            return self._seen(Check(name, False, f"no answer within {self.timeout:g}s"), None)
        except Exception as exc:  # noqa: BLE001 - any failure is "not ready", and logged
            reraise_cancellation(exc)
            return self._seen(Check(name, False, _reason(exc)), exc)
        return self._seen(Check(name, True, detail), None)

    def _seen(self, check: Check, error: BaseException | None) -> Check:
        """Log a component that stops being ready (with its error) or comes back."""
        before = self._was_ready.get(check.name, True)
        self._was_ready[check.name] = check.ready
        if before and not check.ready:
            log.warning("not ready: %s: %s", check.name, error or check.detail, exc_info=error)
        elif check.ready and not before:
            log.info("ready again: %s", check.name)
        return check

    async def _database(self) -> str:
        database = self.database

        def select_one() -> Any:
            with database.read() as conn:
                return conn.execute("SELECT 1").fetchone()

        row = await run_in_thread(select_one)
        if row is None or row[0] != 1:
            raise RuntimeError("SELECT 1 gave no 1")
        return f"{database.dialect} answers"

    async def _broker(self) -> str:
        await self.broker.ping()
        return "in-process" if self.settings.redis_url is None else "redis answers"

    async def _embeddings(self) -> str:
        embedder = self.embedder
        if not isinstance(embedder, OnnxMiniLM):
            return f"{type(embedder).__name__}: a remote API, nothing to load"
        if not self._embedded:
            vectors = await run_in_thread(embedder.embed, ["ready"])
            if vectors.shape != (1, embedder.dim):
                raise RuntimeError(f"the embedding model answered a {vectors.shape} array")
            self._embedded = True
        return "onnx model loaded"

    def _llm(self) -> Check:
        served_by = providers_of(self.settings, _WARMED)
        if "local" not in served_by:
            kinds = ", ".join(sorted(served_by))
            return Check("llm", True, f"{kinds}: no model to load here")
        warmup = self.warmup
        if warmup.state == "ready":
            return self._seen(Check("llm", True, "local model loaded"), None)
        if warmup.state == "failed":
            return self._seen(Check("llm", False, "the local model failed to load"), None)
        return self._seen(Check("llm", False, "the local model is loading"), None)

    async def aclose(self) -> None:
        """Wait for probes still running (a database that does not answer) to stop."""
        for task in list(self._probes.values()):
            await settle(task)


def _retrieve(task: asyncio.Future[str]) -> None:
    """Retrieve a probe's outcome, so one nobody awaited any more is not logged as lost."""
    if not task.cancelled():
        task.exception()
