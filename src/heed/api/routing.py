"""Routes whose large JSON bodies are parsed off the event loop.

FastAPI parses a request's JSON body with ``json.loads`` on the event loop before the route
runs; a 5 MB retain took 25-50 ms of the loop, which every other request waited for.
:class:`HeedRoute` (every router's ``route_class``) hands routes an
:class:`OffloadedJsonRequest`, whose :meth:`~OffloadedJsonRequest.json` parses a body of
:data:`~heed.api.input_rules.OFFLOAD_BODY_BYTES` or more in a worker thread (the request's
token is the thread's: a client that leaves stops the wait, 499). Smaller bodies are parsed
where they are, which is cheaper than a thread hop. The large parse happens before FastAPI's
handler runs, so a client that leaves during it is a cancellation (499), not a 400. This is
FastAPI's documented extension point for a custom request class (a custom ``APIRoute``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from heed.api.input_rules import OFFLOAD_BODY_BYTES
from heed.api.tracing import name_request_span
from heed.runtime import run_in_thread

__all__ = ["HeedRoute", "OffloadedJsonRequest"]


class OffloadedJsonRequest(Request):
    """A request whose large JSON body is parsed in a worker thread (module docstring)."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            if len(body) >= OFFLOAD_BODY_BYTES:
                self._json = await run_in_thread(json.loads, body)
            else:
                self._json = json.loads(body)
        return self._json

    async def parse_large_json(self) -> None:
        """Parse a large JSON body now, before FastAPI's handler asks for it.

        FastAPI turns any exception of its body parse but a JSON error into a 400, so a
        cancellation raised there (the client left during the parse) would be counted as
        the client's mistake; raised here, it reaches the lifecycle middleware as a 499. A
        body that is not valid JSON is left for FastAPI, which answers 422 naming where."""
        if "json" not in (self.headers.get("content-type") or ""):
            return
        if len(await self.body()) < OFFLOAD_BODY_BYTES:
            return
        with contextlib.suppress(ValueError):  # json.JSONDecodeError, UnicodeDecodeError
            await self.json()


class HeedRoute(APIRoute):
    """An ``APIRoute`` whose handler gets an :class:`OffloadedJsonRequest`, and which names
    the request's span after its path template while tracing is on
    (:func:`heed.api.tracing.name_request_span`)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        route = self.path

        async def offloading_handler(request: Request) -> Response:
            name_request_span(request.method, route)
            offloaded = OffloadedJsonRequest(request.scope, request.receive)
            await offloaded.parse_large_json()
            return await handler(offloaded)

        return offloading_handler
