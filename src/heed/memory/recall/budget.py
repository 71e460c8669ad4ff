"""How big a recall is: its candidates per retrieval arm and its candidates reranked, from
its ``budget``, its ``max_tokens`` and its bank's ``recall_budget_*`` settings
(:mod:`heed.memory.bank_config.settings`).

:func:`recall_size` is the one place that sizes a recall: the pipeline takes each arm's
``k`` and its rerank count from it, the recall lane the slot's cost
(:func:`heed.memory.recall.pipeline.slot_terms`), and ``trace: true`` reports it.

The two functions are Hindsight's (``_resolve_thinking_budget`` of its memory engine; the
"Recall budget mapping" of its configuration reference), where the number sized is "items
per retrieval method", heed's candidates per arm:

- ``fixed`` (the default): ``recall_budget_fixed_<budget>`` candidates per arm, whatever
  ``max_tokens`` is. heed's defaults are its own sizes (:data:`BUDGET_SIZES`: 40, 100 and
  300; Hindsight's are 100, 300 and 1000).
- ``adaptive``: ``round(max_tokens * recall_budget_adaptive_<budget>)`` candidates per arm,
  ``max_tokens`` being the recall's own, clamped to ``[recall_budget_min,
  recall_budget_max]`` (Hindsight's defaults: 0.025, 0.075 and 0.25; 20 and 2000): a recall
  that may return more text searches wider. A floor above the ceiling wins, as in
  Hindsight's clamp (``max(min, min(max, n))``); heed accepts such a pair, as it accepts
  every value its schema allows (Hindsight refuses it when one update holds both).

Where Hindsight says nothing, heed's rules:

- the candidates reranked follow the candidates per arm in the proportion of the budget's
  default size (30 of 40 for ``low``, 60 of 100 for ``mid``, 150 of 300 for ``high``),
  rounded up (so at least one); with no setting a recall is sized exactly as before;
- nothing a bank sets makes a recall unbounded: every setting is bounded when written
  (:data:`MAX_PER_ARM` candidates per arm at most), and the size is clamped here again
  (so at most 1,500 candidates reranked).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

from heed.memory.models import Budget

if TYPE_CHECKING:
    from heed.memory.bank_config.view import BankSettings

__all__ = [
    "ADAPTIVE_RATIOS",
    "BUDGET_FUNCTIONS",
    "BUDGET_SIZES",
    "MAX_PER_ARM",
    "MAX_TOKENS",
    "BudgetFunction",
    "RecallSize",
    "recall_size",
]

BudgetFunction = Literal["fixed", "adaptive"]
BUDGET_FUNCTIONS: Final[tuple[BudgetFunction, ...]] = ("fixed", "adaptive")

#: (candidates per arm, candidates reranked) per budget: the ``fixed`` function's defaults.
BUDGET_SIZES: Final[Mapping[Budget, tuple[int, int]]] = {
    "low": (40, 30),
    "mid": (100, 60),
    "high": (300, 150),
}
#: The ``adaptive`` function's defaults: the share of ``max_tokens`` per budget, and its
#: floor and ceiling (Hindsight's).
ADAPTIVE_RATIOS: Final[Mapping[Budget, float]] = {"low": 0.025, "mid": 0.075, "high": 0.25}
ADAPTIVE_MIN: Final = 20
ADAPTIVE_MAX: Final = 2000
#: Most candidates per arm any setting can ask for.
MAX_PER_ARM: Final = 2000
#: Most tokens a recall may return (the HTTP API's token budgets: 1..10^6).
MAX_TOKENS: Final = 1_000_000


@dataclass(frozen=True, slots=True)
class RecallSize:
    """How big one recall is: the function that sized it, its candidates per retrieval arm
    and its candidates reranked (both at least one)."""

    function: BudgetFunction
    per_arm: int
    reranked: int


def recall_size(settings: BankSettings, budget: Budget, max_tokens: int) -> RecallSize:
    """The size of a recall of *budget* returning at most *max_tokens* tokens, on a bank
    whose settings are *settings*. Pure; the rules are the module docstring's."""
    default_per_arm, default_reranked = BUDGET_SIZES[budget]
    function = settings.recall_budget_function
    if function == "adaptive":
        ratio: float = getattr(settings, f"recall_budget_adaptive_{budget}")
        wanted = round(min(max(max_tokens, 0), MAX_TOKENS) * ratio)
        per_arm = max(settings.recall_budget_min, min(settings.recall_budget_max, wanted))
    else:
        per_arm = getattr(settings, f"recall_budget_fixed_{budget}")
    per_arm = max(1, min(MAX_PER_ARM, per_arm))
    reranked = -(-per_arm * default_reranked // default_per_arm)  # rounded up: at least 1
    return RecallSize(function=function, per_arm=per_arm, reranked=reranked)
