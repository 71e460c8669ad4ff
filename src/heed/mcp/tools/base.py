"""What every MCP tool group shares: :class:`ToolGroup` (the services, a call's identity,
the bank check of ``mcp_enabled_tools``, starting and following runs, registration) and the
argument types and limits the HTTP API also has.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from heed.mcp.calls import (
    DisconnectPolicy,
    Progress,
    follow_run,
    identity_of,
    start_run,
    tool_call,
)
from heed.memory.bank_config.settings import check_mcp_tool
from heed.memory.models import Bank
from heed.runs.model import Run
from heed.runs.state import is_completed
from heed.runtime import RequestContext
from heed.services import Services

__all__ = [
    "LIST_ITEMS",
    "NAME_CHARS",
    "TAG_CHARS",
    "TEXT_CHARS",
    "BankId",
    "Budget",
    "Limit",
    "Name",
    "Names",
    "Offset",
    "OnDisconnect",
    "Tags",
    "Text",
    "ToolGroup",
    "run_itself",
    "run_text",
]

T = TypeVar("T")
Budget = Literal["low", "mid", "high"]
BankId = Annotated[str, Field(min_length=1, max_length=128, description="The bank's id.")]
OnDisconnect = Annotated[
    DisconnectPolicy,
    Field(
        description="What cancelling this call (or losing its connection) does to the run: "
        "'cancel' stops it at once; 'continue' lets it finish, to be read or cancelled by "
        "its id over HTTP (/v1/runs/{run_id})."
    ),
]
#: The HTTP API's length limits (heed.api.input_rules, which this layer cannot import; a
#: test keeps the two equal): a name, and any other free text.
NAME_CHARS = 500
TEXT_CHARS = 200_000
#: The HTTP API's count limit of a list of tags or names (and a test keeps it equal too).
LIST_ITEMS = 64
Name = Annotated[str, Field(max_length=NAME_CHARS)]
Text = Annotated[str, Field(max_length=TEXT_CHARS)]
Names = Annotated[list[Name], Field(max_length=LIST_ITEMS)]
#: The HTTP API's tag length (a test keeps it equal too).
TAG_CHARS = 256
Tags = Annotated[
    list[Annotated[str, Field(min_length=1, max_length=TAG_CHARS)]], Field(max_length=LIST_ITEMS)
]
#: A list tool's page: how many at the most, and how many to skip.
Limit = Annotated[int, Field(ge=1, le=1000)]
Offset = Annotated[int, Field(ge=0)]


class ToolGroup:
    """The tools of one resource over *services* (a subclass per resource, as the API's
    route modules): :meth:`tools` names them, :meth:`register` adds them to a server.

    *stdio_context* is the identity of calls that arrive without an HTTP request (``heed
    mcp``); over HTTP every call carries its own.
    """

    def __init__(self, services: Services, stdio_context: RequestContext | None = None) -> None:
        self.services = services
        self.stdio_context = stdio_context

    #: The names of this group's tool methods, in the order a client lists them.
    tool_names: ClassVar[tuple[str, ...]] = ()

    def tools(self) -> tuple[Callable[..., Awaitable[Any]], ...]:
        """This group's tools (:attr:`tool_names`), in the order a client lists them (a
        tool's name is its method's, its description its docstring)."""
        return tuple(getattr(self, name) for name in self.tool_names)

    def register(self, server: MCPServer) -> None:
        """Add :meth:`tools` (and any resource of the group) to *server*."""
        for tool in self.tools():
            server.add_tool(tool, description=inspect.cleandoc(tool.__doc__ or ""))

    def _call(self, ctx: Context[Any]) -> AbstractAsyncContextManager[RequestContext]:
        return tool_call(identity_of(ctx, self.stdio_context))

    def _check(self, bank: Bank, tool: str) -> None:
        """Refuse *tool* on *bank* unless its ``mcp_enabled_tools`` let it act
        (:func:`heed.memory.bank_config.settings.check_mcp_tool`)."""
        enabled = self.services.memory.settings(bank).mcp_enabled_tools
        check_mcp_tool(bank.bank_id, enabled, tool)

    async def _bank(self, bank_id: str, tool: str) -> Bank:
        """The caller's bank *bank_id*, if its ``mcp_enabled_tools`` let *tool* act on it."""
        bank = await self.services.memory.get_bank(bank_id)
        self._check(bank, tool)
        return bank

    async def _allowed(self, bank_id: str, tool: str) -> None:
        """Refuse *tool* on the caller's bank *bank_id* when its ``mcp_enabled_tools`` leave
        it out; a bank that does not exist is the domain's to refuse (in its words)."""
        bank = await self.services.memory.find_bank(bank_id)
        if bank is not None:
            self._check(bank, tool)

    # -- runs --------------------------------------------------------------------------

    async def _start(
        self,
        submit: Awaitable[T],
        run_of: Callable[[T], Run | None],
        on_disconnect: DisconnectPolicy,
    ) -> T:
        """:func:`heed.mcp.calls.start_run` on the services' run manager."""
        return await start_run(self.services.manager, submit, run_of, on_disconnect=on_disconnect)

    async def _follow(self, run: Run, report: Progress, on_disconnect: DisconnectPolicy) -> Run:
        """Follow *run* to its end; a run that did not complete is a tool error."""
        ended = await follow_run(
            self.services.manager,
            run.id,
            report,
            on_disconnect=on_disconnect,
            heartbeat=self.services.settings.stream_heartbeat_seconds,
        )
        if not is_completed(ended) or ended.result is None:
            why = ended.error or ended.cancel_reason or ended.phase
            raise ToolError(f"run {ended.id} ended {ended.phase}: {why}")
        return ended


def run_itself(run: Run) -> Run:
    """The run a submit returned (``run_of`` of :meth:`ToolGroup._start` for a plain run)."""
    return run


def run_text(run: Run) -> str:
    """The text of a completed run's result (empty when it has none)."""
    return str((run.result or {}).get("text", ""))
