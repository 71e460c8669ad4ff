"""heed's MCP tools and resources: memory banks and chat sessions for an agent.

Each tool is one :func:`heed.mcp.calls.tool_call` (identity from the HTTP request or
stdio, a token the client's cancel trips, heed errors as tool errors naming the
problem) around the same engine call the HTTP API makes, so lanes, limits and
validation are the HTTP API's own:

- ``list_banks``, ``create_bank``: the caller's tenant's banks;
- ``recall``: hybrid recall, cancelled mid-stage by the client's cancel;
- ``retain``: one transaction per document, a progress notification per document;
- ``reflect``: a reflect **run** (visible in ``/v1/runs``), progress per agent step;
- ``start_turn``: a chat turn (a run) in a session, new or existing; returns its text;
- ``list_mental_models``, ``get_mental_model``: a bank's mental models;
- ``create_mental_model``, ``refresh_mental_model``: a model's refresh is a run (kind
  ``mental_model_refresh``, visible in ``/v1/runs``), followed like a reflect: progress per
  stage and agent step, and a cancelled call cancels it and ends once it stopped. A refresh
  asked while one of the model is busy follows the busy one (``deduplicated``), which a
  cancel of this call leaves running: it is not this call's;
- ``list_directives``, ``create_directive``, ``update_directive``, ``delete_directive``: a
  bank's standing rules for reflect and chat turns.

Resources: ``heed://banks/{bank_id}``, a bank's profile and counts.

A bank whose ``mcp_enabled_tools`` setting lists tools (:mod:`heed.memory.bank_config.settings`)
lets only those act on it: another tool naming the bank (or, for ``start_turn``, a session
bound to it) is a tool error naming the tool and the bank, before any work.

The rules are the domains', as over HTTP: a new session's bank must exist
(:meth:`SessionService.create <heed.sessions.service.SessionService.create>`), a reflect
needs a provider that can be built (:meth:`ReflectRuns.submit
<heed.reflect.runs.ReflectRuns.submit>`, and :class:`~heed.mental_models.MentalModels` for a
refresh), a mental model's and a directive's fields are checked by
:class:`~heed.mental_models.MentalModels` and
:class:`~heed.memory.directives.service.DirectiveService`; no tool checks them itself.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict
from typing import Annotated, Any, Literal, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from pydantic import BaseModel, ConfigDict, Field

from heed.errors import HeedError
from heed.mcp.calls import (
    DisconnectPolicy,
    Progress,
    follow_run,
    identity_of,
    progress_reporter,
    start_run,
    tool_call,
)
from heed.memory.bank_config.settings import check_mcp_tool
from heed.memory.dates import parse_timestamp
from heed.memory.directives.rules import (
    MAX_CONTENT_CHARS,
    Directive,
    DirectivePatch,
    DirectiveScope,
)
from heed.memory.directives.service import PRIORITY_RANGE
from heed.memory.engine import RetainSummary
from heed.memory.mental_models import MentalModel
from heed.memory.models import (
    FACT_TYPES,
    Bank,
    InvalidInput,
    RecallHit,
    RecallOutcome,
    RecallQuery,
    RetainItem,
    TagsMatch,
)
from heed.reflect import ReflectRequest
from heed.reflect.result import ResultShape
from heed.runs.model import Run
from heed.runs.state import is_completed
from heed.runtime import RequestContext, use_context
from heed.services import Services

__all__ = ["HeedTools"]

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
#: The HTTP API's tag length (a test keeps it equal too).
TAG_CHARS = 256
Tags = Annotated[
    list[Annotated[str, Field(min_length=1, max_length=TAG_CHARS)]], Field(max_length=LIST_ITEMS)
]
ModelId = Annotated[str, Field(min_length=1, max_length=128, description="The mental model's id.")]
DirectiveId = Annotated[str, Field(min_length=1, max_length=128, description="The directive's id.")]
Priority = Annotated[int, Field(ge=PRIORITY_RANGE[0], le=PRIORITY_RANGE[1])]
RuleText = Annotated[str, Field(min_length=1, max_length=MAX_CONTENT_CHARS)]
#: A mental model's content budget, as over HTTP (heed.api.wire.mental_models).
ContentBudget = Annotated[int, Field(ge=1, le=8192)]


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


class Trigger(BaseModel):
    """When a mental model is refreshed besides by hand, and how (only the settings named
    change; ``null`` puts one back to its default)."""

    model_config = ConfigDict(extra="forbid")

    refresh_after_retain: bool | None = Field(
        default=None, description="Refresh after a retain into the bank touches its scope."
    )
    refresh_after_consolidation: bool | None = Field(
        default=None, description="Refresh after a consolidation touches its scope."
    )
    min_refresh_interval_seconds: Annotated[int, Field(ge=0, le=10**9)] | None = None
    budget: Budget | None = None
    fact_types: (
        Annotated[list[Literal["world", "experience", "observation"]], Field(max_length=3)] | None
    ) = None
    exclude_mental_models: bool | None = None
    exclude_mental_model_ids: Tags | None = None
    tags_match: TagsMatch | None = None
    keep_trace: bool | None = None


class MentalModelInfo(BaseModel):
    id: str
    name: str
    source_query: str
    tags: list[str]
    max_tokens: int
    content: str | None = None
    last_refreshed_at: str | None = None
    last_refresh_failed_at: str | None = None
    is_stale: bool = False
    is_knowledge_page: bool = False
    trigger: dict[str, Any] | None = None


class MentalModelList(BaseModel):
    mental_models: list[MentalModelInfo]
    total: int


class MentalModelRefresh(BaseModel):
    mental_model_id: str
    run_id: str
    outcome: str
    content: str
    deduplicated: bool = False


class DirectiveInfo(BaseModel):
    id: str
    name: str
    content: str
    priority: int
    is_active: bool
    tags: list[str]
    created_at: str
    updated_at: str


class DirectiveList(BaseModel):
    directives: list[DirectiveInfo]
    total: int


class Deleted(BaseModel):
    id: str
    deleted: bool = True


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
            self.list_mental_models,
            self.get_mental_model,
            self.create_mental_model,
            self.refresh_mental_model,
            self.list_directives,
            self.create_directive,
            self.update_directive,
            self.delete_directive,
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

    def _check(self, bank: Bank, tool: str) -> None:
        """Refuse *tool* on *bank* unless its ``mcp_enabled_tools`` let it act
        (:func:`heed.memory.bank_config.settings.check_mcp_tool`)."""
        enabled = self.services.memory.settings(bank).mcp_enabled_tools
        check_mcp_tool(bank.bank_id, enabled, tool)

    async def _bank(self, bank_id: str, tool: str) -> Bank:
        """The caller's bank *bank_id*, if its ``mcp_enabled_tools`` let *tool* act on it
        (:func:`heed.memory.bank_config.settings.check_mcp_tool`)."""
        bank = await self.services.memory.get_bank(bank_id)
        self._check(bank, tool)
        return bank

    async def _allowed(self, bank_id: str, tool: str) -> None:
        """Refuse *tool* on the caller's bank *bank_id* when its ``mcp_enabled_tools`` leave
        it out; a bank that does not exist is the domain's to refuse (in its words)."""
        bank = await self.services.memory.find_bank(bank_id)
        if bank is not None:
            self._check(bank, tool)

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
            wanted = RecallQuery(
                query=query, types=types or None, budget=budget, max_tokens=max_tokens, tags=tags
            )

            async def recall_in(bank: Bank) -> RecallOutcome:
                self._check(bank, "recall")
                return await engine.recall(bank, wanted)

            outcome = await engine.on_bank(bank_id, recall_in, found=lambda o: bool(o.hits))
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
            await self._bank(bank_id, "retain")
            retained = [_retain_item(i, item) for i, item in enumerate(items)]

            async def retain_in(bank: Bank) -> RetainSummary:
                self._check(bank, "retain")
                return await engine.retain(
                    bank,
                    retained,
                    document_tags,
                    progress=lambda done, total: report(
                        done, total, f"{done} of {total} documents"
                    ),
                )

            summary = await engine.on_bank(bank_id, retain_in)
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
            run = await self._start(
                self.services.reflect_runs.submit(  # checks the provider first
                    bank,
                    ReflectRequest(
                        query=query, budget=budget, context=context, max_tokens=max_tokens
                    ),
                    ResultShape(facts=False, trace=False),
                ),
                _itself,
                on_disconnect,
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
                run = await self._start(
                    sessions.start_turn(session_id, call.tenant, message), _itself, on_disconnect
                )
            except HeedError:
                if created:  # refused (the turn lane is full): leave no empty session behind
                    await sessions.delete(session_id, call.tenant)
                raise
            ended = await self._follow(run, report, on_disconnect)
        return TurnAnswer(session_id=session_id, run_id=ended.id, text=_text(ended))

    # -- mental models -----------------------------------------------------------------

    async def list_mental_models(
        self,
        bank_id: BankId,
        ctx: Context[Any],
        tags: Tags | None = None,
        tags_match: TagsMatch = "any",
        include_content: bool = False,
        exclude_knowledge_pages: bool = False,
        limit: Annotated[int, Field(ge=1, le=1000)] = 100,
        offset: Annotated[int, Field(ge=0)] = 0,
    ) -> MentalModelList:
        """List a bank's mental models (named questions whose answers heed writes and keeps
        fresh), oldest first; with include_content, their current answers too."""
        async with self._call(ctx):
            bank = await self._bank(bank_id, "list_mental_models")
            found, total = await self.services.mental_models.list_models(
                bank,
                tags=tags,
                tags_match=tags_match,
                exclude_pages=exclude_knowledge_pages,
                offset=offset,
                limit=limit,
            )
        return MentalModelList(
            mental_models=[_model(m, content=include_content) for m in found], total=total
        )

    async def get_mental_model(
        self, bank_id: BankId, mental_model_id: ModelId, ctx: Context[Any]
    ) -> MentalModelInfo:
        """One mental model of a bank: its question, its current answer (content), when it
        was last refreshed, whether the bank changed since (is_stale), and its trigger."""
        async with self._call(ctx):
            bank = await self._bank(bank_id, "get_mental_model")
            found = await self.services.mental_models.get(bank, mental_model_id)
        return _model(found, content=True, trigger=True)

    async def create_mental_model(
        self,
        bank_id: BankId,
        name: Annotated[Name, Field(min_length=1, description="A name for people.")],
        source_query: Annotated[
            Text, Field(min_length=1, description="The question whose answer the model holds.")
        ],
        ctx: Context[Any],
        mental_model_id: Annotated[
            str,
            Field(
                min_length=1,
                max_length=128,
                description="Its id (lowercase letters, digits and hyphens); default a new one.",
            ),
        ]
        | None = None,
        tags: Tags | None = None,
        max_tokens: ContentBudget | None = None,
        trigger: Trigger | None = None,
        on_disconnect: OnDisconnect = "cancel",
    ) -> MentalModelRefresh:
        """Create a mental model and write its first answer: a refresh run (heed's reflect
        agent answers source_query from the bank), reported as progress, its id in the first
        progress message and the result. Cancelling the call stops the refresh; the model
        stays, without content, to be refreshed later."""
        async with self._call(ctx), progress_reporter(ctx) as report:
            bank = await self._bank(bank_id, "create_mental_model")
            models = self.services.mental_models
            created, run = await self._start(
                models.create(  # checks the provider and the fields first
                    bank,
                    name=name,
                    source_query=source_query,
                    model_id=mental_model_id,
                    tags=tags,
                    max_tokens=max_tokens,
                    trigger=trigger.model_dump(exclude_unset=True) if trigger else None,
                ),
                lambda made: made[1],
                on_disconnect,
            )
            ended = await self._follow(run, report, on_disconnect)
            written = await models.get(bank, created.id)
        return _refreshed(written, ended, deduplicated=False)

    async def refresh_mental_model(
        self,
        bank_id: BankId,
        mental_model_id: ModelId,
        ctx: Context[Any],
        on_disconnect: OnDisconnect = "cancel",
    ) -> MentalModelRefresh:
        """Refresh a mental model now: a run (heed's reflect agent answers its question from
        the bank again) reported as progress, its id in the first progress message and the
        result; returns the new content. A refresh sooner than the model's minimum interval
        is an error saying when to retry. When a refresh of the model is already running,
        the call follows that one (deduplicated: true), and cancelling the call leaves it
        running, as it is not this call's."""
        async with self._call(ctx), progress_reporter(ctx) as report:
            bank = await self._bank(bank_id, "refresh_mental_model")
            models = self.services.mental_models
            run, joined = await self._start(
                models.refresh(bank, mental_model_id),
                lambda started: None if started[1] else started[0],
                on_disconnect,
            )
            ended = await self._follow(run, report, "continue" if joined else on_disconnect)
            written = await models.get(bank, mental_model_id)
        return _refreshed(written, ended, deduplicated=joined)

    # -- directives --------------------------------------------------------------------

    async def list_directives(
        self,
        bank_id: BankId,
        ctx: Context[Any],
        tags: Tags | None = None,
        tags_match: TagsMatch = "any",
        active_only: bool = True,
        limit: Annotated[int, Field(ge=1, le=1000)] = 100,
        offset: Annotated[int, Field(ge=0)] = 0,
    ) -> DirectiveList:
        """List a bank's directives (standing rules that reflect and the bank's chat turns
        follow) in the order they are applied, highest priority first; with tags, only those
        that apply in that scope (the untagged ones always do)."""
        async with self._call(ctx):
            await self._allowed(bank_id, "list_directives")
            found, total = await self.services.directives.list_directives(
                bank_id,
                DirectiveScope(tags, tags_match) if tags else None,
                active_only=active_only,
                limit=limit,
                offset=offset,
            )
        return DirectiveList(directives=[_directive(d) for d in found], total=total)

    async def create_directive(
        self,
        bank_id: BankId,
        name: Annotated[Name, Field(min_length=1, description="A label for people.")],
        content: Annotated[RuleText, Field(description="The rule, said to the model.")],
        ctx: Context[Any],
        priority: Annotated[Priority, Field(description="Higher comes first.")] = 0,
        is_active: bool = True,
        tags: Annotated[
            Tags | None,
            Field(description="Its scope: none, it always applies; else where a tag matches."),
        ] = None,
    ) -> DirectiveInfo:
        """Create a directive: a rule the bank's reflect and chat turns follow, such as
        "Answer in French."."""
        async with self._call(ctx):
            await self._allowed(bank_id, "create_directive")
            made = await self.services.directives.create(
                bank_id,
                name=name,
                content=content,
                priority=priority,
                is_active=is_active,
                tags=tags,
            )
        return _directive(made)

    async def update_directive(
        self,
        bank_id: BankId,
        directive_id: DirectiveId,
        ctx: Context[Any],
        name: Annotated[Name, Field(min_length=1)] | None = None,
        content: RuleText | None = None,
        priority: Priority | None = None,
        is_active: bool | None = None,
        tags: Tags | None = None,
    ) -> DirectiveInfo:
        """Change a directive's fields that are given (tags: [] clears its tags)."""
        async with self._call(ctx):
            await self._allowed(bank_id, "update_directive")
            changed = await self.services.directives.update(
                bank_id,
                directive_id,
                DirectivePatch(
                    name=name, content=content, priority=priority, is_active=is_active, tags=tags
                ),
            )
        return _directive(changed)

    async def delete_directive(
        self, bank_id: BankId, directive_id: DirectiveId, ctx: Context[Any]
    ) -> Deleted:
        """Delete a directive."""
        async with self._call(ctx):
            await self._allowed(bank_id, "delete_directive")
            await self.services.directives.delete(bank_id, directive_id)
        return Deleted(id=directive_id)

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


def _itself(run: Run) -> Run:
    return run


def _model(found: MentalModel, *, content: bool, trigger: bool = False) -> MentalModelInfo:
    return MentalModelInfo(
        id=found.id,
        name=found.name,
        source_query=found.source_query,
        tags=found.tags,
        max_tokens=found.max_tokens,
        content=found.content if content else None,
        last_refreshed_at=found.last_refreshed_at,
        last_refresh_failed_at=found.last_refresh_failed_at,
        is_stale=found.is_stale,
        is_knowledge_page=found.is_page,
        trigger=dict(found.trigger) if trigger else None,
    )


def _refreshed(found: MentalModel, ended: Run, *, deduplicated: bool) -> MentalModelRefresh:
    return MentalModelRefresh(
        mental_model_id=found.id,
        run_id=ended.id,
        outcome=str((ended.result or {}).get("outcome", "")),
        content=found.content,
        deduplicated=deduplicated,
    )


def _directive(found: Directive) -> DirectiveInfo:
    return DirectiveInfo(
        id=found.id,
        name=found.name,
        content=found.content,
        priority=found.priority,
        is_active=found.is_active,
        tags=found.tags,
        created_at=found.created_at,
        updated_at=found.updated_at,
    )


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
