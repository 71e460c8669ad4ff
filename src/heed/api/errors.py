"""Exception handlers: how heed's errors become HTTP answers.

- ``OperationCancelled``: 499 (the client never sees it; logged and counted).
- ``LaneFull``: 503 with ``Retry-After``.
- ``HeedError`` subclasses: their own 4xx with a message naming the problem.
- ``RequestValidationError``: 422 with FastAPI's usual ``detail`` list, encoded as ASCII JSON so
  that no echoed input (a lone surrogate, say) can turn the refusal itself into a 500.
- 405: FastAPI's answer, with an ``Allow`` header naming every method of the resource.
  Starlette's router hands a method mismatch to the *first* route whose path matches, and
  that route lists only its own methods; heed declares one route per method, so
  ``OPTIONS /v1/sessions/{id}`` used to answer ``Allow: GET`` for a path that also takes
  PATCH and DELETE.
Anything else is a bug and answers 500.
"""

from __future__ import annotations

import json
import re
from typing import Any

import fastapi.routing
from fastapi import FastAPI
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.routing import Mount

from heed.api.deps import metrics_of
from heed.errors import HeedError  # re-exported: the old import path keeps working
from heed.runtime import LaneFull, OperationCancelled

__all__ = ["HeedError", "allowed_methods", "install_error_handlers"]

# FastAPI >= 0.16x nests included routers; iter_route_contexts flattens them (with full paths).
# Before that, app.router.routes is flat already.
_route_contexts: Any = getattr(fastapi.routing, "iter_route_contexts", iter)


async def _cancelled(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, OperationCancelled)
    request.state.cancel_reason = exc.reason
    return JSONResponse({"detail": f"cancelled: {exc.reason}"}, status_code=499)


async def _lane_full(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, LaneFull)
    metrics_of(request.app).record_overload("lane")
    return JSONResponse(
        {"detail": str(exc), "lane": exc.lane, "retry_after": exc.retry_after},
        status_code=503,
        headers={"Retry-After": str(exc.retry_after)},
    )


async def _heed_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HeedError)
    return JSONResponse(
        {"detail": exc.message}, status_code=exc.status_code, headers=exc.headers or None
    )


_MAX_ECHO_CHARS = 200
"""How much of a refused input value a 422 repeats back: enough to recognise, never the body."""


def _short(value: object) -> object:
    if isinstance(value, str) and len(value) > _MAX_ECHO_CHARS:
        return value[:_MAX_ECHO_CHARS] + "..."
    if isinstance(value, (dict, list)) and len(json.dumps(value, default=str)) > _MAX_ECHO_CHARS:
        return "(omitted)"
    return value


async def _invalid_request(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = []
    for error in exc.errors():
        entry = {key: value for key, value in error.items() if key != "ctx"}
        if "input" in entry:
            entry["input"] = _short(entry["input"])
        errors.append(entry)
    body = json.dumps({"detail": jsonable_encoder(errors)}, ensure_ascii=True, default=str)
    return Response(body, status_code=422, media_type="application/json")


def allowed_methods(request: Request) -> list[str]:
    """Every method of the resource at the request's path: the methods of all routes that share
    the path template of the first route whose path matches (the one Starlette dispatched to)."""
    path = request.scope["path"].removeprefix(request.scope.get("root_path", ""))
    template: str | None = None
    methods: set[str] = set()
    for route in _route_contexts(request.app.router.routes):
        regex = getattr(route, "path_regex", None)
        if regex is None or not regex.match(path):
            continue
        if template is None:
            template = _plain(route.path)
        if _plain(route.path) != template:
            continue
        original = getattr(route, "original_route", route)
        if isinstance(original, Mount) and isinstance(original.app, StaticFiles):
            methods |= {"GET", "HEAD"}
        methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


def _plain(template: str) -> str:
    """A path template without its parameters' convertors (``{id:path}`` is ``{id}``): routes
    of one resource may read a parameter with different convertors."""
    return re.sub(r"\{(\w+):[^}]*\}", r"{\1}", template)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 405:
        methods = allowed_methods(request)
        if methods:
            headers = {**(exc.headers or {}), "Allow": ", ".join(methods)}
            exc = StarletteHTTPException(405, exc.detail, headers=headers)
    return await http_exception_handler(request, exc)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(OperationCancelled, _cancelled)
    app.add_exception_handler(LaneFull, _lane_full)
    app.add_exception_handler(HeedError, _heed_error)
