"""The graph-link rule (:mod:`heed.memory.retain.links`), without a database: which entities a
write creates, which memberships and links its units get."""

from __future__ import annotations

import uuid

from heed.memory.models import EntityRef, PreparedUnit
from heed.memory.retain.links import ENTITY_LINKS_PER_ENTITY, first_mentions, plan_links


def _unit(*entities: str | tuple[str, str]) -> PreparedUnit:
    refs = [EntityRef(*e) if isinstance(e, tuple) else EntityRef(e) for e in entities]
    return PreparedUnit(
        id=str(uuid.uuid4()),
        text="x",
        index_text="x",
        fact_type="world",
        context=None,
        chunk_index=0,
        occurred_start=None,
        occurred_end=None,
        mentioned_at=None,
        metadata={},
        tags=[],
        entities=refs,
    )


def test_the_first_mention_names_an_entity() -> None:
    units = [_unit(("Alice Smith", "person")), _unit("ALICE SMITH", "Bob"), _unit("  ")]
    assert first_mentions(units) == {
        "alice smith": ("Alice Smith", "person"),
        "bob": ("Bob", None),
    }
    assert first_mentions([]) == {}


def test_consecutive_units_are_linked_both_ways() -> None:
    memberships, links = plan_links([10, 11, 12], [_unit(), _unit(), _unit()], {}, {})
    assert memberships == []
    assert links == [
        (11, 10, "temporal", 1.0),
        (10, 11, "temporal", 1.0),
        (12, 11, "temporal", 1.0),
        (11, 12, "temporal", 1.0),
    ]


def test_a_unit_links_to_the_latest_units_of_each_entity_it_names() -> None:
    ids = {"alice": "e-alice", "bob": "e-bob"}
    recent = {"e-alice": [7, 5, 3], "e-bob": [5]}  # the bank's latest, newest first
    memberships, links = plan_links([20], [_unit("Alice", "Bob")], ids, recent)
    assert memberships == [(20, "e-alice"), (20, "e-bob")]
    entity = {(a, b): w for a, b, t, w in links if t == "entity"}
    # one weight per shared entity: unit 5 names both
    assert entity == {
        (20, 7): 1.0,
        (7, 20): 1.0,
        (20, 5): 2.0,
        (5, 20): 2.0,
        (20, 3): 1.0,
        (3, 20): 1.0,
    }
    assert recent == {"e-alice": [20, 7, 5], "e-bob": [20, 5]}


def test_later_units_of_a_write_link_to_its_earlier_ones_and_only_the_latest() -> None:
    ids = {"kim": "e-kim"}
    n = ENTITY_LINKS_PER_ENTITY + 2
    seqs = list(range(100, 100 + n))
    memberships, links = plan_links(seqs, [_unit("Kim") for _ in seqs], ids, {})
    assert memberships == [(s, "e-kim") for s in seqs]
    last = seqs[-1]
    linked_from_last = sorted(b for a, b, t, _ in links if a == last and t == "entity")
    assert linked_from_last == seqs[-1 - ENTITY_LINKS_PER_ENTITY : -1]
    first_links = [(a, b) for a, b, t, _ in links if t == "entity" and seqs[0] in (a, b)]
    assert sorted(first_links) == sorted(
        [(seqs[0], s) for s in seqs[1 : 1 + ENTITY_LINKS_PER_ENTITY]]
        + [(s, seqs[0]) for s in seqs[1 : 1 + ENTITY_LINKS_PER_ENTITY]]
    )


def test_a_unit_naming_an_entity_twice_is_one_member() -> None:
    memberships, links = plan_links([1], [_unit("Ann", "ann")], {"ann": "e-ann"}, {})
    assert memberships == [(1, "e-ann")]
    assert links == []
