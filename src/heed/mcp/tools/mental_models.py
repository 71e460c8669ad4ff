"""The mental-model tools: ``list_mental_models``, ``get_mental_model``,
``create_mental_model``, ``refresh_mental_model``.

A model's refresh is a run (kind ``mental_model_refresh``, visible in ``/v1/runs``),
followed like a reflect: progress per stage and agent step, and a cancelled call cancels it
and ends once it stopped. A refresh asked while one of the model is busy follows the busy one
(``deduplicated``), which a cancel of this call leaves running: it is not this call's. A
model's fields are checked by :class:`~heed.mental_models.service.MentalModels`, and so is
the reflect provider a refresh needs.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from pydantic import BaseModel, ConfigDict, Field

from heed.mcp.calls import progress_reporter
from heed.mcp.tools.base import (
    BankId,
    Budget,
    Limit,
    Name,
    Offset,
    OnDisconnect,
    Tags,
    Text,
    ToolGroup,
)
from heed.memory.models import TagsMatch
from heed.mental_models.values import MentalModel
from heed.runs.model import Run

__all__ = [
    "ContentBudget",
    "MentalModelInfo",
    "MentalModelList",
    "MentalModelRefresh",
    "MentalModelTools",
    "ModelId",
    "Trigger",
]

ModelId = Annotated[str, Field(min_length=1, max_length=128, description="The mental model's id.")]
#: A mental model's content budget, as over HTTP (heed.api.wire.mental_models).
ContentBudget = Annotated[int, Field(ge=1, le=8192)]


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


class MentalModelTools(ToolGroup):
    """A bank's mental models."""

    tool_names = (
        "list_mental_models",
        "get_mental_model",
        "create_mental_model",
        "refresh_mental_model",
    )

    async def list_mental_models(
        self,
        bank_id: BankId,
        ctx: Context[Any],
        tags: Tags | None = None,
        tags_match: TagsMatch = "any",
        include_content: bool = False,
        exclude_knowledge_pages: bool = False,
        limit: Limit = 100,
        offset: Offset = 0,
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
