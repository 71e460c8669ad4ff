"""The size of a recall (:func:`heed.memory.recall.budget.recall_size`): Hindsight's fixed
and adaptive functions over a bank's settings, heed's rerank proportion, the hard bounds,
and the recall lane's cost following the size."""

from __future__ import annotations

from typing import Any

import pytest

from heed.memory import InvalidInput
from heed.memory.bank_config.settings import SETTINGS, validate
from heed.memory.bank_config.view import settings_of_config
from heed.memory.models import Budget
from heed.memory.recall.budget import BUDGET_SIZES, MAX_PER_ARM, RecallSize, recall_size
from heed.memory.recall.pipeline import slot_terms

BUDGETS: tuple[Budget, ...] = ("low", "mid", "high")


def size(config: dict[str, Any], budget: Budget, max_tokens: int) -> RecallSize:
    """The size of a recall on a bank whose ``config`` map is *config*."""
    return recall_size(settings_of_config(config), budget, max_tokens)


@pytest.mark.parametrize("budget", BUDGETS)
def test_with_no_setting_a_recall_has_heeds_own_sizes(budget: Budget) -> None:
    per_arm, reranked = BUDGET_SIZES[budget]
    for max_tokens in (1, 4096, 1_000_000):  # the fixed function ignores max_tokens
        assert size({}, budget, max_tokens) == RecallSize("fixed", per_arm, reranked)


def test_the_settings_defaults_are_the_sizes_a_bank_without_them_gets() -> None:
    defaults = {name: s.default for name, s in SETTINGS.items() if name.startswith("recall_")}
    for budget in BUDGETS:
        assert size(defaults, budget, 4096) == size({}, budget, 4096)
    adaptive = {**defaults, "recall_budget_function": "adaptive"}
    assert size(adaptive, "mid", 4096) == size({"recall_budget_function": "adaptive"}, "mid", 4096)


def test_fixed_takes_the_budgets_number_and_reranks_in_the_default_proportion() -> None:
    config = {
        "recall_budget_fixed_low": 8,
        "recall_budget_fixed_mid": 500,
        "recall_budget_fixed_high": 2000,
    }
    assert size(config, "low", 4096) == RecallSize("fixed", 8, 6)  # 30 of 40
    assert size(config, "mid", 4096) == RecallSize("fixed", 500, 300)  # 60 of 100
    assert size(config, "high", 4096) == RecallSize("fixed", 2000, 1000)  # 150 of 300
    assert size({"recall_budget_fixed_mid": 1}, "mid", 4096).reranked == 1  # rounded up
    # An explicit "fixed" is the default function.
    assert size({**config, "recall_budget_function": "fixed"}, "low", 9) == (size(config, "low", 9))


def test_adaptive_is_a_share_of_max_tokens_clamped_to_min_and_max() -> None:
    adaptive = {"recall_budget_function": "adaptive"}
    # Hindsight's defaults: 0.025 / 0.075 / 0.25 of max_tokens, within [20, 2000].
    assert size(adaptive, "low", 4096) == RecallSize("adaptive", 102, 77)
    assert size(adaptive, "mid", 4096) == RecallSize("adaptive", 307, 185)
    assert size(adaptive, "high", 4096) == RecallSize("adaptive", 1024, 512)
    assert size(adaptive, "low", 100).per_arm == 20  # round(2.5) is below the floor
    assert size(adaptive, "high", 1_000_000).per_arm == 2000  # above the ceiling

    config = {
        **adaptive,
        "recall_budget_adaptive_mid": 0.5,
        "recall_budget_min": 10,
        "recall_budget_max": 300,
    }
    assert size(config, "mid", 200) == RecallSize("adaptive", 100, 60)
    assert size(config, "mid", 10).per_arm == 10  # floor
    assert size(config, "mid", 4096).per_arm == 300  # ceiling
    # A floor above the ceiling wins, as in Hindsight's clamp.
    assert size({**config, "recall_budget_min": 400}, "mid", 10).per_arm == 400
    # The fixed numbers do not apply to the adaptive function, and the reverse.
    assert size({**config, "recall_budget_fixed_mid": 5}, "mid", 200).per_arm == 100
    assert size({"recall_budget_adaptive_mid": 0.5}, "mid", 200).per_arm == 100  # fixed


