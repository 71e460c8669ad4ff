"""The one rule for filtering by tags: a request's ``tags`` matched per its ``tags_match``.

The memories list, mental models, the knowledge base and refresh triggers filter by
:func:`tags_pass`; the memory store's list applies it to the distinct tag lists a bank's
units hold, so no SQL restates it; recall's candidate filter calls it too. The modes, for
a thing carrying the tags *have* and a request asking for *wanted*:

- ``any``: shares a tag with *wanted*, or carries no tag at all;
- ``all``: carries every tag of *wanted*, or carries no tag at all;
- ``any_strict`` / ``all_strict``: as ``any`` / ``all``, but the untagged do not pass;
- ``exact``: carries exactly the set *wanted* (no tags: exactly the untagged).

A request without tags filters nothing, except under ``exact``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final, cast, get_args

from heed.memory.models import InvalidInput, TagsMatch

__all__ = ["TAGS_MATCH", "check_tags_match", "filters_by_tags", "tags_pass"]

#: Every ``tags_match`` mode, in the order the API lists them.
TAGS_MATCH: Final[tuple[str, ...]] = get_args(TagsMatch)


def filters_by_tags(wanted: Sequence[str] | None, match: str) -> bool:
    """Whether a filter of *wanted* tags matched per *match* can leave anything out."""
    return bool(wanted) or match == "exact"


def tags_pass(have: Iterable[str], wanted: Sequence[str] | None, match: str) -> bool:
    """Whether a thing carrying the tags *have* passes a filter of *wanted* tags matched per
    *match* (see the module docstring)."""
    if not filters_by_tags(wanted, match):
        return True
    want, tags = set(wanted or ()), set(have)
    if match == "exact":
        return tags == want
    if not tags:
        return match in ("any", "all")
    if match in ("any", "any_strict"):
        return bool(tags & want)
    return want <= tags


def check_tags_match(value: str | None, field: str = "tags_match") -> TagsMatch:
    """*value* as a ``tags_match`` mode (``None``: ``any``); an :class:`InvalidInput`
    naming *field* and the modes when it is none of them."""
    if value is None:
        return "any"
    if value in TAGS_MATCH:
        return cast(TagsMatch, value)
    raise InvalidInput(f"{field} must be one of {', '.join(TAGS_MATCH)}, not {value!r}")
