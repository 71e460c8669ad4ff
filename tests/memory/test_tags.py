"""The tag filter (:mod:`heed.memory.tags`): the modes and the ``tags_match`` check (recall's
candidate filter calls :func:`~heed.memory.tags.tags_pass`; its own tests are recall's)."""

from __future__ import annotations

import pytest

from heed.memory.models import InvalidInput
from heed.memory.tags import TAGS_MATCH, check_tags_match, filters_by_tags, tags_pass

TAG_LISTS: list[list[str]] = [[], ["a"], ["b"], ["a", "b"], ["a", "c"], ["c"], ["a", "b", "c"]]


def test_the_modes() -> None:
    assert TAGS_MATCH == ("any", "all", "any_strict", "all_strict", "exact")
    assert tags_pass([], ["a"], "any") and tags_pass([], ["a"], "all")
    assert not tags_pass([], ["a"], "any_strict") and not tags_pass([], ["a"], "all_strict")
    assert tags_pass(["a", "c"], ["a", "b"], "any") and not tags_pass(["a", "c"], ["a", "b"], "all")
    assert tags_pass(["b", "a"], ["a", "b"], "exact") and not tags_pass(["a"], ["a", "b"], "exact")
    assert tags_pass([], None, "exact") and not tags_pass(["a"], [], "exact")
    for match in ("any", "all", "any_strict", "all_strict"):
        assert not filters_by_tags(None, match) and not filters_by_tags([], match)
        assert all(tags_pass(have, None, match) for have in TAG_LISTS)
    assert filters_by_tags(None, "exact") and filters_by_tags(["a"], "any")


def test_a_tags_match_outside_the_modes_is_refused_naming_the_field() -> None:
    assert check_tags_match(None) == "any"
    assert [check_tags_match(m) for m in TAGS_MATCH] == list(TAGS_MATCH)
    for bad in ("", "ANY", "any ", "some"):
        with pytest.raises(InvalidInput, match="tags_match must be one of any, all, any_strict"):
            check_tags_match(bad)
    with pytest.raises(InvalidInput, match=r"^trigger\.tags_match must be"):
        check_tags_match("x", "trigger.tags_match")
