"""Loading the LLM providers' models at start-up, in the background, with a status.

The embedded model takes a while to load; the first reflect or chat turn should not pay
for it, and an operator should see whether it loaded. :class:`ModelWarmup` builds each
provider and calls its :meth:`~heed.llm.base.ChatProvider.load` in a background task when
the server starts (a no-op for a remote API). Requests do not wait for it: a request that
arrives first loads the same process-wide model, under the same lock, and whichever comes
first does the work once. A provider that cannot be built or loaded is reported as
``failed`` with its message; each request then answers with the provider's error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

from heed.llm.base import ChatProvider
from heed.runtime import reraise_cancellation, settle

__all__ = ["ModelWarmup"]

log = logging.getLogger("heed.llm")

State = Literal["idle", "loading", "ready", "failed"]


class ModelWarmup:
    """Loads the models of *providers* (``(operation, get_provider)`` pairs) on :meth:`start`."""

    def __init__(self, providers: Sequence[tuple[str, Callable[[], ChatProvider]]]) -> None:
        self._providers = providers
        self.state: State = "idle"
        self.detail: str | None = None
        self.seconds: float | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Begin loading in a background task (call once, from the event loop)."""
        self.state = "loading"
        self._task = asyncio.create_task(self._load_all(), name="heed-model-warmup")

    async def _load_all(self) -> None:
        started = time.perf_counter()
        try:
            for operation, get_provider in self._providers:
                provider = get_provider()
                await provider.load()
                log.info("%s model ready: %s/%s", operation, provider.name, provider.model)
        except Exception as exc:
            reraise_cancellation(exc)
            self.state, self.detail = "failed", str(exc)
            log.warning("could not load the LLM at start-up: %s", exc, exc_info=True)
            return
        finally:
            self.seconds = round(time.perf_counter() - started, 2)
        self.state = "ready"

    def status(self) -> dict[str, Any]:
        """``{"state": idle | loading | ready | failed, "seconds": ..., "detail": ...}``."""
        return {"state": self.state, "seconds": self.seconds, "detail": self.detail}

    async def aclose(self) -> None:
        """Stop a load still running and wait until it stopped."""
        if self._task is not None:
            await settle(self._task)
