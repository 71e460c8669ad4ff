"""The graph-link rule: which entity rows and links a document's new units get.

A unit names entities (given, its speaker, capitalized phrases). Writing a document, a
store creates the entities the bank does not know yet (first mention names it: see
:func:`first_mentions`), adds a membership row per (unit, entity), and links:

- ``entity``: each new unit to the latest :data:`ENTITY_LINKS_PER_ENTITY` units naming
  each of its entities (earlier units of the same document included), one weight per
  shared entity, both ways;
- ``temporal``: each new unit to the one before it in the write, both ways;
- ``source`` and ``causal``: an extracted fact to the units of the write it cites and to
  the facts that caused it (:mod:`heed.memory.learning.extraction`), both ways.

The rule is pure: the store reads what it needs from its database (each entity's id, and
each known entity's latest :data:`ENTITY_LINKS_PER_ENTITY` units) and :func:`plan_links`
does the rest in memory, so a write costs a statement for the entities and a few bulk
inserts, never a statement per (unit, entity) pair (:mod:`heed.storage.memory`, on
either database).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from heed.memory.entities import canonical
from heed.memory.models import PreparedUnit

__all__ = ["ENTITY_LINKS_PER_ENTITY", "Link", "first_mentions", "plan_links"]

#: Links to at most this many earlier units per shared entity, per new unit.
ENTITY_LINKS_PER_ENTITY: Final = 3

#: ``(from_seq, to_seq, link_type, weight)``
Link = tuple[int, int, str, float]


def first_mentions(units: Iterable[PreparedUnit]) -> dict[str, tuple[str, str | None]]:
    """Canonical name -> (name, type) of each entity's first mention in *units*."""
    first: dict[str, tuple[str, str | None]] = {}
    for unit in units:
        for entity in unit.entities:
            key = canonical(entity.name)
            if key and key not in first:
                first[key] = (entity.name, entity.type)
    return first


def plan_links(
    seqs: Sequence[int],
    units: Sequence[PreparedUnit],
    entity_ids: dict[str, str],
    recent: dict[str, list[int]],
) -> tuple[list[tuple[int, str]], list[Link]]:
    """The memberships ``(unit_seq, entity_id)`` and links of *units* (written as *seqs*).

    *entity_ids* maps every canonical name of :func:`first_mentions` to its entity id;
    *recent* holds, per entity id, its latest unit seqs in the bank before this write,
    newest first (at most :data:`ENTITY_LINKS_PER_ENTITY`); it is updated as the units are
    planned, so later units link to earlier ones of the same write.
    """
    memberships: list[tuple[int, str]] = []
    links: list[Link] = []
    previous: int | None = None
    for seq, unit in zip(seqs, units, strict=True):
        weights: dict[int, float] = {}
        for entity in unit.entities:
            key = canonical(entity.name)
            if not key:
                continue
            entity_id = entity_ids[key]
            latest = recent.setdefault(entity_id, [])
            if latest and latest[0] == seq:
                continue  # the unit names the entity twice
            for other in latest[:ENTITY_LINKS_PER_ENTITY]:
                weights[other] = weights.get(other, 0.0) + 1.0
            memberships.append((seq, entity_id))
            latest.insert(0, seq)
            del latest[ENTITY_LINKS_PER_ENTITY:]
        for other, weight in weights.items():
            links.append((seq, other, "entity", weight))
            links.append((other, seq, "entity", weight))
        if previous is not None:
            links.append((seq, previous, "temporal", 1.0))
            links.append((previous, seq, "temporal", 1.0))
        previous = seq
    links.extend(_provenance_links(seqs, units))
    return memberships, links


def _provenance_links(seqs: Sequence[int], units: Sequence[PreparedUnit]) -> list[Link]:
    """Links between an extracted fact and what it came from in the same write, both ways:
    ``source`` to each unit it cites, ``causal`` to each fact that caused it."""
    seq_of = {unit.id: seq for seq, unit in zip(seqs, units, strict=True)}
    links: list[Link] = []
    for seq, unit in zip(seqs, units, strict=True):
        for kind, ids in (("source", unit.source_ids), ("causal", unit.caused_by)):
            for other in (seq_of.get(i) for i in ids):
                if other is not None and other != seq:
                    links.append((seq, other, kind, 1.0))
                    links.append((other, seq, kind, 1.0))
    return links
