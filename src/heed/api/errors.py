"""Exception handlers: how heed's errors become HTTP answers.

- ``OperationCancelled``: 499 (the client never sees it; logged and counted).
- ``LaneFull``: 503 with ``Retry-After``.
- ``HeedError`` subclasses: their own 4xx with a message naming the problem.
Anything else is a bug and answers 500.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse
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


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(OperationCancelled, _cancelled)
    app.add_exception_handler(LaneFull, _lane_full)
    app.add_exception_handler(HeedError, _heed_error)
