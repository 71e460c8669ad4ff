"""heed's MCP tools and resources: memory banks and chat sessions for an agent.

Each tool is one :func:`heed.mcp.calls.tool_call` (identity from the HTTP request or
stdio, a token the client's cancel trips, heed errors as tool errors naming the
problem) around the same engine call the HTTP API makes, so lanes, limits and
validation are the HTTP API's own:

- ``list_banks``, ``create_bank``: the caller's tenant's banks;
- ``recall``: hybrid recall, cancelled mid-stage by the client's cancel;
- ``retain``: one transaction per document, a progress notification per document;
- ``reflect``: a reflect **run** (visible in ``/v1/runs``), progress per agent step;
- ``start_turn``: a chat turn (a run) in a session, new or existing; returns its text.

Resources: ``heed://banks/{bank_id}``, a bank's profile and counts.

A bank whose ``mcp_enabled_tools`` setting lists tools (:mod:`heed.memory.bank_config`)
lets only those act on it: another tool naming the bank (or, for ``start_turn``, a session
bound to it) is a tool error naming the tool and the bank, before any work.

The rules are the domains', as over HTTP: a new session's bank must exist
(:meth:`SessionService.create <heed.sessions.service.SessionService.create>`), a reflect
needs a provider that can be built (:meth:`ReflectRuns.submit
<heed.reflect.runs.ReflectRuns.submit>`); no tool checks them itself.
"""

from __future__ import annotations

import inspect
import json
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from pydantic import BaseModel, Field

from heed.errors import HeedError
from heed.mcp.calls import (
    DisconnectPolicy,
    Progress,
    follow_run,
    identity_of,
    progress_reporter,
    tool_call,
)
from heed.memory.bank_config import check_mcp_tool
from heed.memory.dates import parse_timestamp
from heed.memory.models import (
    FACT_TYPES,
    Bank,
    InvalidInput,
    RecallHit,
    RecallQuery,
    RetainItem,
)
from heed.reflect import ReflectRequest
from heed.reflect.result import ResultShape
from heed.runs.model import Run
from heed.runs.state import is_completed
from heed.runtime import RequestContext, use_context
from heed.services import Services

__all__ = ["HeedTools"]

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
#: Items per retain call: the HTTP API's bound is its body size; an MCP call gets a count.
MAX_RETAIN_ITEMS = 1000
#: The HTTP API's length limits (heed.api.input_rules, which this layer cannot import; a
#: test keeps the two equal): a name, and any other free text.
NAME_CHARS = 500
TEXT_CHARS = 200_000
#: The HTTP API's count limit of a list of tags or names (and a test keeps it equal too).
LIST_ITEMS = 64
Name = Annotated[str, Field(max_length=NAME_CHARS)]
Text = Annotated[str, Field(max_length=TEXT_CHARS)]
Names = Annotated[list[Name], Field(max_length=LIST_ITEMS)]


class MemoryItem(BaseModel):
    """One item to retain."""

    content: str = Field(min_length=1, description="The text to remember.")
    context: Text | None = Field(default=None, description="Where the text comes from.")
    timestamp: str | None = Field(default=None, description="When it happened (ISO 8601).")
    document_id: Name | None = Field(default=None, description="Items with one id form a document.")
    tags: Names = Field(default_factory=list)


class Fact(BaseModel):
    id: str
    text: str
    type: str
    score: float
    occurred_start: str | None = None
    document_id: str | None = None


class RecallResult(BaseModel):
    results: list[Fact]


class RetainResult(BaseModel):
    items: int
    documents: int
    units: int
    document_ids: list[str]


class BankInfo(BaseModel):
    bank_id: str
    name: str
    mission: str
    units: int | None = None


class BankList(BaseModel):
    banks: list[BankInfo]
    total: int


class ReflectAnswer(BaseModel):
    run_id: str
    text: str


class TurnAnswer(BaseModel):
    session_id: str
    run_id: str
    text: str


