"""What a consolidation reply does to a scope's observations, and how side-by-side rounds
never lose each other's changes.

A reply's actions (:data:`heed.memory.learning.consolidation.OBSERVATIONS_SCHEMA`) become
:class:`Action` s by :func:`plan_actions`: a creation, an update of one observation that
was shown to the model, or a merge of several into the first. An observation carries its
scope's tags, rests on the facts it cites plus those of what it replaces, and keeps its
earlier texts in its ``history`` (at most :data:`HISTORY_LIMIT` versions).

**Side by side.** A run consolidates several rounds at once (as many as its provider lets
background work have in flight), and rounds of one scope may be shown the same
observation. Each round notes :meth:`ObservationVersions.mark` before it reads the related
observations; its write (serialised by the run) goes through
:meth:`ObservationVersions.settle`: an update or merge of an observation another round
changed or removed since that mark is written as a **new** observation instead, and the
one it would have replaced is left as the other round wrote it. Nothing another round
wrote is ever overwritten from a stale read; the price is an occasional near-duplicate,
which a later round may merge. Rounds run one at a time never conflict.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from heed.memory.entities import extract_entities
from heed.memory.learning.scopes import Scope
from heed.memory.models import PreparedUnit, StoredUnit
from heed.memory.retain.units import index_text
from heed.memory.store import ObservationChanges

__all__ = [
    "HISTORY_LIMIT",
    "Action",
    "ObservationVersions",
    "Settled",
    "plan_actions",
]

#: Earlier versions an observation keeps.
HISTORY_LIMIT: Final = 20


@dataclass(slots=True)
class Action:
    """One observation a round writes: *unit*, replacing the observation *replaces* (an
    update or merge; ``None``: a creation) and removing *removes* (merged into it)."""

    unit: PreparedUnit
    replaces: str | None = None
    removes: list[str] = field(default_factory=list)


def plan_actions(
    reply: dict[str, Any], scope: Scope, facts: list[StoredUnit], related: list[StoredUnit]
) -> list[Action]:
    """The actions of *scope*'s round from the model's *reply*: actions naming no valid
    observation (an update or merge) are taken as creations; an observation named twice is
    changed by the first action only."""
    now = datetime.now(UTC)
    actions: list[Action] = []
    touched: set[str] = set()
    for action in reply.get("actions", []):
        cited = [facts[n] for n in action.get("facts", []) if 0 <= n < len(facts)]
        named = [
            related[n]
            for n in action.get("observations", [])
            if 0 <= n < len(related) and related[n].id not in touched
        ]
        text = str(action["text"]).strip()
        if action["action"] == "create" or not named:
            actions.append(Action(_observation(str(uuid.uuid4()), text, scope, cited, [], [], now)))
            continue
        survivor, others = named[0], named[1:] if action["action"] == "merge" else []
        history = [
            *survivor.history,
            _version(survivor.text, survivor.proof_count, now, "updated"),
            *(_version(o.text, o.proof_count, now, f"merged {o.id}") for o in others),
        ][-HISTORY_LIMIT:]
        earlier = [s for o in (survivor, *others) for s in o.source_ids]
        unit = _observation(survivor.id, text, scope, cited, earlier, history, now)
        actions.append(Action(unit, survivor.id, [o.id for o in others]))
        touched.update(o.id for o in (survivor, *others))
    return actions


@dataclass(frozen=True, slots=True)
class Settled:
    """A round's write once settled: the changes, the units to embed, and what it did."""

    changes: ObservationChanges
    fresh: list[PreparedUnit]
    created: int
    updated: int
    merged: int
    conflicts: int


class ObservationVersions:
    """Which observations the rounds of one run changed, and when (see the module
    docstring). Used from the run's event loop; :meth:`settle` and the write that follows
    must not interleave with another round's (the run holds a lock around both)."""

    def __init__(self) -> None:
        self._writes = 0
        self._changed: dict[str, int] = {}

    def mark(self) -> int:
        """The point a round's read starts from: how many writes the run has made."""
        return self._writes

    def settle(self, actions: list[Action], since: int, done: list[int]) -> Settled:
        """*actions*, read at *since*, as a write that overwrites nothing changed after it;
        *done* the seqs of the facts the round consolidated. Records the write's changes."""
        created: list[PreparedUnit] = []
        replaced: list[PreparedUnit] = []
        removed: list[str] = []
        updated = merged = conflicts = 0
        for action in actions:
            named = [] if action.replaces is None else [action.replaces, *action.removes]
            if any(self._changed.get(unit_id, 0) > since for unit_id in named):
                conflicts += 1
                action.unit.id = str(uuid.uuid4())
                action.unit.history = []
                created.append(action.unit)
            elif action.replaces is None:
                created.append(action.unit)
            else:
                replaced.append(action.unit)
                removed.extend(action.removes)
                merged += bool(action.removes)
                updated += not action.removes
        self._writes += 1
        for unit_id in [*(u.id for u in replaced), *removed]:
            self._changed[unit_id] = self._writes  # changed by the write numbered so
        changes = ObservationChanges(created=created, replaced=replaced, removed=removed, done=done)
        return Settled(changes, [*created, *replaced], len(created), updated, merged, conflicts)


def _version(text: str, proof_count: int | None, now: datetime, reason: str) -> dict[str, Any]:
    return {
        "text": text,
        "proof_count": proof_count,
        "changed_at": now.isoformat(),
        "reason": reason,
        "state": "invalidated",
    }


def _iso_date(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _observation(
    unit_id: str,
    text: str,
    scope: Scope,
    facts: list[StoredUnit],
    earlier_sources: list[str],
    history: list[dict[str, Any]],
    now: datetime,
) -> PreparedUnit:
    """An observation unit of *scope* resting on *facts* (and the sources of what it
    replaces)."""
    sources = list(dict.fromkeys([*earlier_sources, *(f.id for f in facts)]))
    starts = [d for d in (_iso_date(f.occurred_start) for f in facts) if d is not None]
    ends = [d for d in (_iso_date(f.occurred_end) for f in facts) if d is not None]
    mentioned = [d for d in (_iso_date(f.mentioned_at) for f in facts) if d is not None]
    return PreparedUnit(
        id=unit_id,
        text=text,
        index_text=index_text(text, None, None),
        fact_type="observation",
        context=None,
        chunk_index=0,
        occurred_start=min(starts) if starts else None,
        occurred_end=max(ends) if ends else (max(starts) if starts else None),
        mentioned_at=max(mentioned) if mentioned else now,
        metadata={},
        tags=list(scope),
        entities=extract_entities(text, [], None),
        source_ids=sources,
        proof_count=len(sources),
        history=history,
    )
