"""The memory tools: ``recall`` (hybrid recall, cancelled mid-stage by the client's
cancel), ``retain`` (one transaction per document, a progress notification per document) and
``reflect`` (a reflect **run**, visible in ``/v1/runs``, progress per agent step)."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import Context
from pydantic import BaseModel, Field

from heed.mcp.calls import progress_reporter
from heed.mcp.tools.base import (
    TEXT_CHARS,
    BankId,
    Budget,
    Name,
    Names,
    OnDisconnect,
    Text,
    ToolGroup,
    run_itself,
    run_text,
)
from heed.memory.dates import parse_timestamp
from heed.memory.engine import RetainSummary
from heed.memory.models import (
    FACT_TYPES,
    Bank,
    InvalidInput,
    RecallHit,
    RecallOutcome,
    RecallQuery,
    RetainItem,
)
from heed.reflect import ReflectRequest
from heed.reflect.result import ResultShape

__all__ = [
    "MAX_RETAIN_ITEMS",
    "Fact",
    "MemoryItem",
    "MemoryTools",
    "RecallResult",
    "ReflectAnswer",
    "RetainResult",
]

#: Items per retain call: the HTTP API's bound is its body size; an MCP call gets a count.
MAX_RETAIN_ITEMS = 1000


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


class ReflectAnswer(BaseModel):
    run_id: str
    text: str


class MemoryTools(ToolGroup):
    """A bank's memories: recall, retain, reflect."""

    tool_names = ("recall", "retain", "reflect")

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
        return RetainResult.model_validate(summary, from_attributes=True)

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
                run_itself,
                on_disconnect,
            )
            ended = await self._follow(run, report, on_disconnect)
        return ReflectAnswer(run_id=ended.id, text=run_text(ended))


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
