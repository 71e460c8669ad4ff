"""The memory store's reads for the bank views (:class:`heed.memory.store.BrowseStore`), on
both databases: entity counts (order, paging, tag filter, ``min_count``, one entity), entity
co-occurrence, links among units, tag lists (inline and shared in ``memory_values``, of
units or of mental models), a document's chunks and a tenant's chunk by id, and NUL (finds
nothing). Named here for the contract check of ``test_memory_store.py`` (which reads this
module's test names too)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from heed.memory.models import Bank
from heed.storage import SqlDatabase
from heed.storage.memory import SqlMemoryStore
from tests.storage.test_memory_store import DIM, _bank, _day, _doc, _unit

LONG = ["project:" + "x" * 80]
"""A tag list whose JSON is longer than a reference: stored once in ``memory_values``."""


@pytest.fixture
def store(sql_database: SqlDatabase) -> Iterator[SqlMemoryStore]:
    s = SqlMemoryStore(sql_database, DIM)
    s.migrate()
    yield s


def _fill(store: SqlMemoryStore) -> tuple[Bank, list[str]]:
    """A bank of four units (one document each); returns it and the units' ids in order."""
    bank = _bank(store)
    units = [
        _unit("Alice and Bob", "Alice", "Bob", when=_day(1), tags=["a"]),
        _unit("Alice alone", "Alice", when=_day(2), tags=LONG),
        _unit("Alice and Carol", "Alice", "Carol", when=_day(3), tags=LONG),
        _unit("Bob and Carol", "Bob", "Carol", when=_day(4)),
    ]
    for i, unit in enumerate(units):
        store.write_document(bank.ref, _doc([unit], f"doc-{i}"))
    return bank, [u.id for u in units]


def _names(store: SqlMemoryStore, bank: Bank) -> dict[str, str]:
    found, _ = store.entity_counts(bank.ref, None, "any", -1, 0)
    return {e.id: e.name for e in found}


def test_entity_counts_order_page_filter_and_one(store: SqlMemoryStore) -> None:
    bank, _ = _fill(store)
    found, total = store.entity_counts(bank.ref, None, "any", 10, 0)
    assert [(e.name, e.mention_count) for e in found] == [("Alice", 3), ("Bob", 2), ("Carol", 2)]
    assert total == 3
    alice = found[0]
    assert (alice.first_seen or "").startswith("2024-01-01")
    assert (alice.last_seen or "").startswith("2024-01-03")
    page, total = store.entity_counts(bank.ref, None, "any", 1, 1)
    assert [e.name for e in page] == ["Bob"] and total == 3
    assert store.entity_counts(bank.ref, None, "any", 0, 0) == ([], 3)
    shared, _ = store.entity_counts(bank.ref, LONG, "any_strict", 10, 0)
    assert [(e.name, e.mention_count) for e in shared] == [("Alice", 2), ("Carol", 1)]
    assert store.entity_counts(bank.ref, ["zzz"], "all_strict", 10, 0) == ([], 0)
    busy, total = store.entity_counts(bank.ref, None, "any", 10, 0, min_count=3)
    assert [e.name for e in busy] == ["Alice"] and total == 1
    one, total = store.entity_counts(bank.ref, None, "any", 10, 0, entity_id=alice.id)
    assert one == [alice] and total == 1
    assert store.entity_counts(bank.ref, None, "any", 10, 0, entity_id="x\x00") == ([], 0)
    assert store.entity_counts(bank.ref, ["a\x00"], "any", 10, 0) == ([], 0)
    other = _bank(store, "other")
    assert store.entity_counts(other.ref, None, "any", 10, 0) == ([], 0)


def test_entity_edges_count_units_naming_both(store: SqlMemoryStore) -> None:
    bank, _ = _fill(store)
    names = _names(store, bank)
    ids = list(names)
    edges = store.entity_edges(bank.ref, ids, None, "any")
    assert {(frozenset((names[e.source], names[e.target])), e.weight) for e in edges} == {
        (frozenset(("Alice", "Bob")), 1),
        (frozenset(("Alice", "Carol")), 1),
        (frozenset(("Bob", "Carol")), 1),
    }
    assert all(e.source < e.target and e.last_cooccurred for e in edges)
    tagged = store.entity_edges(bank.ref, ids, LONG, "any_strict")
    assert [frozenset((names[e.source], names[e.target])) for e in tagged] == [
        frozenset(("Alice", "Carol"))
    ]
    assert store.entity_edges(bank.ref, ids[:1], None, "any") == []
    assert store.entity_edges(bank.ref, [*ids, "x\x00"], None, "any") == edges


def test_unit_links_among_the_given_units(store: SqlMemoryStore) -> None:
    bank, ids = _fill(store)
    links = store.unit_links(bank.ref, ids)
    assert links, "units sharing entities are linked"
    assert all(link.source < link.target for link in links)
    assert all(link.source in ids and link.target in ids for link in links)
    pairs = {frozenset((link.source, link.target)) for link in links if link.link_type == "entity"}
    assert frozenset((ids[0], ids[1])) in pairs  # Alice
    assert len({(link.source, link.target, link.link_type) for link in links}) == len(links)
    assert store.unit_links(bank.ref, ids[:1]) == []
    only = store.unit_links(bank.ref, [ids[0], ids[1], "x\x00"])
    assert {frozenset((link.source, link.target)) for link in only} == {frozenset(ids[:2])}
    assert store.unit_links(_bank(store, "other").ref, ids) == []


def test_tag_lists_inline_shared_and_of_mental_models(store: SqlMemoryStore) -> None:
    bank, _ = _fill(store)
    lists = {row.tags: row.count for row in store.tag_lists(bank.ref, "memories")}
    assert lists == {("a",): 1, tuple(LONG): 2, (): 1}
    assert store.tag_lists(bank.ref, "memories", "observation") == []
    assert {r.tags: r.count for r in store.tag_lists(bank.ref, "memories", "world")} == lists
    assert store.tag_lists(bank.ref, "memories", "x\x00") == []
    assert store.tag_lists(bank.ref, "mental_models") == []
    with pytest.raises(ValueError, match="documents"):
        store.tag_lists(bank.ref, "documents")


def test_document_chunks_and_find_chunk(store: SqlMemoryStore) -> None:
    bank = _bank(store)
    units = [_unit("first", chunk=0), _unit("second", chunk=1), _unit("third", chunk=2)]
    store.write_document(bank.ref, _doc(units, "notes/a"))
    page = store.document_chunks(bank.ref, "notes/a", 10, 0)
    assert page is not None
    chunks, total = page
    assert [c.chunk_index for c in chunks] == [0, 1, 2] and total == 3
    assert [c.text for c in chunks] == ["chunk 0", "chunk 1", "chunk 2"]
    assert {(c.bank_id, c.document_id) for c in chunks} == {("b", "notes/a")}
    assert all(c.created_at for c in chunks)
    assert store.document_chunks(bank.ref, "notes/a", 1, 1) == ([chunks[1]], 3)
    assert store.document_chunks(bank.ref, "nope", 10, 0) is None
    assert store.document_chunks(bank.ref, "notes/a\x00", 10, 0) is None
    assert store.find_chunk("t", chunks[2].id) == chunks[2]
    assert store.find_chunk("another-tenant", chunks[2].id) is None
    assert store.find_chunk("t", "nope") is None
    assert store.find_chunk("t", chunks[2].id + "\x00") is None
    store.delete_document(bank.ref, "notes/a")
    assert store.find_chunk("t", chunks[0].id) is None
