"""Building heed's MCP server, and serving it over streamable HTTP or stdio.

- :func:`build_mcp_server`: an :class:`~mcp.server.mcpserver.MCPServer` with heed's
  tools (:mod:`heed.mcp.tools`) over one :class:`~heed.services.Services`.
- :func:`http_routes`: its streamable-HTTP endpoint as routes for heed's own app, which
  mounts them at ``/mcp`` behind the lifecycle middleware (auth, admission, body limit,
  the request token) and runs :func:`session_lifespan` in its lifespan.
- :func:`serve_stdio`: ``heed mcp``: the same tools over stdin/stdout for one tenant,
  with the server's own services (the embedded database under the data directory).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from starlette.routing import BaseRoute, Route

from heed.mcp.asgi_guard import CompletedResponseGuard, quiet_closed_session_errors
from heed.mcp.tools import HeedTools
from heed.runtime import DEFAULT_TENANT, RequestContext
from heed.services import Services
from heed.settings import Settings
from heed.version import __version__

__all__ = ["MCP_PATH", "build_mcp_server", "http_routes", "serve_stdio", "session_lifespan"]

MCP_PATH = "/mcp"

_INSTRUCTIONS = (
    "heed keeps memory banks for agents. recall looks memories up, retain stores new ones, "
    "reflect answers a question from a bank by reasoning over what it recalls, and "
    "start_turn talks to a chat agent in a session. Cancelling a call stops its work."
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


def http_routes(server: MCPServer) -> list[BaseRoute]:
    """The streamable-HTTP endpoint of *server* at :data:`MCP_PATH`, as routes to add to
    heed's app (run :func:`session_lifespan` in the app's lifespan).

    The endpoint is wrapped in :class:`~heed.mcp.asgi_guard.CompletedResponseGuard` (an SDK
    bug, explained there). The SDK's DNS-rebinding check is off: heed's authenticator
    already enforces the Host allow-list on every path, ``/mcp`` included (one place for
    that rule).
    """
    app = server.streamable_http_app(
        streamable_http_path=MCP_PATH,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    quiet_closed_session_errors()
    routes: list[BaseRoute] = []
    for route in app.routes:
        if isinstance(route, Route) and route.path == MCP_PATH:
            route = Route(MCP_PATH, endpoint=CompletedResponseGuard(route.endpoint))
        routes.append(route)
    return routes


@asynccontextmanager
async def session_lifespan(server: MCPServer) -> AsyncIterator[None]:
    """Run the MCP session manager of *server* (after :func:`http_routes`); on exit its
    sessions, and the calls they are running, are cancelled."""
    async with server.session_manager.run():
        yield


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
