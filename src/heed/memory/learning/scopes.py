"""Observation scopes: which facts consolidate together, and the mission each scope uses.

An observation lives in a **scope**, a set of tags: it is written with exactly those tags,
and it rests only on facts consolidated in that scope. A consolidation groups each round's
facts into scopes by a **scope rule** (:data:`ScopeRule`), the run's own
(``POST .../consolidate`` ``observation_scopes``), else the bank's
``default_observation_scopes``, else ``combined``:

- ``combined``: one scope per distinct tag set, the fact's own tags (an untagged fact is in
  the global scope ``()``);
- ``shared``: every fact in the global, untagged scope, whatever its tags;
- ``per_tag``: one scope per tag of the fact (an untagged fact: the global scope), so a fact
  tagged ``user:a`` and ``topic:x`` informs both the ``user:a`` and the ``topic:x``
  observations;
- a list of tag lists: one scope per inner list that applies to the fact. A plain tag must be
  among the fact's tags and is part of the scope; a glob (``*``, ``?``, ``[``: fnmatch) picks
  the fact's tags it matches into the scope, so ``[["user:*", "topic:*"]]`` scopes by the
  fact's user and topic tags and ignores the rest. An inner list that finds nothing to
  match (a missing plain tag, or globs that pick no tag) is skipped; ``[]`` is the global
  scope. A fact in no scope is marked consolidated without an observation.

**Per-scope missions** (the bank's ``consolidation_strategies``): each strategy lists tag
rules (``tags``: fnmatch patterns; ``tags_match``: ``all`` patterns must match a tag of the
scope, or ``any``) and the ``observations_mission`` used for the scopes it claims. The first
strategy with a matching rule claims a scope; a scope no strategy claims uses the bank's
``observations_mission``. A strategy rule with no tags claims nothing (a rule still being
written).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from heed.memory.bank_config.view import BankSettings

__all__ = [
    "SCOPE_MODES",
    "Scope",
    "ScopeRule",
    "claims",
    "mission_for",
    "scope_rule",
    "scopes_of",
]

#: A scope: its tags, sorted.
Scope = tuple[str, ...]
#: ``combined``, ``shared``, ``per_tag``, or a list of tag lists (see the module docstring).
ScopeRule = str | list[list[str]]
SCOPE_MODES: Final = ("combined", "shared", "per_tag")
_GLOB: Final = frozenset("*?[")


def _is_glob(tag: str) -> bool:
    return not _GLOB.isdisjoint(tag)


def scope_rule(given: ScopeRule | None, settings: BankSettings) -> ScopeRule:
    """The rule a consolidation uses: *given* (the request's), else the bank's
    ``default_observation_scopes`` (its own, else ``combined``)."""
    if given:
        return given
    return settings.default_observation_scopes or "combined"


def _inner_scope(tags: Sequence[str], inner: Sequence[str]) -> Scope | None:
    picked: set[str] = set()
    for entry in inner:
        if _is_glob(entry):
            picked.update(tag for tag in tags if fnmatchcase(tag, entry))
        elif entry in tags:
            picked.add(entry)
        else:
            return None  # a plain tag the fact does not have
    if inner and not picked:
        return None
    return tuple(sorted(picked))


def scopes_of(tags: Sequence[str], rule: ScopeRule) -> list[Scope]:
    """The scopes a fact with *tags* is consolidated in under *rule*, without repeats.
    Raises ``ValueError`` for a mode that is not one of :data:`SCOPE_MODES`."""
    if isinstance(rule, str):
        if rule == "combined":
            return [tuple(sorted(set(tags)))]
        if rule == "shared":
            return [()]
        if rule == "per_tag":
            return [(tag,) for tag in sorted(set(tags))] or [()]
        raise ValueError(f"unknown observation scope mode {rule!r}; one of {SCOPE_MODES}")
    found = (_inner_scope(tags, inner) for inner in rule)
    return list(dict.fromkeys(scope for scope in found if scope is not None))


def claims(scope: Scope, rule: Mapping[str, Any]) -> bool:
    """Whether one strategy *rule* (``tags``, ``tags_match``) claims *scope* (a rule with
    no tags claims nothing)."""
    patterns = [p for p in rule.get("tags") or [] if p]
    if not patterns:
        return False
    hits = [any(fnmatchcase(tag, pattern) for tag in scope) for pattern in patterns]
    return any(hits) if rule.get("tags_match") == "any" else all(hits)


def mission_for(scope: Scope, settings: BankSettings) -> str | None:
    """The observations mission of *scope*: the first of the bank's
    ``consolidation_strategies`` that claims it, else the bank's ``observations_mission``."""
    for strategy in settings.consolidation_strategies:
        if any(claims(scope, rule) for rule in strategy.get("scopes") or []):
            mission = strategy.get("observations_mission")
            if mission:
                return str(mission)
            break
    return settings.observations_mission or None
