"""A mental model's trigger (:func:`heed.mental_models.values.merge_trigger`): every value
is checked in the domain, whatever its front end typed, since a trigger also arrives whole
in a bank archive. A value of the wrong type is a 400 naming the setting, never stored (a
string stored as ``exclude_mental_model_ids`` would exclude its characters) nor a 500."""

from __future__ import annotations

from typing import Any

import pytest

from heed.api.input_rules import MAX_LIST_ITEMS, MAX_TAG_CHARS
from heed.memory.models import InvalidInput
from heed.mental_models.values import (
    MAX_EXCLUDED_ID_CHARS,
    MAX_EXCLUDED_MODELS,
    default_trigger,
    merge_trigger,
)


def test_excluded_models_are_a_bounded_list_of_ids() -> None:
    ids = [f"model-{i}" for i in range(MAX_EXCLUDED_MODELS)]
    assert merge_trigger(None, {"exclude_mental_model_ids": ids})["exclude_mental_model_ids"] == ids
    assert merge_trigger(None, {"exclude_mental_model_ids": []})["exclude_mental_model_ids"] == []
    kept = merge_trigger(
        {**default_trigger(), "exclude_mental_model_ids": ["a"]}, {"budget": "low"}
    )
    assert kept["exclude_mental_model_ids"] == ["a"]
    # null puts it back to the default (none excluded)
    assert (
        merge_trigger(kept, {"exclude_mental_model_ids": None})["exclude_mental_model_ids"] is None
    )


@pytest.mark.parametrize(
    "value",
    [
        "model-1",  # a string: its characters would be excluded
        {"model-1": True},
        7,
        True,
        [1, 2],
        ["model-1", None],
        [["model-1"]],
        [""],
        ["x" * (MAX_EXCLUDED_ID_CHARS + 1)],
        [f"model-{i}" for i in range(MAX_EXCLUDED_MODELS + 1)],
    ],
)
def test_a_wrong_excluded_models_value_is_refused_naming_it(value: Any) -> None:
    with pytest.raises(InvalidInput, match=r"^trigger\.exclude_mental_model_ids must be a list"):
        merge_trigger(None, {"exclude_mental_model_ids": value})
    with pytest.raises(InvalidInput, match=r"^trigger\.exclude_mental_model_ids"):  # stored too
        merge_trigger({**default_trigger(), "exclude_mental_model_ids": value}, None)


@pytest.mark.parametrize("value", [7, "world", {"world": 1}])
def test_fact_types_that_are_not_a_list_are_refused_naming_them(value: Any) -> None:
    with pytest.raises(InvalidInput, match=r"^trigger\.fact_types"):
        merge_trigger(None, {"fact_types": value})


def test_the_bounds_are_the_api_s() -> None:
    """The HTTP and MCP models type the list with these bounds (TagList, Tags): a request
    within them is never refused by the domain."""
    assert (MAX_EXCLUDED_MODELS, MAX_EXCLUDED_ID_CHARS) == (MAX_LIST_ITEMS, MAX_TAG_CHARS)
