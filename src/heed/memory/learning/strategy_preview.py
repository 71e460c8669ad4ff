"""A draft ``consolidation_strategies`` value previewed against a bank's existing scopes.

``POST .../consolidation-strategies/preview`` answers, for a draft value (nothing is
saved), which of the bank's existing observation scopes (the distinct tag sets its
observations carry, :meth:`heed.memory.views.service.BankViews.observation_scopes`) each
strategy would apply to, and which fall to the default (the bank's ``observations_mission``).
The matching is consolidation's own (:func:`heed.memory.learning.scopes.claims`) with its
first-strategy-wins rule (:func:`heed.memory.learning.scopes.mission_for`), so the answer is
what the next consolidation does for the scopes that exist now:

- per strategy, aligned with the draft: ``active`` (it has a rule with tags, so it can claim
  a scope), ``claimed_count`` (the scopes it wins), and per rule the scopes it matches, how
  many of those an earlier strategy wins (``taken_count``), the observations across them, and
  up to ``sample_limit`` of them, most populous first;
- ``default``: the scopes no strategy claims, with their observations and samples.

The draft is checked with the setting's own rules
(:func:`heed.memory.bank_config.settings.check_value`: a 400 naming the problem, a field
heed does not implement included). The scan is bounded: the :data:`SCAN_LIMIT` most
populous scopes; ``complete`` is false when the bank has more, and the counts are then lower
bounds. A scope with no observation yet does not exist and is not counted. No LLM is called;
the matching runs in the offload, checking the request's token between strategies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from heed.memory.bank_config.settings import check_value
from heed.memory.learning.scopes import claims
from heed.memory.models import InvalidInput
from heed.runtime import raise_if_cancelled, run_in_thread

if TYPE_CHECKING:
    from heed.memory.views.service import BankViews

__all__ = [
    "SAMPLE_LIMIT_MAX",
    "SCAN_LIMIT",
    "DefaultPreview",
    "RulePreview",
    "ScopeSample",
    "StrategiesPreview",
    "StrategyPreview",
    "preview",
    "preview_strategies",
]

#: The most distinct scopes one preview scans (the most populous first).
SCAN_LIMIT: Final = 10_000
#: The most samples a preview shows per rule (and for the default).
SAMPLE_LIMIT_MAX: Final = 50


@dataclass(frozen=True, slots=True)
class ScopeSample:
    """One existing scope: its tags (sorted), its observations, and the position of the
    strategy that wins it (``None``: the default)."""

    tags: list[str]
    count: int
    handled_by: int | None


@dataclass(frozen=True, slots=True)
class RulePreview:
    """What one rule of a strategy matches among the existing scopes."""

    match_count: int
    taken_count: int
    observation_count: int
    samples: list[ScopeSample]


@dataclass(frozen=True, slots=True)
class StrategyPreview:
    """One strategy of the draft, at its position."""

    active: bool
    claimed_count: int
    rules: list[RulePreview]


@dataclass(frozen=True, slots=True)
class DefaultPreview:
    """The scopes no strategy claims: they use the bank's ``observations_mission``."""

    match_count: int
    observation_count: int
    samples: list[ScopeSample]


@dataclass(frozen=True, slots=True)
class StrategiesPreview:
    """The whole preview (see the module docstring)."""

    strategies: list[StrategyPreview]
    default: DefaultPreview
    scopes_scanned: int
    complete: bool


def preview(
    strategies: Sequence[Mapping[str, Any]],
    scopes: Sequence[tuple[Sequence[str], int]],
    sample_limit: int,
    *,
    complete: bool = True,
) -> StrategiesPreview:
    """The preview of checked *strategies* over *scopes* (``(tags, observations)``, most
    populous first). Pure but for the token's checkpoints (one per strategy)."""
    keys = [tuple(tags) for tags, _ in scopes]
    hits: list[list[list[int]]] = []
    for strategy in strategies:
        raise_if_cancelled()
        rules = strategy.get("scopes") or []
        hits.append([[k for k, key in enumerate(keys) if claims(key, rule)] for rule in rules])
    winners: list[int | None] = [None] * len(scopes)
    for position, rule_hits in enumerate(hits):
        for matched in rule_hits:
            for k in matched:
                if winners[k] is None:
                    winners[k] = position

    def sample(indices: list[int]) -> list[ScopeSample]:
        return [
            ScopeSample(list(scopes[k][0]), scopes[k][1], winners[k])
            for k in indices[:sample_limit]
        ]

    previews: list[StrategyPreview] = []
    for position, strategy in enumerate(strategies):
        rules = [
            RulePreview(
                match_count=len(matched),
                taken_count=sum(1 for k in matched if winners[k] != position),
                observation_count=sum(scopes[k][1] for k in matched),
                samples=sample(matched),
            )
            for matched in hits[position]
        ]
        usable = any(
            any(p for p in rule.get("tags") or []) for rule in strategy.get("scopes") or []
        )
        previews.append(
            StrategyPreview(
                active=usable,
                claimed_count=sum(1 for winner in winners if winner == position),
                rules=rules,
            )
        )
    unclaimed = [k for k, winner in enumerate(winners) if winner is None]
    return StrategiesPreview(
        strategies=previews,
        default=DefaultPreview(
            match_count=len(unclaimed),
            observation_count=sum(scopes[k][1] for k in unclaimed),
            samples=sample(unclaimed),
        ),
        scopes_scanned=len(scopes),
        complete=complete,
    )


async def preview_strategies(
    views: BankViews, bank_id: str, strategies: Any, sample_limit: int
) -> StrategiesPreview:
    """The preview of the draft *strategies* over the bank *bank_id*'s existing scopes (see
    the module docstring). Raises :class:`InvalidInput` (400) naming a bad draft or
    *sample_limit*, :class:`heed.memory.models.NotFound` for an unknown bank."""
    if not 0 <= sample_limit <= SAMPLE_LIMIT_MAX:
        raise InvalidInput(f"sample_limit must be 0 to {SAMPLE_LIMIT_MAX}, got {sample_limit}")
    checked = check_value("consolidation_strategies", strategies, "strategies")
    scopes, total = await views.observation_scopes(bank_id, SCAN_LIMIT, 0)
    return await run_in_thread(
        lambda: preview(checked, scopes, sample_limit, complete=total <= len(scopes))
    )
