"""Building heed's MCP server, and serving it over streamable HTTP or stdio.

- :func:`build_mcp_server`: an :class:`~mcp.server.mcpserver.MCPServer` with heed's
  tools (:mod:`heed.mcp.tools`) over one :class:`~heed.services.Services`.
- :func:`http_endpoint`: its streamable-HTTP endpoint (:class:`McpHttp`) for heed's own
  app, which mounts its routes at ``/mcp`` behind the lifecycle middleware (auth,
  admission, body limit, the request token) and runs its sessions in its lifespan.
  Sessions belong to the key that opened them and are capped per tenant
  (:mod:`heed.mcp.sessions`).
- :func:`serve_stdio`: ``heed mcp``: the same tools over stdin/stdout for one tenant,
  with the server's own services (the embedded database under the data directory).
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from starlette.routing import BaseRoute, Route

from heed.mcp.asgi_guard import CompletedResponseGuard, quiet_closed_session_errors
from heed.mcp.sessions import McpEndpoint, TenantSessionManager, redact_session_ids
from heed.mcp.tools import HeedTools
from heed.runtime import DEFAULT_TENANT, RequestContext
from heed.services import Services
from heed.settings import Settings
from heed.version import __version__

__all__ = ["MCP_PATH", "McpHttp", "build_mcp_server", "http_endpoint", "serve_stdio"]

MCP_PATH = "/mcp"

_INSTRUCTIONS = (
    "heed keeps memory banks for agents. recall looks memories up, retain stores new ones, "
    "reflect answers a question from a bank by reasoning over what it recalls, and "
    "start_turn talks to a chat agent in a session. A mental model is a question whose answer "
    "heed keeps for a bank (create_mental_model, refresh_mental_model); directives are "
    "standing rules reflect and chat turns follow. Cancelling a call stops its work."
)


def build_mcp_server(
    services: Services, *, stdio_context: RequestContext | None = None
) -> MCPServer:
    """heed's MCP server over *services*; *stdio_context* is the identity of stdio calls."""
    server = MCPServer(
        name="heed",
        version=__version__,
        instructions=_INSTRUCTIONS,
    )
    HeedTools(services, stdio_context).register(server)
    return server


@dataclass(frozen=True, slots=True)
class McpHttp:
    """heed's MCP server over streamable HTTP: the routes to add to heed's app, and the
    session manager to run in the app's lifespan (:meth:`sessions`)."""

    routes: list[BaseRoute]
    manager: TenantSessionManager

    def sessions(self) -> AbstractAsyncContextManager[None]:
        """Run the MCP sessions; on exit they, and the calls they are running, are
        cancelled."""
        return self.manager.run()


def http_endpoint(server: MCPServer, settings: Settings) -> McpHttp:
    """The streamable-HTTP endpoint of *server* at :data:`MCP_PATH`.

    Its sessions are owned by the key that opened them and capped per tenant
    (``HEED_MCP_SESSIONS_PER_TENANT``; :mod:`heed.mcp.sessions`), with at most
    ``HEED_MCP_MAX_SESSIONS`` in all, each closed after ``HEED_MCP_SESSION_IDLE_SECONDS``
    without a request; their ids never reach a log. The endpoint is wrapped in
    :class:`~heed.mcp.asgi_guard.CompletedResponseGuard` (an SDK bug, explained there).
    The SDK's DNS-rebinding check is off: heed's authenticator already enforces the Host
    allow-list on every path, ``/mcp`` included (one place for that rule).
    """
    manager = TenantSessionManager(
        # The SDK builds its manager in MCPServer.streamable_http_app(), where no
        # subclass can be put; the low-level server is what that passes.
        server._lowlevel_server,
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        session_idle_timeout=settings.mcp_session_idle_seconds,
        max_sessions=settings.mcp_max_sessions,
        per_tenant=min(settings.mcp_sessions_per_tenant, settings.mcp_max_sessions),
    )
    quiet_closed_session_errors()
    redact_session_ids()
    endpoint = CompletedResponseGuard(McpEndpoint(manager))
    return McpHttp(routes=[Route(MCP_PATH, endpoint=endpoint)], manager=manager)


async def serve_stdio(settings: Settings, tenant: str | None = None) -> None:
    """Serve heed's MCP tools over stdin/stdout as *tenant* (default: the default tenant)
    until stdin closes, with services of their own built from *settings*."""
    services = Services(settings)
    identity = RequestContext(tenant=tenant or DEFAULT_TENANT)
    server = build_mcp_server(services, stdio_context=identity)
    await services.start()
    try:
        await server.run_stdio_async()
    finally:
        await services.close()