def test_no_stored_value_makes_a_recall_unbounded_or_fail() -> None:
    huge = {
        "recall_budget_function": "adaptive",
        "recall_budget_adaptive_high": 1000.0,
        "recall_budget_min": 10**9,
        "recall_budget_max": 10**9,
    }
    assert size(huge, "high", 10**9) == RecallSize("adaptive", MAX_PER_ARM, 1000)
    assert size({"recall_budget_fixed_high": MAX_PER_ARM}, "high", 1).per_arm == MAX_PER_ARM
    # A value heed never stores (written around the settings' checks: of another type, or
    # out of bounds) counts as unset.
    odd: dict[str, Any] = {
        "recall_budget_function": "fastest",
        "recall_budget_fixed_mid": "many",
        "recall_budget_fixed_low": True,
        "recall_budget_fixed_high": float("nan"),
        "recall_budget_min": 10**9,
    }
    for budget in BUDGETS:
        assert size(odd, budget, 4096) == size({}, budget, 4096)
    assert size({"recall_budget_fixed_mid": -5}, "mid", 4096) == size({}, "mid", 4096)
    assert size({"recall_budget_fixed_low": 10**9}, "low", 1) == size({}, "low", 1)


def test_the_recall_lane_cost_follows_the_effective_size() -> None:
    low, mid, high = (size({}, budget, 4096) for budget in BUDGETS)
    assert [slot_terms(s) for s in (low, mid, high)] == [(1.0, False), (2.0, False), (5.0, True)]
    # A bank that makes its low recalls as big as a default high one makes them dear ...
    big_low = size({"recall_budget_fixed_low": 200}, "low", 4096)
    assert slot_terms(big_low) == (5.0, True)
    # ... and one that makes its high recalls small, cheap.
    small_high = size({"recall_budget_fixed_high": 60}, "high", 4096)
    assert slot_terms(small_high) == (1.0, False)
    cost, dear = slot_terms(size({"recall_budget_fixed_high": MAX_PER_ARM}, "high", 1))
    assert (cost, dear) == (1000 / 30, True)


@pytest.mark.parametrize(
    ("updates", "needle"),
    [
        ({"recall_budget_function": "fastest"}, "recall_budget_function"),
        ({"recall_budget_function": 1}, "recall_budget_function"),
        ({"recall_budget_fixed_low": -1}, "recall_budget_fixed_low"),
        ({"recall_budget_fixed_mid": 0}, "recall_budget_fixed_mid"),
        ({"recall_budget_fixed_high": MAX_PER_ARM + 1}, "recall_budget_fixed_high"),
        ({"recall_budget_fixed_high": "300"}, "recall_budget_fixed_high"),
        ({"recall_budget_fixed_high": 2.5}, "recall_budget_fixed_high"),
        ({"recall_budget_fixed_low": True}, "recall_budget_fixed_low"),
        ({"recall_budget_adaptive_low": 0}, "recall_budget_adaptive_low"),
        ({"recall_budget_adaptive_mid": -0.1}, "recall_budget_adaptive_mid"),
        ({"recall_budget_adaptive_high": "0.2"}, "recall_budget_adaptive_high"),
        ({"recall_budget_adaptive_high": False}, "recall_budget_adaptive_high"),
        ({"recall_budget_adaptive_high": float("inf")}, "recall_budget_adaptive_high"),
        ({"recall_budget_min": 0}, "recall_budget_min"),
        ({"recall_budget_max": MAX_PER_ARM + 1}, "recall_budget_max"),
        ({"recall_max_tokens": 0}, "recall_max_tokens"),
        ({"recall_max_tokens": "4096"}, "recall_max_tokens"),
        ({"recall_include_chunks": True}, "recall_include_chunks (in Hindsight"),
        ({"recall_chunks_max_tokens": 500}, "recall_chunks_max_tokens (in Hindsight"),
    ],
)
def test_a_bad_value_is_refused_naming_the_setting(updates: dict[str, Any], needle: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        validate(updates)
    assert needle in str(refused.value)


def test_good_values_are_stored_as_json() -> None:
    assert validate(
        {
            "recall_budget_function": "adaptive",
            "recall_budget_fixed_low": 3.0,  # JSON Schema's integer
            "recall_budget_adaptive_mid": 1,  # a number
            "recall_budget_min": 50,
            "recall_budget_max": 5,  # below the floor: accepted, the floor wins
            "HINDSIGHT_API_RECALL_MAX_TOKENS": 512,
            "recall_budget_fixed_high": None,  # back to the default
        }
    ) == {
        "recall_budget_function": "adaptive",
        "recall_budget_fixed_low": 3,
        "recall_budget_adaptive_mid": 1.0,
        "recall_budget_min": 50,
        "recall_budget_max": 5,
        "recall_max_tokens": 512,
        "recall_budget_fixed_high": None,
    }
