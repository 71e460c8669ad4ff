"""A guard around the MCP SDK's HTTP endpoint for what it does after a response ended.

The SDK's handshake-era transport (``mcp`` 2.3) answers a notification POST with ``202``
first and hands the message to its session afterwards; when the session was terminated
in between (a client that cancels a call and closes at once sends ``notifications/
cancelled`` and ``DELETE`` together), that hand-off raises ``ClosedResourceError``, and the
SDK's error path then starts a second response (a 500) on the finished one. uvicorn
refuses it and logs "Exception in ASGI application". Reported upstream (python-sdk PR
#2934's review, open PR #2983); until it is fixed there, this guard drops whatever the
endpoint sends after its response completed and logs an exception raised after that point
at debug level: the client already has its answer, and the message it carried was for a
session that no longer exists. An exception before the response completed propagates.
The SDK's own ERROR record of that ``ClosedResourceError`` is filtered out too
(:func:`quiet_closed_session_errors`), for the same reason.
"""

from __future__ import annotations

import logging

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from heed.runtime import reraise_cancellation

__all__ = ["CompletedResponseGuard", "quiet_closed_session_errors"]

log = logging.getLogger("heed.mcp")


class CompletedResponseGuard:
    """Wrap an HTTP ASGI endpoint so nothing follows its completed response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        completed = False

        async def send_once(message: Message) -> None:
            nonlocal completed
            if completed:
                log.debug("dropped %s sent after the response completed", message["type"])
                return
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                completed = True
            await send(message)

        try:
            await self.app(scope, receive, send_once)
        except Exception as exc:
            reraise_cancellation(exc)
            if not completed:
                raise
            log.debug("MCP endpoint failed after its response completed: %r", exc)


class _ClosedSessionFilter(logging.Filter):
    """Drops the SDK's "Error handling POST request" records caused by a closed session."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, anyio.ClosedResourceError)


_FILTER = _ClosedSessionFilter()


def quiet_closed_session_errors() -> None:
    """Install the filter on the SDK's streamable-HTTP logger (idempotent)."""
    logger = logging.getLogger("mcp.server.streamable_http")
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
