"""MCP sessions over HTTP: owned by the key that opened them, capped per tenant, never logged.

The SDK (``mcp`` 2.3) keeps the streamable-HTTP sessions of the handshake-era protocol in
its :class:`~mcp.server.streamable_http_manager.StreamableHTTPSessionManager`. It binds a
session to the credential that opened it, but only when the request carries the SDK's own
authenticated user in ``scope["user"]``; heed authenticates in its lifecycle middleware,
which the SDK does not know about, so without help every session was open to anyone who
learned its id (another tenant could ``DELETE`` it, or cancel its calls with
``notifications/cancelled``). This module closes that gap and bounds what one tenant holds:

- :class:`McpEndpoint` (the ASGI endpoint at ``/mcp``) hands the SDK heed's identity
  (``scope["state"]["request_context"]``) as that user (:func:`user_of`): a session
  belongs to the tenant and key that opened it, and a request with any other key, for any
  method, is answered 404 "Session not found", exactly as for an id that does not exist.
- :class:`TenantSessionManager` counts open sessions per tenant: opening one more than
  ``HEED_MCP_SESSIONS_PER_TENANT`` is refused with 429 naming the limit, and other tenants
  are unaffected. A session ends when its client sends ``DELETE``, when it has been idle
  for ``HEED_MCP_SESSION_IDLE_SECONDS``, or when the server stops; its place is free again
  at once.
- :func:`redact_session_ids` keeps session ids out of the SDK's log records: an id is a
  bearer capability within its tenant, and logs travel further than keys do.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, AuthorizationContext
from mcp.server.auth.provider import AccessToken
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp_types import INVALID_REQUEST, ErrorData, JSONRPCError
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from heed.runtime import RequestContext

__all__ = [
    "SESSION_LOGGERS",
    "McpEndpoint",
    "SessionLimitReached",
    "TenantSessionManager",
    "redact_session_ids",
    "user_of",
]

#: The SDK loggers whose records can name a session id.
SESSION_LOGGERS: Final = ("mcp.server.streamable_http_manager", "mcp.server.streamable_http")

#: What a session id looks like in the SDK (``uuid4().hex``), anywhere in a message.
_SESSION_ID: Final = re.compile(r"[0-9a-fA-F]{32}")
#: What follows the SDK's "unknown or expired session ID: " (whatever the client sent).
_CLIENT_SESSION_ID: Final = re.compile(r"(session ID: )\S+")
REDACTED: Final = "<session id>"


class SessionLimitReached(Exception):
    """A tenant already holds as many open MCP sessions as it may."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"this tenant already has {limit} open MCP sessions, the most one tenant may hold "
            "(HEED_MCP_SESSIONS_PER_TENANT); end one with DELETE /mcp, or wait until an idle "
            "one expires"
        )
        self.limit = limit


def user_of(context: RequestContext) -> AuthenticatedUser:
    """The SDK's authenticated user for heed's request *context*: the session owner the
    SDK compares is ``(client_id, issuer, subject)`` = ``(tenant, None, principal)``.

    No secret goes in: the principal is the key's non-secret name (its hash prefix), or
    ``None`` without API keys (then every caller is the one loopback tenant).
    """
    token = AccessToken(
        token=context.principal or "",
        client_id=context.tenant,
        scopes=[],
        subject=context.principal,
    )
    return AuthenticatedUser(token)


class TenantSessionManager(StreamableHTTPSessionManager):
    """The SDK's session manager with a per-tenant cap on open sessions.

    Admission stays where the SDK decides it, under its creation lock, so the count is
    exact however many opening requests race: :meth:`_admit_session` raises
    :class:`SessionLimitReached` (which :class:`McpEndpoint` answers 429) instead of
    opening the tenant's ``per_tenant + 1``-th session, and every way a session ends goes
    through :meth:`_discard_session`, which gives its place back. Relies on those two
    hooks of ``mcp`` 2.3's manager; ``tests/mcp_api/test_mcp_sessions.py`` fails if they
    change.
    """

    def __init__(self, *args: Any, per_tenant: int, **kwargs: Any) -> None:
        if per_tenant < 1:
            raise ValueError(f"per_tenant must be >= 1, got {per_tenant}")
        super().__init__(*args, **kwargs)
        self.per_tenant = per_tenant
        self._tenant_of: dict[str, str] = {}
        self._open: Counter[str] = Counter()

    def open_sessions(self, tenant: str) -> int:
        """How many sessions *tenant* holds open now."""
        return self._open[tenant]

    @asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """The SDK's :meth:`run`; on exit (every session cancelled) the counts are reset."""
        try:
            async with super().run():
                yield
        finally:
            self._tenant_of.clear()
            self._open.clear()

    def _admit_session(
        self, requestor: AuthorizationContext | None
    ) -> StreamableHTTPServerTransport | None:
        tenant = requestor["client_id"] if requestor is not None else ""
        if self._open[tenant] >= self.per_tenant:
            raise SessionLimitReached(self.per_tenant)
        transport = super()._admit_session(requestor)
        if transport is not None and transport.mcp_session_id is not None:
            self._tenant_of[transport.mcp_session_id] = tenant
            self._open[tenant] += 1
        return transport

    async def _discard_session(
        self, session_id: str, transport: StreamableHTTPServerTransport
    ) -> None:
        tenant = self._tenant_of.pop(session_id, None)  # called more than once per session
        if tenant is not None:
            self._open[tenant] -= 1
            if self._open[tenant] <= 0:
                del self._open[tenant]
        await super()._discard_session(session_id, transport)


class McpEndpoint:
    """The ASGI endpoint at ``/mcp``: heed's identity as the SDK's user, then the SDK.

    Behind heed's lifecycle middleware every request has an authenticated
    :class:`~heed.runtime.RequestContext`; one without (the endpoint mounted anywhere
    else) is refused with 401 rather than served as nobody's.
    """

    def __init__(self, manager: TenantSessionManager) -> None:
        self.manager = manager

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        context = scope.get("state", {}).get("request_context")
        if not isinstance(context, RequestContext):
            await _error(401, "this request carries no identity")(scope, receive, send)
            return
        scope["user"] = user_of(context)
        try:
            await self.manager.handle_request(scope, receive, send)
        except SessionLimitReached as exc:  # raised before the SDK answered anything
            await _error(429, str(exc))(scope, receive, send)


def _error(status: int, message: str) -> Response:
    """A JSON-RPC error body (no request id), as the SDK answers its own refusals."""
    body = JSONRPCError(
        jsonrpc="2.0", id=None, error=ErrorData(code=INVALID_REQUEST, message=message)
    )
    return Response(
        body.model_dump_json(by_alias=True, exclude_unset=True),
        status_code=status,
        media_type="application/json",
    )


class _SessionIdRedactor(logging.Filter):
    """Rewrites a record's message with every session id replaced by ``<session id>``."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError, KeyError):  # a malformed record: logging reports it
            return True
        redacted = _SESSION_ID.sub(REDACTED, _CLIENT_SESSION_ID.sub(rf"\1{REDACTED}", message))
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


_REDACTOR = _SessionIdRedactor()


def redact_session_ids() -> None:
    """Install the redaction on the SDK's session loggers (idempotent).

    A filter, not a higher level: the records stay (a refused session, an idle timeout, a
    crashed session are worth seeing), without the id.
    """
    for name in SESSION_LOGGERS:
        logger = logging.getLogger(name)
        if _REDACTOR not in logger.filters:
            logger.addFilter(_REDACTOR)
