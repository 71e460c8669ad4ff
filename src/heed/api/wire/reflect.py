"""Wire models of ``POST /v1/default/banks/{bank_id}/reflect`` (hindsight-client compatible).

Fields heed does not implement are refused by name with a 400 when given a value:
``tag_groups`` (as recall refuses it) and the observation-search options
(:data:`NOT_IMPLEMENTED`). ``stream: true`` is heed's extension: the
answer comes as server-sent events (see :mod:`heed.api.routes.reflect`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from heed.api.input_rules import MAX_LIST_ITEMS, RequestBody, TagList, Text, TokenBudget
from heed.memory.models import InvalidInput

__all__ = [
    "NOT_IMPLEMENTED",
    "ReflectBasedOn",
    "ReflectFact",
    "ReflectInclude",
    "ReflectLLMCall",
    "ReflectRequest",
    "ReflectResponse",
    "ReflectToolCall",
    "ReflectTrace",
    "TokenUsage",
    "ToolCallOut",
    "ToolCallsInclude",
    "refuse_not_implemented",
]


class ToolCallsInclude(RequestBody):
    output: bool = True


class ReflectInclude(RequestBody):
    facts: Annotated[dict[str, Any], Field(max_length=MAX_LIST_ITEMS)] | None = None
    tool_calls: ToolCallsInclude | None = None


class ReflectRequest(RequestBody):
    query: Text
    budget: Literal["low", "mid", "high"] | None = None
    context: Text | None = None
    max_tokens: TokenBudget | None = 4096
    include: ReflectInclude | None = None
    response_schema: dict[str, Any] | None = None
    tags: TagList | None = None
    tags_match: Literal["any", "all", "any_strict", "all_strict", "exact"] | None = "any"
    tag_groups: Annotated[list[Any], Field(max_length=MAX_LIST_ITEMS)] | None = None
    fact_types: TagList | None = None
    apply_all_directives: bool | None = None
    exclude_mental_models: bool | None = None
    exclude_mental_model_ids: TagList | None = None
    stream: bool = False
    on_disconnect: Literal["cancel", "continue"] = "cancel"
    # Hindsight's options heed does not implement: refused by name when given a value.
    reflect_search_observations_max_tokens: int | None = None
    reflect_search_observations_include_entities: bool | None = None


#: Fields of :class:`ReflectRequest` heed refuses when given a value, and why.
NOT_IMPLEMENTED = {
    "reflect_search_observations_max_tokens": "heed's reflect has no observation search tool: "
    "observations come through recall (fact_types)",
    "reflect_search_observations_include_entities": "heed's reflect has no observation search "
    "tool: observations come through recall (fact_types)",
}


def refuse_not_implemented(body: ReflectRequest) -> None:
    """A 400 naming the first :data:`NOT_IMPLEMENTED` field *body* gives a value."""
    sent = body.model_dump(include=set(NOT_IMPLEMENTED), exclude_none=True)
    for name in sent:
        raise InvalidInput(f"{name} is not implemented by heed: {NOT_IMPLEMENTED[name]}")


class ReflectFact(BaseModel):
    id: str | None = None
    text: str
    type: str | None = None
    context: str | None = None
    occurred_start: str | None = None
    occurred_end: str | None = None
    mentioned_at: str | None = None
    document_id: str | None = None
    chunk_id: str | None = None
    tags: list[str] | None = None
    metadata: dict[str, str] | None = None


class ReflectBasedOn(BaseModel):
    memories: list[ReflectFact] = Field(default_factory=list)
    mental_models: list[dict[str, Any]] = Field(default_factory=list)
    directives: list[dict[str, Any]] = Field(default_factory=list)


class ToolCallOut(BaseModel):
    """A tool call of a reflect trace, as reflect's answer (:class:`ReflectToolCall`) and a
    mental model's dry run show it. Not an answer's model itself: the subclasses are, and a
    class's docstring is not inherited by their schemas."""

    tool: str
    input: dict[str, Any] | None = None
    output: dict[str, Any] | None = None
    duration_ms: int
    iteration: int = 0


class ReflectToolCall(ToolCallOut):
    input: dict[str, Any]


class ReflectLLMCall(BaseModel):
    scope: str
    duration_ms: int


class ReflectTrace(BaseModel):
    tool_calls: list[ReflectToolCall] = Field(default_factory=list)
    llm_calls: list[ReflectLLMCall] = Field(default_factory=list)


class TokenUsage(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0
    thoughts_tokens: int = 0


class ReflectResponse(BaseModel):
    text: str
    based_on: ReflectBasedOn | None = None
    structured_output: dict[str, Any] | None = None
    structured_output_error: str | None = None
    usage: TokenUsage | None = None
    trace: ReflectTrace | None = None
