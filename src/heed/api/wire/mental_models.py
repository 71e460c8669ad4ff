"""Wire models of mental models and the knowledge base (hindsight-client 1.1.0 compatible).

Routes: :mod:`heed.api.routes.mental_models` and :mod:`heed.api.routes.knowledge`. A
trigger is a patch: only the settings a request names are applied (``exclude_unset``), a
setting named with ``null`` goes back to its default, and a setting heed does not implement
is refused by name (:func:`heed.mental_models.values.merge_trigger`). ``refresh_after_retain``
is heed's extension: refresh after a retain into the bank.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from heed.api.input_rules import (
    JSON_INTEGER,
    MAX_LIST_ITEMS,
    Identifier,
    Name,
    RequestBody,
    TagList,
    Text,
)
from heed.api.wire.reflect import ReflectLLMCall, TokenUsage, ToolCallOut

__all__ = [
    "AsyncOperationSubmitResponse",
    "CreateFolderRequest",
    "CreateKnowledgePageResponse",
    "CreateMentalModelRequest",
    "CreateMentalModelResponse",
    "CreatePageRequest",
    "Detail",
    "KnowledgeBundleFile",
    "KnowledgeBundleResponse",
    "KnowledgeNodeOut",
    "KnowledgePageResponse",
    "KnowledgeSearchResponse",
    "KnowledgeSearchResult",
    "KnowledgeTreeResponse",
    "MentalModelHistoryEntry",
    "MentalModelListResponse",
    "MentalModelOut",
    "RefreshMentalModelRequest",
    "TriggerIn",
    "TriggerOut",
    "UpdateMentalModelRequest",
    "UpdateNodeRequest",
    "model_options",
    "options_patch",
]

Detail = Literal["metadata", "content", "full"]
ContentBudget = Annotated[int, Field(ge=1, le=8192), JSON_INTEGER]
Budget = Literal["low", "mid", "high"]
TagsMatch = Literal["any", "all", "any_strict", "all_strict", "exact"]
FactTypes = Annotated[list[Literal["world", "experience", "observation"]], Field(max_length=3)]
Loose = Annotated[list[Any], Field(max_length=MAX_LIST_ITEMS)]


class TriggerIn(RequestBody):
    """A mental model's trigger, as a patch (see the module docstring)."""

    budget: Budget | None = None
    mode: Literal["full", "delta"] | None = None
    refresh_after_consolidation: bool | None = None
    refresh_after_retain: bool | None = None
    min_refresh_interval_seconds: Annotated[int, Field(ge=0, le=10**9), JSON_INTEGER] | None = None
    fact_types: FactTypes | None = None
    exclude_mental_models: bool | None = None
    exclude_mental_model_ids: TagList | None = None
    tags_match: TagsMatch | None = None
    keep_trace: bool | None = None
    # Hindsight's settings heed does not implement: refused by name when given a value.
    refresh_cron: Text | None = None
    full_refresh_cron: Text | None = None
    tag_groups: Loose | None = None
    include_chunks: bool | None = None
    recall_max_tokens: int | None = None
    recall_chunks_max_tokens: int | None = None
    reflect_search_observations_max_tokens: int | None = None
    reflect_search_observations_include_entities: bool | None = None
    response_schema: dict[str, Any] | None = None

    def patch(self) -> dict[str, Any]:
        """The settings the request named."""
        return self.model_dump(exclude_unset=True)


def _trigger_patch(trigger: TriggerIn | None) -> dict[str, Any] | None:
    return trigger.patch() if trigger is not None else None


class TriggerOut(BaseModel):
    budget: Budget | None = None
    mode: str = "full"
    refresh_after_consolidation: bool = False
    refresh_after_retain: bool = False
    min_refresh_interval_seconds: int | None = None
    fact_types: list[str] | None = None
    exclude_mental_models: bool = False
    exclude_mental_model_ids: list[str] | None = None
    tags_match: TagsMatch | None = None
    keep_trace: bool = False


class CreateMentalModelRequest(RequestBody):
    id: Identifier | None = None
    name: Name
    source_query: Text
    tags: TagList | None = None
    max_tokens: ContentBudget | None = None
    trigger: TriggerIn | None = None


class UpdateMentalModelRequest(RequestBody):
    name: Name | None = None
    source_query: Text | None = None
    max_tokens: ContentBudget | None = None
    tags: TagList | None = None
    trigger: TriggerIn | None = None


class RefreshMentalModelRequest(RequestBody):
    mode: Literal["full"] | None = None


class CreateMentalModelResponse(BaseModel):
    mental_model_id: str
    operation_id: str


class AsyncOperationSubmitResponse(BaseModel):
    operation_id: str
    status: str
    #: heed's: a refresh of this model was busy; this is its operation.
    deduplicated: bool = False


class MentalModelOut(BaseModel):
    id: str
    bank_id: str
    name: str
    source_query: str | None = None
    content: str | None = None
    tags: list[str] = Field(default_factory=list)
    max_tokens: int | None = None
    trigger: TriggerOut | None = None
    last_refreshed_at: str | None = None
    last_memory_seen_at: str | None = None
    last_refresh_failed_at: str | None = None
    last_full_refreshed_at: str | None = None
    created_at: str | None = None
    is_knowledge_page: bool = False
    reflect_response: dict[str, Any] | None = None
    is_stale: bool = False


