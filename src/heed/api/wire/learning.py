"""The JSON of the learning routes, shaped like ``hindsight-client``'s models:
``ConsolidationStrategiesPreviewRequest`` / ``ConsolidationStrategiesPreview`` (a draft of
a bank's consolidation strategies previewed over its scopes), and the conversions from
:mod:`heed.memory.learning.strategy_preview`'s results."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field

from heed.api.input_rules import JSON_INTEGER, MAX_LIST_ITEMS, RequestBody
from heed.memory.learning.strategy_preview import (
    SAMPLE_LIMIT_MAX,
    ScopeSample,
    StrategiesPreview,
)

__all__ = [
    "ConsolidationStrategiesPreview",
    "ConsolidationStrategiesPreviewRequest",
    "strategies_preview",
]


class ConsolidationStrategiesPreviewRequest(RequestBody):
    """A draft ``consolidation_strategies`` value (checked as the setting is) and how many
    sample scopes to show per rule."""

    strategies: Annotated[list[Any], Field(max_length=MAX_LIST_ITEMS)]
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


def _samples(samples: list[ScopeSample]) -> list[StrategyScopePreview]:
    return [
        StrategyScopePreview(tags=s.tags, count=s.count, handled_by=s.handled_by) for s in samples
    ]


def strategies_preview(found: StrategiesPreview) -> ConsolidationStrategiesPreview:
    """The wire form of a preview."""
    return ConsolidationStrategiesPreview(
        strategies=[
            StrategyPreview(
                active=s.active,
                claimed_count=s.claimed_count,
                rules=[
                    StrategyRulePreview(
                        match_count=r.match_count,
                        taken_count=r.taken_count,
                        observation_count=r.observation_count,
                        samples=_samples(r.samples),
                    )
                    for r in s.rules
                ],
            )
            for s in found.strategies
        ],
        default=DefaultScopesPreview(
            match_count=found.default.match_count,
            observation_count=found.default.observation_count,
            samples=_samples(found.default.samples),
        ),
        scopes_scanned=found.scopes_scanned,
        complete=found.complete,
    )
