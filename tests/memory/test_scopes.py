"""Observation scopes and per-scope missions (:mod:`heed.memory.learning.scopes`), pure rules."""

from __future__ import annotations

import pytest

from heed.memory.bank_config.view import settings_of_config
from heed.memory.learning.scopes import mission_for, scope_rule, scopes_of

TAGS = ["user:a", "topic:x", "draft"]


def test_the_modes() -> None:
    assert scopes_of(TAGS, "combined") == [("draft", "topic:x", "user:a")]
    assert scopes_of([], "combined") == [()]
    assert scopes_of(TAGS, "shared") == [()]
    assert scopes_of(TAGS, "per_tag") == [("draft",), ("topic:x",), ("user:a",)]
    assert scopes_of([], "per_tag") == [()]
    with pytest.raises(ValueError, match="unknown observation scope mode"):
        scopes_of(TAGS, "everything")


def test_tag_lists_plain_tags_must_be_present_and_globs_pick() -> None:
    assert scopes_of(TAGS, [["user:a"]]) == [("user:a",)]
    assert scopes_of(TAGS, [["user:b"]]) == []  # a plain tag the fact lacks: skipped
    assert scopes_of(TAGS, [["user:*", "topic:*"]]) == [("topic:x", "user:a")]
    assert scopes_of(TAGS, [["team:*"]]) == []  # globs that pick nothing: skipped
    assert scopes_of(TAGS, [["draft", "user:*"], []]) == [("draft", "user:a"), ()]
    assert scopes_of(TAGS, [["user:a"], ["user:*"]]) == [("user:a",)]  # no repeats
    assert scopes_of([], [["user:*"], []]) == [()]


def test_the_rule_is_the_requests_then_the_banks_then_combined() -> None:
    bank = {"default_observation_scopes": "per_tag"}
    assert scope_rule([["a"]], settings_of_config(bank)) == [["a"]]
    assert scope_rule(None, settings_of_config(bank)) == "per_tag"
    assert scope_rule(None, settings_of_config({})) == "combined"


def test_missions_by_scope() -> None:
    config = {
        "observations_mission": "Track everything.",
        "consolidation_strategies": [
            {"scopes": [{"tags": []}], "observations_mission": "never: an empty rule"},
            {
                "scopes": [{"tags": ["user:*", "topic:*"]}],
                "observations_mission": "Track each user's view of a topic.",
            },
            {
                "scopes": [{"tags": ["user:*", "team:*"], "tags_match": "any"}],
                "observations_mission": "Track people.",
            },
        ],
    }
    assert (
        mission_for(("topic:x", "user:a"), settings_of_config(config))
        == "Track each user's view of a topic."
    )
    assert mission_for(("user:a",), settings_of_config(config)) == "Track people."
    assert mission_for(("topic:x",), settings_of_config(config)) == "Track everything."
    assert mission_for((), settings_of_config(config)) == "Track everything."
    assert mission_for(("user:a",), settings_of_config({})) is None
