"""The guard drops what the MCP endpoint sends after its response completed (an SDK bug)."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest
from starlette.types import Message, Receive, Scope, Send

from heed.mcp.asgi_guard import CompletedResponseGuard, quiet_closed_session_errors

SCOPE: dict[str, Any] = {"type": "http", "method": "POST", "path": "/mcp"}


async def _receive() -> Message:
    return {"type": "http.disconnect"}


async def accepted_then_closed(scope: Scope, receive: Receive, send: Send) -> None:
    """What the SDK does when a notification's session closed after the 202 went out."""
    await send({"type": "http.response.start", "status": 202, "headers": []})
    await send({"type": "http.response.body", "body": b""})
    try:
        raise anyio.ClosedResourceError
    except anyio.ClosedResourceError:
        await send({"type": "http.response.start", "status": 500, "headers": []})
        await send({"type": "http.response.body", "body": b"Error handling POST request"})
        raise


async def fails_before_answering(scope: Scope, receive: Receive, send: Send) -> None:
    raise RuntimeError("broken before the response")


async def test_nothing_follows_a_completed_response_and_the_late_error_is_absorbed() -> None:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        if sent and sent[-1]["type"] == "http.response.body" and not sent[-1].get("more_body"):
            raise AssertionError(f"{message['type']} after the response completed")
        sent.append(message)

    await CompletedResponseGuard(accepted_then_closed)(SCOPE, _receive, send)
    assert [(m["type"], m.get("status")) for m in sent] == [
        ("http.response.start", 202),
        ("http.response.body", None),
    ]


async def test_an_error_before_the_response_completed_propagates() -> None:
    async def send(message: Message) -> None:
        raise AssertionError("nothing was to be sent")

    with pytest.raises(RuntimeError, match="broken before the response"):
        await CompletedResponseGuard(fails_before_answering)(SCOPE, _receive, send)


def test_the_sdk_record_of_a_closed_session_is_filtered_and_others_are_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    quiet_closed_session_errors()
    logger = logging.getLogger("mcp.server.streamable_http")
    with caplog.at_level(logging.ERROR, logger="mcp.server.streamable_http"):
        for error in (anyio.ClosedResourceError(), ValueError("a real failure")):
            try:
                raise error
            except Exception:
                logger.exception("Error handling POST request")
    assert [r.exc_info[1].__class__ for r in caplog.records if r.exc_info] == [ValueError]
