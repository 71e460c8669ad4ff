"""Server-sent events: frame formatting and a response that stops when the client leaves.

uvicorn silently drops writes after a client disconnects, so a stream cannot
learn it is orphaned from ``send``. :func:`sse_response` races every step of
its source against the request's token, which the lifecycle middleware
cancels on ``http.disconnect``: the source generator is closed at once and no
tail or heartbeat loop outlives its client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any, Final

from starlette.responses import StreamingResponse

from heed.runs.model import RunEvent
from heed.runtime import CancellationToken, current_token

__all__ = ["HEARTBEAT_FRAME", "event_frame", "named_frame", "parse_cursor", "sse_response"]

HEARTBEAT_FRAME: Final = ": heartbeat\n\n"
_HEADERS: Final = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _json(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def event_frame(event: RunEvent) -> str:
    """A journal event: ``id:`` is its seq, ``event:`` its type, ``data:`` the event JSON."""
    return f"id: {event.seq}\nevent: {event.type}\ndata: {_json(event.to_public())}\n\n"


def named_frame(name: str, data: Any) -> str:
    """An event without an id (gap notices, session channel events)."""
    return f"event: {name}\ndata: {_json(data)}\n\n"


def parse_cursor(after: str | None, last_event_id: str | None) -> int:
    """The resume cursor: ``?after=N`` wins over ``Last-Event-ID``; malformed or negative is 0."""
    for raw in (after, last_event_id):
        if raw is None or raw.strip() == "":
            continue
        try:
            return max(0, int(raw.strip()))
        except ValueError:
            return 0
    return 0


async def _until_cancelled(
    source: AsyncIterator[str], token: CancellationToken | None
) -> AsyncIterator[str]:
    yield "retry: 1000\n\n"
    step: asyncio.Future[str] | None = None
    try:
        while True:
            step = asyncio.ensure_future(anext(source))
            if token is not None:
                stop = asyncio.ensure_future(token.wait())
                try:
                    await asyncio.wait({step, stop}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stop.cancel()
                if not step.done():
                    return  # the client left: the finally block stops the source
            try:
                frame = await step
            except StopAsyncIteration:
                return
            step = None
            yield frame
    finally:
        if step is not None and not step.done():
            step.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await step
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(RuntimeError):
                await aclose()


def sse_response(source: AsyncIterator[str]) -> StreamingResponse:
    """Stream *source*'s frames as ``text/event-stream`` until it ends or the client leaves."""
    return StreamingResponse(
        _until_cancelled(source, current_token()),
        media_type="text/event-stream",
        headers=_HEADERS,
    )