class HeedTools:
    """The tools and resources of one MCP server over *services* (see the module docstring).

    *stdio_context* is the identity of calls that arrive without an HTTP request (``heed
    mcp``); over HTTP every call carries its own.
    """

    def __init__(self, services: Services, stdio_context: RequestContext | None = None) -> None:
        self.services = services
        self.stdio_context = stdio_context

    def register(self, server: MCPServer) -> None:
        for tool in (
            self.list_banks,
            self.create_bank,
            self.recall,
            self.retain,
            self.reflect,
            self.start_turn,
        ):
            server.add_tool(tool, description=inspect.cleandoc(tool.__doc__ or ""))
        server.resource(
            "heed://banks/{bank_id}",
            name="bank",
            description="A memory bank's profile and counts, as JSON.",
            mime_type="application/json",
        )(self.bank_resource)

    def _call(self, ctx: Context[Any]) -> AbstractAsyncContextManager[RequestContext]:
        return tool_call(identity_of(ctx, self.stdio_context))

    async def _bank(self, bank_id: str, tool: str) -> Bank:
        """The caller's bank *bank_id*, if its ``mcp_enabled_tools`` let *tool* act on it
        (:func:`heed.memory.bank_config.check_mcp_tool`)."""
        bank = await self.services.memory.get_bank(bank_id)
        check_mcp_tool(bank, tool)
        return bank

    async def _allowed(self, bank_id: str, tool: str) -> None:
        """Refuse *tool* on the caller's bank *bank_id* when its ``mcp_enabled_tools`` leave
        it out; a bank that does not exist is the domain's to refuse (in its words)."""
        bank = await self.services.memory.find_bank(bank_id)
        if bank is not None:
            check_mcp_tool(bank, tool)

    # -- banks -------------------------------------------------------------------------

    async def list_banks(
        self,
        ctx: Context[Any],
        limit: Annotated[int, Field(ge=1, le=1000)] = 100,
        offset: Annotated[int, Field(ge=0)] = 0,
    ) -> BankList:
        """List your memory banks with how many memories each holds."""
        async with self._call(ctx):
            rows, total = await self.services.memory.list_banks(limit, offset)
        return BankList(
            banks=[
                BankInfo(bank_id=b.bank_id, name=b.name, mission=b.mission, units=n)
                for b, n in rows
            ],
            total=total,
        )

    async def create_bank(
        self,
        bank_id: BankId,
        ctx: Context[Any],
        name: Name | None = None,
        mission: Text | None = None,
    ) -> BankInfo:
        """Create a memory bank (or update the name and mission of an existing one)."""
        async with self._call(ctx):
            await self._allowed(bank_id, "create_bank")
            bank = await self.services.memory.put_bank(bank_id, {"name": name, "mission": mission})
        return BankInfo(bank_id=bank.bank_id, name=bank.name, mission=bank.mission)

    async def bank_resource(self, bank_id: str, ctx: Context[Any]) -> str:
        """A bank's profile and counts."""
        try:
            with use_context(identity_of(ctx, self.stdio_context)):
                bank, stats = await self.services.memory.bank_stats(bank_id)
        except (HeedError, ToolError) as exc:
            raise ResourceError(str(exc)) from exc
        profile = {"bank_id": bank.bank_id, "name": bank.name, "mission": bank.mission}
        return json.dumps({**profile, "stats": asdict(stats)})

    # -- memory ------------------------------------------------------------------------

    async def recall(
        self,
        bank_id: BankId,
        query: Annotated[
            str, Field(min_length=1, max_length=TEXT_CHARS, description="What to look for.")
        ],
        ctx: Context[Any],
        budget: Budget = "mid",
        max_tokens: Annotated[int, Field(ge=1, le=65536)] = 4096,
        types: Names | None = None,
        tags: Names | None = None,
    ) -> RecallResult:
        """Recall the memories of a bank that best match a query (semantic, keyword,
        graph and temporal retrieval, reranked)."""
        async with self._call(ctx):
            if types:
                unknown = [t for t in types if t not in FACT_TYPES]
                if unknown:
                    raise InvalidInput(f"unknown fact type(s) {unknown}: use {list(FACT_TYPES)}")
            engine = self.services.memory
            bank = await self._bank(bank_id, "recall")
            outcome = await engine.recall(
                bank,
                RecallQuery(
                    query=query,
                    types=types or None,
                    budget=budget,
                    max_tokens=max_tokens,
                    tags=tags,
                ),
            )
        return RecallResult(results=[_fact(hit) for hit in outcome.hits])

    async def retain(
        self,
        bank_id: BankId,
        items: Annotated[list[MemoryItem], Field(min_length=1, max_length=MAX_RETAIN_ITEMS)],
        ctx: Context[Any],
        document_tags: Names | None = None,
    ) -> RetainResult:
        """Remember items in a bank: facts and entities are extracted and indexed. Reports
        progress per document when the call carries a progress token."""
        async with self._call(ctx), progress_reporter(ctx) as report:
            engine = self.services.memory
            bank = await self._bank(bank_id, "retain")
            summary = await engine.retain(
                bank,
                [_retain_item(i, item) for i, item in enumerate(items)],
                document_tags,
                progress=lambda done, total: report(done, total, f"{done} of {total} documents"),
            )
        return RetainResult(
            items=summary.items,
            documents=summary.documents,
            units=summary.units,
            document_ids=summary.document_ids,
        )

    async def reflect(
        self,
        bank_id: BankId,
        query: Annotated[
            str, Field(min_length=1, max_length=TEXT_CHARS, description="The question to answer.")
        ],
        ctx: Context[Any],
        budget: Budget = "low",
        context: Text | None = None,
        max_tokens: Annotated[int | None, Field(ge=1, le=65536)] = None,
        on_disconnect: OnDisconnect = "cancel",
    ) -> ReflectAnswer:
        """Answer a question from a bank's memories with heed's reflect agent (it recalls,
        reads and reasons in steps). Runs as a run, reported as progress; its id is in the
        first progress message and the result."""
        async with self._call(ctx), progress_reporter(ctx) as report:
            if not query.strip():
                raise InvalidInput("query is empty")
            bank = await self._bank(bank_id, "reflect")
            run = await self.services.reflect_runs.submit(  # checks the provider first
                bank,
                ReflectRequest(query=query, budget=budget, context=context, max_tokens=max_tokens),
                ResultShape(facts=False, trace=False),
            )
            ended = await self._follow(run, report, on_disconnect)
        return ReflectAnswer(run_id=ended.id, text=_text(ended))

    # -- sessions ----------------------------------------------------------------------

    async def start_turn(
        self,
        message: Annotated[str, Field(min_length=1, max_length=200_000)],
        ctx: Context[Any],
        session_id: Name | None = None,
        bank_id: Name | None = None,
        on_disconnect: OnDisconnect = "cancel",
    ) -> TurnAnswer:
        """Send a message to a chat session and return the assistant's answer. Without a
        session_id a new session is created (with bank_id, over that memory bank). A
        session busy with another turn is an error naming the busy run."""
        async with self._call(ctx) as call, progress_reporter(ctx) as report:
            sessions = self.services.sessions
            created = session_id is None
            bound = (
                bank_id
                if session_id is None
                else (await sessions.get(session_id, call.tenant)).bank_id
            )
            if bound is not None:
                await self._allowed(bound, "start_turn")
            if session_id is None:
                title = message.strip().splitlines()[0][:60] if message.strip() else ""
                session = await sessions.create(call.tenant, title=title, bank_id=bank_id)
                session_id = session.id
            try:
                run = await sessions.start_turn(session_id, call.tenant, message)
            except HeedError:
                if created:  # refused (the turn lane is full): leave no empty session behind
                    await sessions.delete(session_id, call.tenant)
                raise
            ended = await self._follow(run, report, on_disconnect)
        return TurnAnswer(session_id=session_id, run_id=ended.id, text=_text(ended))

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


def _text(run: Run) -> str:
    return str((run.result or {}).get("text", ""))


def _fact(hit: RecallHit) -> Fact:
    unit = hit.unit
    return Fact(
        id=unit.id,
        text=unit.text,
        type=unit.fact_type,
        score=round(hit.final, 6),
        occurred_start=unit.occurred_start,
        document_id=unit.document_id,
    )


def _retain_item(index: int, item: MemoryItem) -> RetainItem:
    timestamp = None
    if item.timestamp is not None:
        try:
            timestamp = parse_timestamp(item.timestamp)
        except (ValueError, OverflowError) as exc:
            raise InvalidInput(f"items[{index}].timestamp: {exc}") from None
    return RetainItem(
        content=item.content,
        timestamp=timestamp,
        context=item.context,
        document_id=item.document_id,
        tags=list(item.tags),
    )
