"""Mental models and the knowledge base: what they are, their rules, and how they are found.

A **mental model** is a named ``source_query`` of a bank whose answer heed writes (by a
reflect: :mod:`heed.mental_models`) and keeps fresh. It holds the answer (``content``), the
reflect's response it came from (``reflect_response``), its scope (``tags``, matched per
its trigger's ``tags_match``: ``all_strict`` when it has tags), a ``max_tokens`` budget and
its **trigger** (:func:`merge_trigger`): when it is refreshed besides by hand, how often at
most, and which reflect settings a refresh uses. Its earlier contents are kept, at most
:data:`HISTORY_LIMIT`, newest first.

The **knowledge base** is a tree of folders (:class:`KnowledgeFolder`) whose leaves are
**pages**: a page is a mental model with ``is_page`` set and a parent folder (or none, at
the root). A node's name is unique among its siblings.

This module holds the values and their pure rules (triggers, tag scopes). How models are
found for a query is :mod:`heed.mental_models.lookup`; the store protocol is
:class:`heed.mental_models.store.MentalModelStore`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from heed.memory.models import FACT_TYPES, InvalidInput
from heed.memory.tags import TAGS_MATCH, tags_pass

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "HISTORY_LIMIT",
    "MAX_EXCLUDED_ID_CHARS",
    "MAX_EXCLUDED_MODELS",
    "MAX_MENTAL_MODELS",
    "MAX_NODE_DEPTH",
    "REFUSED_TRIGGER_FIELDS",
    "HistoryEntry",
    "KnowledgeFolder",
    "MentalModel",
    "MentalModelRow",
    "default_trigger",
    "merge_trigger",
    "scope_of",
    "tags_pass",
]

#: Earlier contents a mental model keeps (the oldest is dropped past it).
HISTORY_LIMIT: Final = 20
#: Mental models (pages included) a bank may hold; knowledge-base folders likewise.
MAX_MENTAL_MODELS: Final = 1000
#: How deep the knowledge-base tree may nest.
MAX_NODE_DEPTH: Final = 32
#: A model's content budget when the request names none.
DEFAULT_MAX_TOKENS: Final = 2048

_BUDGETS: Final = ("low", "mid", "high")
#: Most mental models a trigger's ``exclude_mental_model_ids`` names, and the longest id in
#: it (the API's limits of a list of names: ``heed.api.input_rules.TagList``).
MAX_EXCLUDED_MODELS: Final = 64
MAX_EXCLUDED_ID_CHARS: Final = 256

#: Trigger settings hindsight-client may send that heed does not implement: refused by name
#: (400) when given a value, never silently ignored.
REFUSED_TRIGGER_FIELDS: Final = {
    "refresh_cron": "scheduled refreshes are not implemented; use refresh_after_consolidation,"
    " refresh_after_retain or POST .../refresh",
    "full_refresh_cron": "scheduled refreshes are not implemented",
    "tag_groups": "tag_groups is not supported by heed; use tags and tags_match",
    "include_chunks": "a refresh's recall options are not configurable in heed",
    "recall_max_tokens": "a refresh's recall options are not configurable in heed",
    "recall_chunks_max_tokens": "a refresh's recall options are not configurable in heed",
    "reflect_search_observations_max_tokens": "heed's reflect has no search_observations tool",
    "reflect_search_observations_include_entities": "heed's reflect has no search_observations"
    " tool",
    "response_schema": "a mental model's content is text; structured content is not implemented",
}


@dataclass(slots=True)
class MentalModel:
    """One mental model (or knowledge-base page) of a bank (see the module docstring).

    ``is_stale``: the bank was written to after the content was (read-only; the store
    computes it). ``embedding`` is only read where asked for."""

    bank_ref: str
    id: str
    name: str
    source_query: str
    content: str = ""
    tags: list[str] = field(default_factory=list)
    max_tokens: int = DEFAULT_MAX_TOKENS
    trigger: dict[str, Any] = field(default_factory=lambda: default_trigger())
    parent_id: str | None = None
    is_page: bool = False
    reflect_response: dict[str, Any] | None = None
    embedding: np.ndarray | None = None
    created_at: str = ""
    updated_at: str = ""
    last_refreshed_at: str | None = None
    last_refresh_failed_at: str | None = None
    is_stale: bool = False


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """An earlier content of a mental model: what it was, when it was replaced, and why
    (``refreshed``, ``cleared``)."""

    version: int
    previous_content: str
    changed_at: str
    reason: str


@dataclass(slots=True)
class MentalModelRow:
    """A mental model (or knowledge-base page) with its earlier contents, newest first:
    what a bank transfer carries of the bank's knowledge (the model's ``bank_ref`` is the
    bank's it is written into)."""

    model: MentalModel
    history: list[HistoryEntry] = field(default_factory=list)


