"""Directives: a bank's standing rules, and the one place that decides which apply and how
they are said to a model.

A directive is a rule a bank's owner writes once ("Answer in French.", "Never give medical
advice.") with a ``name`` (a label for people), its ``content`` (the rule itself), a
``priority`` (higher comes first), ``is_active`` and ``tags``. Reflect
(:mod:`heed.reflect.agent`) and the chat turns of a bank-bound session
(:mod:`heed.sessions.turn`) both ask :func:`select` which rules apply and put
:func:`rules_text` into what they ask the model, so the two agents cannot drift.

**Which apply** (hindsight-client's semantics, ``ReflectRequest.apply_all_directives``):
only active directives; an untagged directive is global and always applies; a tagged one
applies only when the request's scope matches it:

- no request tags: a tagged directive does not apply (it needs a matching scope);
- ``any`` / ``any_strict``: the directive shares at least one tag with the request;
- ``all`` / ``all_strict``: the directive carries every tag of the request;
- ``exact``: the directive's tags are the request's tags;
- ``apply_all``: every active directive applies, whatever its tags.

A chat turn has no tags: its bank's global directives apply.

**Order**: priority, highest first; then the older directive first; then by id, so the
order never depends on how a database returned the rows.

**The prompt** (:func:`rules_text`): one short block, a numbered line per rule, the first
rules first. Only the content is said (the name is a label for people); prompts stay short
for the embedded model.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from heed.memory.models import TagsMatch

__all__ = [
    "MAX_CONTENT_CHARS",
    "MAX_DIRECTIVES",
    "RULES_HEADING",
    "Directive",
    "DirectivePatch",
    "DirectiveScope",
    "applies",
    "in_order",
    "rules_text",
    "select",
]

#: Directives one bank may hold (every one may reach every prompt).
MAX_DIRECTIVES: Final = 100
#: Longest directive content (a rule, not a document: it goes into every prompt).
MAX_CONTENT_CHARS: Final = 5_000
#: The line that opens the rules in a prompt (tests match on it).
RULES_HEADING: Final = "Rules you must follow in every answer (the first ones first):"


@dataclass(slots=True)
class Directive:
    """One directive of a bank (``bank_ref``: the bank's internal id)."""

    id: str
    bank_ref: str
    name: str
    content: str
    priority: int = 0
    is_active: bool = True
    tags: list[str] = field(default_factory=list)
    created_at: str = ""
    updated_at: str = ""


@dataclass(frozen=True, slots=True)
class DirectivePatch:
    """The fields of an update that were sent (``None``: keep; ``tags=[]`` clears them)."""

    name: str | None = None
    content: str | None = None
    priority: int | None = None
    is_active: bool | None = None
    tags: list[str] | None = None


@dataclass(frozen=True, slots=True)
class DirectiveScope:
    """The scope a request asks in: its tags and how they match (see the module
    docstring), or every active directive (``apply_all``)."""

    tags: Sequence[str] | None = None
    tags_match: TagsMatch = "any"
    apply_all: bool = False


def applies(directive: Directive, scope: DirectiveScope) -> bool:
    """Whether *directive*'s tags let it apply in *scope* (activity aside)."""
    if not directive.tags or scope.apply_all:
        return True
    wanted = set(scope.tags or ())
    if not wanted:
        return False
    have = set(directive.tags)
    if scope.tags_match == "exact":
        return have == wanted
    if scope.tags_match in ("any", "any_strict"):
        return bool(have & wanted)
    return wanted <= have


def in_order(directives: Iterable[Directive]) -> list[Directive]:
    """*directives* in the order they are said: priority (highest first), then the older
    first, then by id."""
    by_age = sorted(directives, key=lambda d: (d.created_at, d.id))
    return sorted(by_age, key=lambda d: -d.priority)


def select(
    directives: Iterable[Directive], scope: DirectiveScope, *, active_only: bool = True
) -> list[Directive]:
    """The directives that apply in *scope*, in order (only active ones unless
    *active_only* is false: a listing may show the inactive ones too)."""
    return in_order(d for d in directives if (d.is_active or not active_only) and applies(d, scope))


def rules_text(directives: Sequence[Directive]) -> str:
    """The block a prompt carries for *directives* (in the order given); ``""`` for none."""
    if not directives:
        return ""
    lines = [f"{i}. {' '.join(d.content.split())}" for i, d in enumerate(directives, 1)]
    return "\n".join([RULES_HEADING, *lines])
