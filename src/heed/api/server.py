"""Serving the app with uvicorn, and draining it on SIGTERM.

uvicorn's own shutdown stops listening, then waits up to ``timeout_graceful_shutdown`` for
connections to close, then cancels what is left and only then runs the app's lifespan
shutdown. heed's streams never close on their own, so on that path every client would see its
stream cut without a last event, and runs would be marked ``interrupted`` only after nobody
could hear it. :class:`HeedServer` runs :func:`drain_app` first:

1. the :class:`~heed.api.drain.Drain` begins: new requests answer 503 with ``Retry-After``,
   and session channels send a last ``shutdown`` event and end;
2. the run manager stops its runs: each running run becomes ``interrupted`` with a terminal
   event, which its open streams deliver before they end; workers get up to the grace period
   to unwind;
3. whatever request is still in flight is cancelled with reason ``shutdown``.

Then uvicorn's shutdown proceeds, and finds the connections already closing.
"""

from __future__ import annotations

import logging
import socket

import uvicorn
from fastapi import FastAPI

from heed.api.drain import Drain
from heed.runtime.heap import freeze_long_lived_objects, limit_malloc_arenas
from heed.services import Services

__all__ = ["HeedServer", "drain_app"]

log = logging.getLogger(__name__)


async def drain_app(app: FastAPI, grace: float) -> None:
    """Drain *app* (see the module docstring); returns within about *grace* seconds."""
    drain: Drain = app.state.drain
    if drain.draining:
        return
    drain.begin()
    services: Services = app.state.services
    log.info("draining: refusing new requests, interrupting running runs")
    await services.runs.manager.stop_runs(grace)
    cancelled = drain.cancel_in_flight()
    if cancelled:
        log.info("draining: cancelled %d request(s) still in flight", cancelled)


class HeedServer(uvicorn.Server):
    """A uvicorn server that drains the heed app before its own shutdown."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self.heed_app = app
        # before the lifespan starts the worker threads (see heed.runtime.heap)
        limit_malloc_arenas(app.state.services.settings.malloc_arenas)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's start-up (the app's lifespan included), then the start-up objects are
        frozen out of the garbage collector's walks (see :mod:`heed.runtime.heap`)."""
        await super().startup(sockets)
        frozen = freeze_long_lived_objects()
        log.debug("froze %d start-up objects out of the garbage collector", frozen)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        grace = float(self.config.timeout_graceful_shutdown or 5)
        await drain_app(self.heed_app, grace)
        await super().shutdown(sockets)
