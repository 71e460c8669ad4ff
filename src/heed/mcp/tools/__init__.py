"""heed's MCP tools and resources: memory banks and chat sessions for an agent, one module
per resource as the HTTP API's routes.

Each tool is one :func:`heed.mcp.calls.tool_call` (identity from the HTTP request or
stdio, a token the client's cancel trips, heed errors as tool errors naming the
problem) around the same engine call the HTTP API makes, so lanes, limits and
validation are the HTTP API's own:

- :mod:`~heed.mcp.tools.banks`: ``list_banks``, ``create_bank``, the caller's tenant's
  banks; the resource ``heed://banks/{bank_id}``, a bank's profile and counts;
- :mod:`~heed.mcp.tools.memory`: ``recall``, ``retain``, ``reflect``;
- :mod:`~heed.mcp.tools.sessions`: ``start_turn``;
- :mod:`~heed.mcp.tools.mental_models`: ``list_mental_models``, ``get_mental_model``,
  ``create_mental_model``, ``refresh_mental_model``;
- :mod:`~heed.mcp.tools.directives`: ``list_directives``, ``create_directive``,
  ``update_directive``, ``delete_directive``;
- :mod:`~heed.mcp.tools.base`: what they share (:class:`~heed.mcp.tools.base.ToolGroup`,
  the argument types and limits).

A bank whose ``mcp_enabled_tools`` setting lists tools (:mod:`heed.memory.bank_config.settings`)
lets only those act on it: another tool naming the bank (or, for ``start_turn``, a session
bound to it) is a tool error naming the tool and the bank, before any work.

The rules are the domains', as over HTTP: a new session's bank must exist
(:meth:`SessionService.create <heed.sessions.service.SessionService.create>`), a reflect
needs a provider that can be built (:meth:`ReflectRuns.submit
<heed.reflect.runs.ReflectRuns.submit>`, and :class:`~heed.mental_models.service.MentalModels`
for a refresh), a mental model's and a directive's fields are checked by
:class:`~heed.mental_models.service.MentalModels` and
:class:`~heed.memory.directives.service.DirectiveService`; no tool checks them itself.
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

from heed.mcp.tools.banks import BankTools
from heed.mcp.tools.base import LIST_ITEMS, NAME_CHARS, TAG_CHARS, TEXT_CHARS, ToolGroup
from heed.mcp.tools.directives import DirectiveTools
from heed.mcp.tools.memory import MAX_RETAIN_ITEMS, MemoryTools
from heed.mcp.tools.mental_models import MentalModelTools
from heed.mcp.tools.sessions import SessionTools

__all__ = [
    "GROUPS",
    "LIST_ITEMS",
    "MAX_RETAIN_ITEMS",
    "NAME_CHARS",
    "TAG_CHARS",
    "TEXT_CHARS",
    "HeedTools",
]

#: The tool groups, in the order a client lists their tools.
GROUPS: tuple[type[ToolGroup], ...] = (
    BankTools,
    MemoryTools,
    SessionTools,
    MentalModelTools,
    DirectiveTools,
)


class HeedTools(ToolGroup):
    """Every tool and resource of one MCP server over *services*: each group of
    :data:`GROUPS`, built over the same services and stdio identity."""

    def register(self, server: MCPServer) -> None:
        for group in GROUPS:
            group(self.services, self.stdio_context).register(server)