class MentalModelListResponse(BaseModel):
    items: list[MentalModelOut]
    total: int
    limit: int
    offset: int


class MentalModelHistoryEntry(BaseModel):
    version: int
    previous_content: str
    changed_at: str
    reason: str


class DryRunScope(BaseModel):
    tags: list[str] | None = None
    tags_match: str
    fact_types: list[str] | None = None
    exclude_mental_models: bool
    exclude_mental_model_ids: list[str] | None = None


class DryRunWindow(BaseModel):
    created_before: str
    created_after: str | None = None
    watermark: str | None = None


class DryRunFacts(BaseModel):
    retrieved: dict[str, int] = Field(default_factory=dict)
    used: dict[str, int] = Field(default_factory=dict)


# The dry run's trace holds reflect's calls (its tool call's ``input`` optional), under
# their own schema names (no docstrings: a model's docstring is its schema's description).
class DryRunToolCall(ToolCallOut):
    pass


class DryRunLLMCall(ReflectLLMCall):
    pass


class DryRunTrace(BaseModel):
    effective_mode: str
    outcome: str
    tool_calls: list[DryRunToolCall] = Field(default_factory=list)
    llm_calls: list[DryRunLLMCall] = Field(default_factory=list)
    usage: TokenUsage | None = None
    duration_ms: int = 0


class MentalModelDryRunResult(BaseModel):
    mental_model_id: str
    name: str
    requested_mode: str
    effective_mode: str
    outcome: str
    would_persist: bool
    scope: DryRunScope
    window: DryRunWindow
    facts: DryRunFacts
    based_on: dict[str, list[dict[str, Any]]] | None = None
    current_content: str
    candidate_content: str
    preview_content: str
    diff: str
    trace: DryRunTrace
    usage: TokenUsage | None = None
    duration_ms: int = 0
    warnings: list[str] | None = None


# -- knowledge base ----------------------------------------------------------------------


class CreateFolderRequest(RequestBody):
    name: Name
    parent_id: Identifier | None = None


class CreatePageRequest(RequestBody):
    name: Name
    source_query: Text
    parent_id: Identifier | None = None
    tags: TagList | None = None
    max_tokens: ContentBudget | None = None
    trigger: TriggerIn | None = None


class UpdateNodeRequest(RequestBody):
    """Each field applies only when present; ``parent_id: null`` moves the node to the
    root."""

    name: Name | None = None
    parent_id: Identifier | None = None
    source_query: Text | None = None
    tags: TagList | None = None
    max_tokens: ContentBudget | None = None
    trigger: TriggerIn | None = None


class KnowledgeNodeOut(BaseModel):
    id: str
    kind: Literal["folder", "page"]
    name: str
    parent_id: str | None = None
    mental_model_id: str | None = None
    managed: bool = False
    description: str | None = None
    tags: list[str] | None = None
    timestamp: str | None = None
    is_stale: bool | None = None
    last_refresh_failed_at: str | None = None
    trigger: TriggerOut | None = None
    children: list[KnowledgeNodeOut] | None = None


class KnowledgeTreeResponse(BaseModel):
    roots: list[KnowledgeNodeOut]


class CreateKnowledgePageResponse(BaseModel):
    page_id: str
    mental_model_id: str
    operation_id: str | None = None


class KnowledgePageResponse(BaseModel):
    id: str
    name: str
    type: str
    description: str | None = None
    tags: list[str] | None = None
    timestamp: str | None = None
    body: str | None = None
    markdown: str


class KnowledgeSearchResult(BaseModel):
    id: str
    name: str
    mental_model_id: str | None = None
    source_query: str | None = None
    snippet: str
    score: float
    updated_at: str | None = None


class KnowledgeSearchResponse(BaseModel):
    results: list[KnowledgeSearchResult]
    total: int


class KnowledgeBundleFile(BaseModel):
    path: str
    content: str


class KnowledgeBundleResponse(BaseModel):
    files: list[KnowledgeBundleFile]


KnowledgeNodeOut.model_rebuild()


def model_options(body: CreateMentalModelRequest | CreatePageRequest) -> dict[str, Any]:
    """The options a new mental model or knowledge-base page is created with, as keyword
    arguments: ``name``, ``source_query``, ``tags``, ``max_tokens`` and ``trigger`` (the
    trigger's patch, ``None`` when the request has none)."""
    return {
        "name": body.name,
        "source_query": body.source_query,
        "tags": body.tags,
        "max_tokens": body.max_tokens,
        "trigger": _trigger_patch(body.trigger),
    }


def options_patch(body: UpdateMentalModelRequest | UpdateNodeRequest) -> dict[str, Any]:
    """The fields an update request named (``exclude_unset``), its ``trigger`` as the
    trigger's own patch (:meth:`TriggerIn.patch`)."""
    patch = body.model_dump(exclude_unset=True, exclude={"trigger"})
    if body.trigger is not None:
        patch["trigger"] = body.trigger.patch()
    return patch
