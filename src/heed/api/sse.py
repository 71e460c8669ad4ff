"""Server-sent events: frame formatting and a response that stops when the client leaves.

uvicorn silently drops writes after a client disconnects, so a stream cannot
learn it is orphaned from ``send``. The lifecycle middleware cancels the
request token on ``http.disconnect``; stream sources watch that token (the
journal's :meth:`~heed.runs.journal.Journal.follow` and the session channel
stop their broker subscription on cancel), so no tail or heartbeat loop
outlives its client. A small cache keeps formatted frames, so an event fanned
out to many subscribers is serialized once.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from heed.runs.journal import Gap, Heartbeat, Journal
from heed.runs.model import RunEvent
from heed.runtime import CancellationToken, current_token

__all__ = [
    "HEARTBEAT_FRAME",
    "event_frame",
    "event_frames",
    "journal_frames",
    "named_frame",
    "parse_cursor",
    "sse_response",
]

HEARTBEAT_FRAME: Final = ": heartbeat\n\n"
_HEADERS: Final = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _json(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


_FRAME_CACHE: OrderedDict[tuple[str, int], str] = OrderedDict()
_FRAME_CACHE_SIZE: Final = 4096


def event_frame(event: RunEvent) -> str:
    """A journal event: ``id:`` is its seq, ``event:`` its type, ``data:`` the event JSON."""
    return f"id: {event.seq}\nevent: {event.type}\ndata: {event.to_json()}\n\n"


def event_frames(events: list[RunEvent]) -> str:
    """Frames for a batch. A live event (a batch of one, fanned out to every
    subscriber) is formatted once and cached; a replay batch is formatted directly."""
    if len(events) != 1:
        return "".join(event_frame(e) for e in events)
    event = events[0]
    key = (event.run_id, event.seq)
    frame = _FRAME_CACHE.get(key)
    if frame is None:
        frame = event_frame(event)
        _FRAME_CACHE[key] = frame
        if len(_FRAME_CACHE) > _FRAME_CACHE_SIZE:
            _FRAME_CACHE.popitem(last=False)
    return frame


def named_frame(name: str, data: Any) -> str:
    """An event without an id (gap notices, session channel events)."""
    return f"event: {name}\ndata: {_json(data)}\n\n"


MAX_CURSOR = 2**62
"""The largest cursor honoured. A larger one (say 2**63, past SQLite's INTEGER) is clamped to
it: it still means "after everything so far" and never reaches the store as an overflow."""


_ASCII_SPACE: Final = " \t\r\n\x0b\x0c"


def parse_cursor(after: str | None, last_event_id: str | None) -> int:
    """The resume cursor: ``?after=N`` wins over ``Last-Event-ID``; blank means not given.

    A cursor is ASCII digits with an optional leading ``-`` (ASCII whitespace around it is
    ignored). Anything else -- ``1_0``, ``+3``, non-ASCII digits, ``3.0`` -- is malformed
    and means 0, and so does a negative one; above :data:`MAX_CURSOR` (or with more digits
    than a sequence number can have) it is clamped to it. Python's ``int()`` is not used:
    it reads all of those lookalikes as numbers.
    """
    for raw in (after, last_event_id):
        if raw is None:
            continue
        text = raw.strip(_ASCII_SPACE)
        if text == "":
            continue
        negative = text.startswith("-")
        digits = text[1:] if negative else text
        if not (digits.isascii() and digits.isdigit()):
            return 0
        if negative:
            return 0
        if len(digits) > 19:
            return MAX_CURSOR
        return min(MAX_CURSOR, int(digits))
    return 0


async def _frames(
    source: AsyncIterator[str], token: CancellationToken | None
) -> AsyncIterator[str]:
    yield "retry: 1000\n\n"
    try:
        async for frame in source:
            if token is not None and token.cancelled:
                return
            yield frame
    finally:
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            await aclose()


async def journal_frames(
    journal: Journal,
    run_id: str,
    cursor: int,
    *,
    heartbeat: float,
    token: CancellationToken,
) -> AsyncIterator[str]:
    """A run's journal after *cursor* as SSE frames (see :meth:`Journal.follow`): one frame
    per event (``id:`` its seq), ``gap`` when the cursor is older than what is retained,
    heartbeat comments; ends after the terminal event or when *token* is cancelled."""
    async for item in journal.follow(run_id, cursor, heartbeat=heartbeat, token=token):
        if isinstance(item, Heartbeat):
            yield HEARTBEAT_FRAME
        elif isinstance(item, Gap):
            yield named_frame(
                "gap",
                {"run_id": run_id, "after": item.after, "first_retained": item.first_retained},
            )
        else:
            yield event_frames(item)


class _StreamResponse(StreamingResponse):
    """A streaming response that calls *release* once it has ended, however it ended."""

    def __init__(self, *args: Any, release: Callable[[], None] | None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self._release is not None:
                self._release()


def sse_response(
    source: AsyncIterator[str],
    headers: dict[str, str] | None = None,
    *,
    release: Callable[[], None] | None = None,
) -> StreamingResponse:
    """Stream *source*'s frames as ``text/event-stream`` until it ends or the client leaves.

    Contract: *source* must end promptly once the request token is cancelled,
    even while it waits (the journal and the session channel do: their broker
    subscription is stopped by the token). Between frames the token is checked
    here as well. *release* (a stream slot's, :mod:`heed.api.streams`) is called once
    the response has ended.
    """
    return _StreamResponse(
        _frames(source, current_token()),
        media_type="text/event-stream",
        headers={**_HEADERS, **(headers or {})},
        release=release,
    )
