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
from typing import Any

import uvicorn
from fastapi import FastAPI

from heed.api.connection import ConnectionLimits, guarded_protocol, raise_open_files_limit
from heed.api.deps import drain_of, services_of
from heed.runtime.heap import freeze_long_lived_objects, limit_malloc_arenas
from heed.settings import Settings

__all__ = ["HeedServer", "drain_app", "server_config"]

log = logging.getLogger(__name__)


def server_config(app: Any, settings: Settings, **overrides: Any) -> uvicorn.Config:
    """uvicorn's configuration for *app* on *settings*: the guarded protocol with its
    head bound and timeouts (:mod:`heed.api.connection`), keep-alive and the drain's grace.

    *overrides* are passed to ``uvicorn.Config`` as they are (tests set ``port``)."""
    limits = ConnectionLimits(
        max_head_bytes=settings.max_head_bytes,
        head_timeout=settings.head_timeout_seconds,
        body_timeout=settings.body_timeout_seconds,
    )
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "log_level": settings.log_level.lower(),
        "http": guarded_protocol(limits),
        "ws": "none",  # heed serves no WebSocket; an upgrade request is answered as HTTP
        "timeout_keep_alive": settings.keep_alive_seconds,
        # SIGTERM drains first (heed.api.server): streams get their last event and end;
        # this bounds the wait for whatever still holds a connection after that.
        "timeout_graceful_shutdown": settings.shutdown_grace_seconds,
        # heed.logs configures logging (control characters escaped); uvicorn's loggers
        # propagate to it instead of installing their own handlers.
        "log_config": None,
    }
    options.update(overrides)
    return uvicorn.Config(app, **options)


async def drain_app(app: FastAPI, grace: float) -> None:
    """Drain *app* (see the module docstring); returns within about *grace* seconds."""
    drain = drain_of(app)
    if drain.draining:
        return
    drain.begin()
    log.info("draining: refusing new requests, interrupting running runs")
    await services_of(app).manager.stop_runs(grace)
    cancelled = drain.cancel_in_flight()
    if cancelled:
        log.info("draining: cancelled %d request(s) still in flight", cancelled)


class HeedServer(uvicorn.Server):
    """A uvicorn server that drains the heed app before its own shutdown."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self.heed_app = app
        # before the lifespan starts the worker threads (see heed.runtime.heap)
        limit_malloc_arenas(services_of(app).settings.malloc_arenas)
        raise_open_files_limit()

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