@dataclass(slots=True)
class KnowledgeFolder:
    """A folder of the knowledge base; ``managed`` is the client's flag (system-owned)."""

    bank_ref: str
    id: str
    name: str
    parent_id: str | None = None
    managed: bool = False
    created_at: str = ""
    updated_at: str = ""


def default_trigger() -> dict[str, Any]:
    """A new model's trigger: refreshed by hand only, no minimum interval of its own, the
    reflect's defaults."""
    return {
        "mode": "full",
        "refresh_after_consolidation": False,
        "refresh_after_retain": False,
        "min_refresh_interval_seconds": None,
        "budget": None,
        "fact_types": None,
        "exclude_mental_models": False,
        "exclude_mental_model_ids": None,
        "tags_match": None,
        "keep_trace": False,
    }


def merge_trigger(stored: dict[str, Any] | None, patch: dict[str, Any] | None) -> dict[str, Any]:
    """*stored* (or the default) with the settings *patch* names: a key given ``None`` goes
    back to its default. Raises :class:`InvalidInput` naming a setting heed does not
    implement (:data:`REFUSED_TRIGGER_FIELDS`) or a bad value."""
    merged = {**default_trigger(), **(stored or {})}
    defaults = default_trigger()
    for key, value in (patch or {}).items():
        if key in REFUSED_TRIGGER_FIELDS:
            if value is not None:
                raise InvalidInput(f"trigger.{key}: {REFUSED_TRIGGER_FIELDS[key]}")
            continue
        if key not in defaults:
            raise InvalidInput(f"trigger.{key} is not a trigger setting heed knows")
        merged[key] = defaults[key] if value is None else value
    _check_trigger(merged)
    return merged


def _check_trigger(trigger: dict[str, Any]) -> None:
    """Refuse a merged trigger holding a bad value (:class:`InvalidInput` naming the
    setting): every front end types its fields, but a trigger also arrives whole in a bank
    archive, and a value of the wrong type stored here would misbehave at each refresh
    (a string's characters taken as the ids to exclude)."""
    if trigger["mode"] != "full":
        raise InvalidInput(
            f"trigger.mode {trigger['mode']!r} is not supported by heed: a refresh always"
            " rewrites the content in full (mode 'full')"
        )
    if trigger["budget"] is not None and trigger["budget"] not in _BUDGETS:
        raise InvalidInput(f"trigger.budget must be one of {', '.join(_BUDGETS)}")
    if trigger["tags_match"] is not None and trigger["tags_match"] not in TAGS_MATCH:
        raise InvalidInput(f"trigger.tags_match must be one of {', '.join(TAGS_MATCH)}")
    for key in ("refresh_after_consolidation", "refresh_after_retain"):
        if not isinstance(trigger[key], bool):
            raise InvalidInput(f"trigger.{key} must be true or false")
    for key in ("exclude_mental_models", "keep_trace"):
        if not isinstance(trigger[key], bool):
            raise InvalidInput(f"trigger.{key} must be true or false")
    interval = trigger["min_refresh_interval_seconds"]
    if interval is not None and (
        isinstance(interval, bool) or not isinstance(interval, int) or interval < 0
    ):
        raise InvalidInput("trigger.min_refresh_interval_seconds must be an integer >= 0")
    types = trigger["fact_types"]
    if types is not None:
        if not isinstance(types, list):
            raise InvalidInput(f"trigger.fact_types must be a list of {', '.join(FACT_TYPES)}")
        unknown = [t for t in types if t not in FACT_TYPES]
        if unknown:
            raise InvalidInput(
                f"trigger.fact_types: unknown fact type(s) {', '.join(map(repr, unknown))}"
            )
    excluded = trigger["exclude_mental_model_ids"]
    if excluded is not None and (
        not isinstance(excluded, list)
        or len(excluded) > MAX_EXCLUDED_MODELS
        or not all(isinstance(i, str) and 0 < len(i) <= MAX_EXCLUDED_ID_CHARS for i in excluded)
    ):
        raise InvalidInput(
            "trigger.exclude_mental_model_ids must be a list of at most "
            f"{MAX_EXCLUDED_MODELS} mental model ids (strings of 1-{MAX_EXCLUDED_ID_CHARS}"
            " characters)"
        )


def scope_of(model: MentalModel) -> tuple[list[str] | None, str]:
    """The tags a refresh of *model* recalls with and how they match: its tags, matched per
    its trigger's ``tags_match``, which is ``all_strict`` for a model with tags (a memory
    must carry every tag) and ``any`` without."""
    tags = list(model.tags) or None
    match = model.trigger.get("tags_match") or ("all_strict" if tags else "any")
    return tags, match
