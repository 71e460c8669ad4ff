"""heed's MCP server: memory banks and chat sessions as Model Context Protocol tools.

Built on the official ``mcp`` SDK. ``heed serve`` answers it over streamable HTTP at
``/mcp``; ``heed mcp`` over stdio. The promise is heed's own: a client that cancels a
call (``notifications/cancelled``, or closing the stream) stops its work, inside worker
threads and LLM generations, and frees its lane slot before the call ends; long work
(reflect, a chat turn, a mental model's refresh) is a run that ``/v1/runs`` shows and can
cancel by id.

- :mod:`heed.mcp.calls`: one tool call's identity, token, errors, progress and run
  following;
- :mod:`heed.mcp.tools`: the tools and resources, one module per resource;
- :mod:`heed.mcp.sessions`: HTTP sessions owned by their key, capped per tenant, never
  logged;
- :mod:`heed.mcp.server`: the server, its HTTP endpoint and its stdio runner.
"""

from heed.mcp.server import MCP_PATH, McpHttp, build_mcp_server, http_endpoint, serve_stdio

__all__ = ["MCP_PATH", "McpHttp", "build_mcp_server", "http_endpoint", "serve_stdio"]
