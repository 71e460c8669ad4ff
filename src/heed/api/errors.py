"""Exception handlers: how heed's errors become HTTP answers.

- ``OperationCancelled``: 499 (the client never sees it; logged and counted).
- ``LaneFull``: 503 with ``Retry-After``.
- ``HeedError`` subclasses: their own 4xx with a message naming the problem.
- ``RequestValidationError``: 422 with FastAPI's usual ``detail`` list, encoded as ASCII JSON so
  that no echoed input (a lone surrogate, say) can turn the refusal itself into a 500.
Anything else is a bug and answers 500.
"""

from __future__ import annotations

import json

from fastapi import FastAPI
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.requests import Request

from heed.errors import HeedError  # re-exported: the old import path keeps working
from heed.runtime import LaneFull, OperationCancelled

__all__ = ["HeedError", "install_error_handlers"]


async def _cancelled(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, OperationCancelled)
    request.state.cancel_reason = exc.reason
    return JSONResponse({"detail": f"cancelled: {exc.reason}"}, status_code=499)


async def _lane_full(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, LaneFull)
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


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(OperationCancelled, _cancelled)
    app.add_exception_handler(LaneFull, _lane_full)
    app.add_exception_handler(HeedError, _heed_error)
