"""The JSON of the learning routes, shaped like ``hindsight-client``'s models:
``DryRunExtractRequest`` / ``DryRunExtractionResult`` (retain's extraction run on some
content, writing nothing), ``ConsolidationStrategiesPreviewRequest`` /
``ConsolidationStrategiesPreview`` (a draft of a bank's consolidation strategies previewed
over its scopes), and the conversions from :mod:`heed.memory.learning.dry_run`'s and
:mod:`heed.memory.learning.strategy_preview`'s results.

A field of Hindsight's dry-run request heed does not implement (:data:`DRY_RUN_REFUSED`)
is refused by name (400) when given a value other than ``null``, never ignored."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Final

from pydantic import BaseModel, Field

from heed.api.input_rules import (
    JSON_INTEGER,
    MAX_LIST_ITEMS,
    MAX_MESSAGES,
    RequestBody,
    Text,
)
from heed.api.wire.memory import Message
from heed.api.wire.memory_convert import content_text, timestamp_of
from heed.api.wire.reflect import TokenUsage
from heed.memory.learning.dry_run import DryRun
from heed.memory.learning.strategy_preview import (
    SAMPLE_LIMIT_MAX,
    StrategiesPreview,
)
from heed.memory.models import InvalidInput, RetainItem

__all__ = [
    "DRY_RUN_REFUSED",
    "ConsolidationStrategiesPreview",
    "ConsolidationStrategiesPreviewRequest",
    "DryRunExtractRequest",
    "DryRunExtractionResult",
    "dry_run_item",
    "dry_run_result",
    "strategies_preview",
]

#: The fields of Hindsight's dry-run request heed does not implement, with why.
DRY_RUN_REFUSED: Final = {
    "agent_name": "heed's extraction prompt names no agent",
    "strategy": "heed has no retain strategies",
    "retain_custom_instructions": "heed's retain chunks and extracts every document one way",
    "retain_extract_causal_links": "heed's extraction always states causes",
    "retain_chunk_size": "heed's retain chunks and extracts every document one way",
    "entity_labels": "heed has no entity labels",
    "entities_allow_free_form": "heed has no entity labels",
    "llm_output_language": "heed's extraction has no output-language setting",
}


class DryRunExtractRequest(RequestBody):
    """Content to extract facts from, and the per-request overrides heed implements; the
    fields of :data:`DRY_RUN_REFUSED` are taken as any JSON, to be refused by name."""

    content: str | Annotated[list[Message], Field(max_length=MAX_MESSAGES)]
    context: Text | None = ""
    timestamp: datetime | str | None = None
    retain_mission: Text | None = None
    retain_extraction_mode: str | None = None
    agent_name: Any = None
    strategy: Any = None
    retain_custom_instructions: Any = None
    retain_extract_causal_links: Any = None
    retain_chunk_size: Any = None
    entity_labels: Any = None
    entities_allow_free_form: Any = None
    llm_output_language: Any = None


def dry_run_item(body: DryRunExtractRequest) -> RetainItem:
    """The retain item a dry run extracts from; a 400 naming every refused field given a
    value, or a bad content block or timestamp."""
    given = [name for name in DRY_RUN_REFUSED if getattr(body, name) is not None]
    if given:
        named = "; ".join(f"{name} ({DRY_RUN_REFUSED[name]})" for name in given)
        raise InvalidInput(f"fields heed does not implement: {named}")
    timestamp, unset = timestamp_of(body.timestamp, "body")
    return RetainItem(
        content=content_text(body.content, "body"),
        timestamp=timestamp,
        timestamp_unset=unset,
        context=body.context or None,
    )


class ExtractedFact(BaseModel):
    text: str
    fact_type: str
    occurred_start: str | None = None
    occurred_end: str | None = None
    entities: list[str] = Field(default_factory=list)
    chunk_index: int | None = None
    attachments: list[Any] = Field(default_factory=list)


class ExtractionChunk(BaseModel):
    text: str
    fact_count: int


class DryRunExtractionResult(BaseModel):
    """Hindsight's result, with heed's ``failed_chunks`` (chunks whose reply stayed
    malformed)."""

    facts: list[ExtractedFact]
    chunks: list[ExtractionChunk]
    usage: TokenUsage
    failed_chunks: int = 0


def dry_run_result(found: DryRun) -> DryRunExtractionResult:
    """The wire form of a dry run."""
    return DryRunExtractionResult(
        facts=[ExtractedFact.model_validate(f, from_attributes=True) for f in found.facts],
        chunks=[ExtractionChunk.model_validate(c, from_attributes=True) for c in found.chunks],
        usage=TokenUsage(
            input_tokens=found.usage.prompt_tokens,
            output_tokens=found.usage.completion_tokens,
            total_tokens=found.usage.total_tokens,
        ),
        failed_chunks=found.failed_chunks,
    )


class ConsolidationStrategiesPreviewRequest(RequestBody):
    """A draft ``consolidation_strategies`` value (checked as the setting is) and how many
    sample scopes to show per rule."""

    strategies: Annotated[
        list[Annotated[dict[str, Any], Field(max_length=MAX_LIST_ITEMS)]],
        Field(max_length=MAX_LIST_ITEMS),
    ]
    sample_limit: Annotated[int, Field(ge=0, le=SAMPLE_LIMIT_MAX), JSON_INTEGER] = 5


class StrategyScopePreview(BaseModel):
    tags: list[str]
    count: int
    handled_by: int | None


class StrategyRulePreview(BaseModel):
    match_count: int
    taken_count: int
    observation_count: int
    samples: list[StrategyScopePreview]


class StrategyPreview(BaseModel):
    active: bool
    claimed_count: int
    rules: list[StrategyRulePreview]


class DefaultScopesPreview(BaseModel):
    match_count: int
    observation_count: int
    samples: list[StrategyScopePreview]


class ConsolidationStrategiesPreview(BaseModel):
    strategies: list[StrategyPreview]
    default: DefaultScopesPreview
    scopes_scanned: int
    complete: bool


def strategies_preview(found: StrategiesPreview) -> ConsolidationStrategiesPreview:
    """The wire form of a preview (its fields are the preview's, by name)."""
    return ConsolidationStrategiesPreview.model_validate(found, from_attributes=True)
