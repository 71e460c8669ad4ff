"""The memory store's contract (:class:`heed.memory.store.MemoryStore`), on both databases.

Every test runs once on SQLite and once on PostgreSQL (the ``sql_database`` fixture), against
the same expected answers: one store class, one set of rules (the module docstring of
:mod:`heed.memory.store`: ties, limits, NUL). The last test checks that every method of the
protocol is named by a test here. What only one database has (HNSW, keyword pruning,
cancelling a statement in the server, several writers) is in ``test_memory_postgres.py``.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from heed.errors import InvalidText
from heed.memory.models import Bank, Chunk, EntityRef, PreparedDocument, PreparedUnit, TagsMatch
from heed.memory.retain.idempotency import IdempotencyConflict, RetainKey
from heed.memory.store import BankGone, BankTaken, MemoryStore, UnitFilter, VectorSearchingStore
from heed.memory.tags import TAGS_MATCH, tags_pass
from heed.runtime import CancellationToken, OperationCancelled, RequestContext, use_context
from heed.storage import SqlDatabase, schema_version
from heed.storage.memory import SqlMemoryStore, memory_migrations
from heed.storage.memory.writes import WRITE_BATCH

DIM = 8


@pytest.fixture
def store(sql_database: SqlDatabase) -> Iterator[SqlMemoryStore]:
    s = SqlMemoryStore(sql_database, DIM)
    s.migrate()
    yield s


def _bank(store: SqlMemoryStore, bank_id: str = "b", tenant: str = "t") -> Bank:
    return store.save_bank(
        Bank(tenant=tenant, bank_id=bank_id, ref=str(uuid.uuid4()), name=bank_id)
    )


def _vector(i: int) -> np.ndarray:
    v = np.random.default_rng(i).standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def _unit(
    text: str,
    *entities: str,
    vector: np.ndarray | None = None,
    fact_type: str = "world",
    when: datetime | None = None,
    until: datetime | None = None,
    chunk: int = 0,
    tags: list[str] | None = None,
    metadata: dict[str, str] | None = None,
    context: str | None = None,
) -> PreparedUnit:
    return PreparedUnit(
        id=str(uuid.uuid4()),
        text=text,
        index_text=text,
        fact_type=fact_type,
        context=context,
        chunk_index=chunk,
        occurred_start=when,
        occurred_end=until or when,
        mentioned_at=when,
        metadata=metadata or {},
        tags=tags or [],
        entities=[EntityRef(e) for e in entities],
        embedding=vector,
        token_count=len(text.split()),
    )


def _doc(
    units: list[PreparedUnit], document_id: str | None = None, *, replace: bool = True
) -> PreparedDocument:
    chunks = sorted({u.chunk_index for u in units})
    return PreparedDocument(
        document_id=document_id or str(uuid.uuid4()),
        replace=replace,
        original_text="\n".join(u.text for u in units),
        metadata={"source": "test"},
        tags=["doc-tag"],
        chunks=[Chunk(str(uuid.uuid4()), i, f"chunk {i}") for i in chunks],
        units=units,
    )


def _write(
    store: SqlMemoryStore, bank: Bank, *units: PreparedUnit, doc: str | None = None
) -> list[int]:
    return [seq for seq, _ in store.write_document(bank.ref, _doc(list(units), doc)).added]


def _count(store: SqlMemoryStore, table: str, where: str = "") -> int:
    with store.db.read() as conn:
        return int(conn.execute(f"SELECT COUNT(*) FROM {table} {where}").fetchone()[0])


def _day(n: int) -> datetime:
    return datetime(2024, 1, n, tzinfo=UTC)


# -- schema and banks ----------------------------------------------------------------------


def test_migrate_is_idempotent(store: SqlMemoryStore, sql_database: SqlDatabase) -> None:
    store.migrate()
    assert schema_version(sql_database, "memory") == memory_migrations()[-1].version
    assert store.searches_vectors is (sql_database.dialect == "postgresql")


def test_save_bank_get_bank_and_list_banks(store: SqlMemoryStore) -> None:
    one, two = _bank(store, "one"), _bank(store, "two")
    _bank(store, "one", tenant="u")
    assert one.created_at and one.created_at == one.updated_at
    one.mission = "remember pets"
    one.config["enable_reranking"] = False
    saved = store.save_bank(one)
    got = store.get_bank("t", "one")
    assert got is not None and got.mission == "remember pets" and got.ref == one.ref
    assert got.config == {"enable_reranking": False} and got.created_at == saved.created_at
    assert store.get_bank("t", "nope") is None
    assert store.get_bank("t", "one\x00") is None  # NUL in a key finds nothing
    _write(store, two, _unit("a"), _unit("b"))
    banks, total = store.list_banks("t", 10, 0)
    assert total == 2 and [(b.bank_id, n) for b, n in banks] == [("one", 0), ("two", 2)]
    assert [b.bank_id for b, _ in store.list_banks("t", 1, 1)[0]] == ["two"]
    assert [b.bank_id for b, _ in store.list_banks("t", -1, -5)[0]] == ["one", "two"]
    assert store.list_banks("t", 0, 0) == ([], 2)
    assert store.list_banks("t\x00", 10, 0) == ([], 0)
    with pytest.raises(BankTaken):
        store.save_bank(Bank(tenant="t", bank_id="one", ref=str(uuid.uuid4())))
    store.delete_bank(two.ref)
    with pytest.raises(BankGone):
        store.save_bank(two)  # read before, deleted since
    with pytest.raises(InvalidText, match="mission"):
        store.save_bank(Bank(tenant="t", bank_id="n", ref="r", mission="m\x00"))


def test_delete_bank_leaves_other_banks_alone(store: SqlMemoryStore) -> None:
    one, two = _bank(store, "one"), _bank(store, "two")
    for bank in (one, two):
        doc = _doc([_unit(f"{bank.bank_id} fact {i}", "Ann", tags=["t" * 80]) for i in range(3)])
        store.write_document(bank.ref, doc, (RetainKey("k", "fp"), 0))
    assert store.delete_bank(one.ref) == 3
    assert store.get_bank("t", "one") is None
    assert store.delete_bank(one.ref) == 0  # already gone
    stats = store.bank_stats(two.ref)
    assert stats.units_by_type == {"world": 3} and stats.documents == 1
    assert len(store.retain_ledger(two.ref, "k")) == 1
    for table, left in {
        "memory_units": 3,
        "memory_entities": 1,
        "memory_unit_entities": 3,
        "memory_links": 10,
        "memory_chunks": 1,
        "memory_documents": 1,
        "memory_retain_ledger": 1,
        "memory_values": 1,
        "memory_banks": 1,
    }.items():
        assert _count(store, table) == left, table


def test_bank_stats_and_bank_generation(store: SqlMemoryStore) -> None:
    bank = _bank(store)
    assert store.bank_generation(bank.ref) == 0
    assert store.bank_generation(str(uuid.uuid4())) is None
    empty = store.bank_stats(bank.ref)
    assert (empty.units_by_type, empty.links_by_type, empty.documents) == ({}, {}, 0)
    result = store.write_document(
        bank.ref,
        _doc([_unit("a", "Ann"), _unit("b", "Ann", fact_type="experience"), _unit("c")]),
    )
    assert result.generation == store.bank_generation(bank.ref) == 1
    stats = store.bank_stats(bank.ref)
    assert stats.units_by_type == {"world": 2, "experience": 1}
    assert stats.links_by_type == {"entity": 2, "temporal": 4}
    assert stats.documents == 1 and stats.last_write_at is not None
    deleted = store.delete_unit(bank.ref, result.added[2][1])
    assert deleted is not None and deleted.generation == store.bank_generation(bank.ref) == 2


def test_units_per_time_prefix_groups_by_time_and_fact_type(store: SqlMemoryStore) -> None:
    bank, other = _bank(store), _bank(store, "other")
    then = datetime(2026, 3, 4, 5, 6, tzinfo=UTC)
    store.write_document(
        bank.ref,
        _doc(
            [
                _unit("a", when=then),
                _unit("b", when=then + timedelta(minutes=1)),
                _unit("c", fact_type="experience", when=then + timedelta(days=1)),
                _unit("d"),  # no event time: its created_at stands in
            ]
        ),
    )
    store.write_document(other.ref, _doc([_unit("e", when=then)]))
    today = datetime.now(UTC).isoformat()[:10]
    by_day = store.units_per_time_prefix(
        bank.ref, time_field="mentioned_at", chars=10, since="2026-01-01"
    )
    assert sorted(by_day) == sorted(
        [
            ("2026-03-04", "world", 2),
            ("2026-03-05", "experience", 1),
            (today, "world", 1),
        ]
    )
    by_minute = store.units_per_time_prefix(
        bank.ref, time_field="occurred_start", chars=16, since="2026-03-04T05:07"
    )
    assert ("2026-03-04T05:06", "world", 1) not in by_minute  # before since
    assert ("2026-03-04T05:07", "world", 1) in by_minute
    stored = store.units_per_time_prefix(bank.ref, time_field="created_at", chars=10, since="")
    assert sorted(stored) == [(today, "experience", 1), (today, "world", 3)]
    with pytest.raises(ValueError, match="not a unit time column"):
        store.units_per_time_prefix(bank.ref, time_field="text", chars=10, since="")


# -- writes ---------------------------------------------------------------------------------


def test_write_document_replaces_and_appends(store: SqlMemoryStore) -> None:
    bank = _bank(store)
    first = store.write_document(
        bank.ref, _doc([_unit(f"note {i}", "Alice") for i in range(4)], "d1")
    )
    seqs = [s for s, _ in first.added]
    assert seqs == list(range(seqs[0], seqs[0] + 4)) and first.removed == []
    replaced = store.write_document(bank.ref, _doc([_unit("replaced note", "Alice")], "d1"))
    assert replaced.removed == seqs
    assert all(store.get_unit(bank.ref, unit_id) is None for _, unit_id in first.added)
    appended = _doc([_unit("appended note", "Alice", chunk=0)], "d1", replace=False)
    appended.original_text = "more text"
    store.write_document(bank.ref, appended)
    info = store.get_document(bank.ref, "d1")
    assert info is not None and info.original_text == "replaced note\nmore text"
    assert info.unit_count == 2 and info.units_by_type == {"world": 2}
    with store.db.read() as conn:
        indexes = conn.execute(
            "SELECT chunk_index FROM memory_chunks WHERE document_id = 'd1' ORDER BY 1"
        ).fetchall()
    assert [r[0] for r in indexes] == [0, 1]  # the append's chunks follow the stored ones
    units, total = store.list_units(bank.ref, UnitFilter(document_id="d1"), 10, 0)
    assert total == 2 and [u.text for u in units] == ["appended note", "replaced note"]


def test_write_document_refuses_nul_and_other_vector_sizes(store: SqlMemoryStore) -> None:
    bank = _bank(store)
    with pytest.raises(InvalidText):
        store.write_document(bank.ref, _doc([_unit("bad\x00")]))
    with pytest.raises(ValueError, match="3-dimensional embedding"):
        store.write_document(bank.ref, _doc([_unit("x", vector=np.ones(3, dtype=np.float32))]))
    assert _count(store, "memory_units") == 0 and _count(store, "memory_documents") == 0


def test_write_document_into_a_deleted_bank_writes_nothing(store: SqlMemoryStore) -> None:
    bank = _bank(store)
    store.delete_bank(bank.ref)
    with pytest.raises(BankGone):
        store.write_document(bank.ref, _doc([_unit("late")]))
    assert _count(store, "memory_units") == 0 and _count(store, "memory_documents") == 0


def test_retain_ledger_and_a_repeated_entry(store: SqlMemoryStore) -> None:
    bank = _bank(store)
    key = RetainKey("key-1", "fingerprint")
    assert store.retain_ledger(bank.ref, "key-1") == []
    for index in (1, 0):
        store.write_document(bank.ref, _doc([_unit("a")], f"doc-{index}"), (key, index))
    entries = store.retain_ledger(bank.ref, "key-1")
    assert [(e.document_index, e.document_id, e.units, e.fingerprint) for e in entries] == [
        (0, "doc-0", 1, "fingerprint"),
        (1, "doc-1", 1, "fingerprint"),
    ]
    with pytest.raises(IdempotencyConflict, match="already running"):
        store.write_document(bank.ref, _doc([_unit("b")], "x"), (key, 0))
    assert store.get_document(bank.ref, "x") is None  # the whole transaction rolled back
    assert store.list_units(bank.ref, UnitFilter(), 10, 0)[1] == 2
    assert store.retain_ledger(bank.ref, "key-1\x00") == []
    with store.db.write() as conn:  # an expired key is forgotten at the next read
        conn.execute("UPDATE memory_retain_ledger SET created_at = created_at - 2 * 86400")
    assert store.retain_ledger(bank.ref, "key-1") == []


def test_write_document_cancelled_between_batches_leaves_nothing(
    store: SqlMemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    bank = _bank(store)
    token = CancellationToken()
    batches: list[int] = []
    insert = store.dialect.insert_units

    def insert_then_cancel(conn: Any, rows: Any, keywords: Any) -> None:
        insert(conn, rows, keywords)
        batches.append(len(rows))
        token.cancel("client disconnected")  # after the first batch is in

    monkeypatch.setattr(store.dialect, "insert_units", insert_then_cancel)
    with use_context(RequestContext(token=token)), pytest.raises(OperationCancelled):
        store.write_document(bank.ref, _doc([_unit(f"u{i}", "Ann") for i in range(600)], "big"))
    assert batches == [8 if store.db.dialect == "postgresql" else WRITE_BATCH]  # PG: a few ms
    assert store.get_document(bank.ref, "big") is None
    for table in ("memory_units", "memory_entities", "memory_chunks", "memory_documents"):
        assert _count(store, table) == 0, table


def test_an_append_indexes_as_if_the_document_were_retained_whole(store: SqlMemoryStore) -> None:
    talk = [
        "Joanna: What is your favourite dish from the show?",
        "Nate: Coconut milk ice cream, smooth and creamy.",
        "Joanna: Did you film it in the studio downtown?",
        "Nate: Yes, with my turtles watching from the tank.",
        "Joanna: My stuffed dog Tilly sits with me while I write.",
    ]
    from heed.memory.retain.units import neighbour_texts, with_neighbours

    def units(texts: list[str]) -> list[PreparedUnit]:
        out = [_unit(t) for t in texts]
        for i, unit in enumerate(out):
            unit.index_text = with_neighbours(unit.text, neighbour_texts(texts, i))
        return out

    words = ["favourite", "coconut", "studio", "turtles", "tilly"]
    whole = _bank(store, "whole")
    store.write_document(whole.ref, _doc(units(talk), "talk"))
    for split in ([1, 1, 1, 1, 1], [2, 3], [4, 1]):
        parts = _bank(store, f"parts-{len(split)}-{split[0]}")
        start = 0
        for size in split:
            store.write_document(
                parts.ref, _doc(units(talk[start : start + size]), "talk", replace=start == 0)
            )
            start += size

        def found(bank: Bank, word: str) -> set[str]:
            seqs = [s for s, _ in store.keyword_search(bank.ref, [word], 20)]
            return {u.text for u in store.fetch_units(bank.ref, seqs).values()}

        assert {w: found(parts, w) for w in words} == {w: found(whole, w) for w in words}, split
    # two units on either side: the question finds its answer and the next exchange, not more
    assert found(whole, "favourite") == set(talk[:3])
    assert found(whole, "tilly") == set(talk[2:])


# -- recall ----------------------------------------------------------------------------------


def test_keyword_search(store: SqlMemoryStore) -> None:
    bank, other = _bank(store, "a"), _bank(store, "b")
    coffee, running, tea, twin_a, twin_b = _write(
        store,
        bank,
        _unit("O'Brien's café serves \"strong\" coffee & tea (really!)"),
        _unit("Running shoes for the marathon"),
        _unit("A quiet evening with tea"),
        _unit("identical twins"),
        _unit("identical twins"),
    )
    _write(store, other, _unit("coffee in the other bank"))
    top = store.keyword_search(bank.ref, ["coffee", "tea"], 10)
    assert [s for s, _ in top] == [coffee, tea]  # both terms beat one
    assert top[0][1] > top[1][1] > 0
    assert [s for s, _ in store.keyword_search(bank.ref, ["runs"], 10)] == [running]  # stemmed
    assert [s for s, _ in store.keyword_search(bank.ref, ["twins"], 10)] == [twin_b, twin_a]
    assert len(store.keyword_search(bank.ref, ["coffee", "tea", "twins"], -1)) == 4
    assert len(store.keyword_search(bank.ref, ["coffee", "tea", "twins"], 2)) == 2
    assert store.keyword_search(bank.ref, ["coffee"], 0) == []
    assert store.keyword_search(bank.ref, [], 10) == []
    assert store.keyword_search(bank.ref, ["", "   ", "nul\x00"], 10) == []
    assert [s for s, _ in store.keyword_search(bank.ref, ["tea\x00", "evening"], 10)] == [tea]
    odd = ["'", '"', "&", "|", "!", ":*", "(", ")", "\\", "%", "_", "?", "o'brien's", "a" * 3000]
    assert [s for s, _ in store.keyword_search(bank.ref, odd, 10)] == [coffee]


def test_units_by_entities(store: SqlMemoryStore) -> None:
    bank = _bank(store)
    both, alice, bob, alice_again = _write(
        store, bank, _unit("a", "Alice", "Bob"), _unit("b", "Alice"), _unit("c", "Bob"),
        _unit("d", "Alice"),
    )  # fmt: skip
    assert store.units_by_entities(bank.ref, ["alice", "bob"], 10) == [
        (both, 2.0),
        (alice_again, 1.0),  # ties: the newer unit first
        (bob, 1.0),
        (alice, 1.0),
    ]
    assert store.units_by_entities(bank.ref, ["alice", "bob"], 2) == [
        (both, 2.0),
        (alice_again, 1.0),
    ]
    assert len(store.units_by_entities(bank.ref, ["alice"], -1)) == 3
    assert store.units_by_entities(bank.ref, ["alice\x00", "nobody"], 10) == []
    assert [s for s, _ in store.units_by_entities(bank.ref, ["bob\x00", "bob"], 10)] == [bob, both]
    assert store.units_by_entities(bank.ref, [], 10) == []


def test_linked_units(store: SqlMemoryStore) -> None:
    bank = _bank(store)
    a, b, c, d = _write(store, bank, _unit("a", "Kim"), _unit("b"), _unit("c", "Kim"), _unit("d"))
    # temporal a-b, b-c, c-d; entity a-c
    assert store.linked_units(bank.ref, [b], 10) == [(c, 1.0), (a, 1.0)]  # ties: newer first
    # from a: b (temporal), c (entity); from c: b, d (temporal), a (entity)
    assert store.linked_units(bank.ref, [a, c], 10) == [(b, 2.0), (d, 1.0), (c, 1.0), (a, 1.0)]
    assert store.linked_units(bank.ref, [a, c], 1) == [(b, 2.0)]
    assert len(store.linked_units(bank.ref, [a, c], -1)) == 4
    assert store.linked_units(bank.ref, [], 10) == []


def test_units_in_window(store: SqlMemoryStore) -> None:
    bank = _bank(store)
    early, long_one, mid, mid_too, late = _write(
        store,
        bank,
        _unit("early", when=_day(1)),
        _unit("long", when=_day(2), until=_day(20)),
        _unit("mid", when=_day(10)),
        _unit("mid too", when=_day(10)),
        _unit("late", when=_day(25)),
    )
    _write(store, bank, _unit("undated"))
    start, end = _day(9).isoformat(), _day(12).isoformat()
    window = store.units_in_window(bank.ref, start, end, 10)
    assert [s for s, _ in window] == [mid_too, mid, long_one]  # latest first, ties newer first
    assert window[0][1] == _day(10).isoformat()
    assert len(store.units_in_window(bank.ref, start, end, 1)) == 1
    assert len(store.units_in_window(bank.ref, _day(1).isoformat(), _day(31).isoformat(), -1)) == 5
    assert store.units_in_window(bank.ref, start + "\x00", end, 10) == []
    assert early and late


def test_fetch_units_and_get_unit(store: SqlMemoryStore) -> None:
    bank, other = _bank(store, "a"), _bank(store, "b")
    unit = _unit(
        "Alice met Bob",
        "Bob",
        "Alice",
        fact_type="experience",
        when=_day(3),
        tags=["x", "y" * 70],
        metadata={"k": "v"},
        context="c" * 100,
        vector=_vector(1),
    )
    [seq] = _write(store, bank, unit, doc="doc-1")
    [foreign] = _write(store, other, _unit("elsewhere"))
    fetched = store.fetch_units(bank.ref, [seq, foreign, 10**12])
    assert list(fetched) == [seq]
    got = fetched[seq]
    assert (got.id, got.seq, got.text, got.fact_type, got.document_id) == (
        unit.id, seq, "Alice met Bob", "experience", "doc-1",
    )  # fmt: skip
    assert got.context == "c" * 100 and got.tags == ["x", "y" * 70] and got.metadata == {"k": "v"}
    assert got.occurred_start == got.occurred_end == got.mentioned_at == _day(3).isoformat()
    assert got.chunk_id is not None and got.token_count == 3 and got.created_at
    with store.db.read() as conn:
        ids = dict(conn.execute("SELECT name, id FROM memory_entities").fetchall())
    assert got.entities == sorted(["Alice", "Bob"], key=ids.__getitem__)  # by entity id
    assert store.get_unit(bank.ref, unit.id) == got
    assert store.get_unit(other.ref, unit.id) is None
    assert store.get_unit(bank.ref, unit.id + "\x00") is None
    assert store.fetch_units(bank.ref, []) == {}
    many = _write(store, bank, *[_unit(f"n{i}") for i in range(700)])
    assert set(store.fetch_units(bank.ref, many)) == set(many)  # more than one list's worth


def test_fetch_chunks(store: SqlMemoryStore) -> None:
    bank = _bank(store)
    document = _doc([_unit("a", chunk=0), _unit("b", chunk=1)])
    store.write_document(bank.ref, document)
    ids = [c.id for c in document.chunks]
    chunks = store.fetch_chunks(bank.ref, [*ids, "missing", ids[0] + "\x00"])
    assert chunks == {
        ids[0]: {"id": ids[0], "chunk_index": 0, "text": "chunk 0"},
        ids[1]: {"id": ids[1], "chunk_index": 1, "text": "chunk 1"},
    }
    assert store.fetch_chunks(_bank(store, "other").ref, ids) == {}
    assert store.fetch_chunks(bank.ref, []) == {}


def test_entity_states(store: SqlMemoryStore) -> None:
    bank = _bank(store)
    _write(
        store, bank, *[_unit(f"Marcus fact {i}", "Marcus Chen", when=_day(i + 1)) for i in range(5)]
    )
    [gone] = _write(store, bank, _unit("Priya once", "Priya"), doc="priya")
    states = store.entity_states(bank.ref, ["marcus chen", "priya", "nobody", "x\x00"], 2)
    assert set(states) == {"Marcus Chen", "Priya"}
    marcus = states["Marcus Chen"]
    assert marcus["canonical_name"] == "Marcus Chen" and marcus["entity_id"]
    assert marcus["observations"] == [
        {"text": "Marcus fact 4", "mentioned_at": _day(5).isoformat()},
        {"text": "Marcus fact 3", "mentioned_at": _day(4).isoformat()},
    ]
    assert (
        len(store.entity_states(bank.ref, ["marcus chen"], -1)["Marcus Chen"]["observations"]) == 5
    )
    assert store.entity_states(bank.ref, ["marcus chen"], 0)["Marcus Chen"]["observations"] == []
    store.delete_document(bank.ref, "priya")
    assert store.entity_states(bank.ref, ["priya"], 3)["Priya"]["observations"] == []
    assert store.entity_states(bank.ref, [], 3) == {}
    assert gone


# -- vectors -----------------------------------------------------------------------------------


def test_load_vectors_vectors_since_and_unit_seqs(store: SqlMemoryStore) -> None:
    bank = _bank(store)
    vectors = np.stack([_vector(i) for i in range(6)])
    types = ["world", "experience"] * 3
    seqs = _write(
        store,
        bank,
        *[
            _unit(f"v{i}", vector=v, fact_type=t)
            for i, (v, t) in enumerate(zip(vectors, types, strict=True))
        ],
    )
    [plain] = _write(store, bank, _unit("no vector"))
    rows = store.load_vectors(bank.ref)
    assert rows.seqs.tolist() == seqs and rows.types == types and rows.generation == 2
    assert rows.matrix.dtype == np.float32 and np.array_equal(rows.matrix, vectors)  # exact
    later = _write(store, bank, _unit("later", vector=_vector(9)))
    changes = store.vectors_since(bank.ref, rows.generation)
    assert changes is not None and changes.unit_count == 8
    assert changes.rows.seqs.tolist() == later and changes.rows.generation == 3
    store.delete_unit(bank.ref, store.fetch_units(bank.ref, [seqs[0]])[seqs[0]].id)
    changes = store.vectors_since(bank.ref, 3)
    assert changes is not None and changes.unit_count == 7 and changes.rows.seqs.tolist() == []
    assert sorted(store.unit_seqs(bank.ref).tolist()) == sorted([*seqs[1:], plain, *later])
    assert store.vectors_since(str(uuid.uuid4()), 0) is None
    empty = store.load_vectors(str(uuid.uuid4()))
    assert empty.seqs.shape == (0,) and empty.matrix.shape == (0, 0)


def test_vector_search_and_unit_vectors(store: SqlMemoryStore) -> None:
    a, b = _bank(store, "a"), _bank(store, "b")
    va = np.stack([_vector(i) for i in range(40)])
    types = ["world" if i % 3 else "experience" for i in range(40)]
    seqs = np.asarray(
        _write(
            store,
            a,
            *[
                _unit(f"a{i}", vector=v, fact_type=t)
                for i, (v, t) in enumerate(zip(va, types, strict=True))
            ],
        )
    )
    [foreign] = _write(store, b, _unit("b0", vector=_vector(1000)))
    query = _vector(500)
    scores = va @ query
    order = np.argsort(-scores)[:5]
    hits = store.vector_search(a.ref, query, 5, None)
    assert [s for s, _ in hits] == [int(seqs[i]) for i in order]
    assert np.allclose([c for _, c in hits], scores[order], atol=1e-5)
    experience = np.flatnonzero(np.asarray(types) == "experience")
    best = experience[np.argsort(-scores[experience])[:3]]
    assert [s for s, _ in store.vector_search(a.ref, query, 3, ["experience"])] == [
        int(seqs[i]) for i in best
    ]
    assert foreign not in {s for s, _ in store.vector_search(a.ref, _vector(1000), 50, None)}
    assert store.vector_search(a.ref, query, 0, None) == []
    assert store.vector_search(a.ref, query, 5, []) == []
    assert store.vector_search(a.ref, query, 5, ["observation"]) == []
    with pytest.raises(ValueError, match="3 dimensions"):
        store.vector_search(a.ref, np.ones(3, dtype=np.float32), 3, None)
    got = store.unit_vectors(a.ref, [int(seqs[3]), int(seqs[7]), foreign, 10**12])
    assert set(got) == {int(seqs[3]), int(seqs[7])} and np.array_equal(got[int(seqs[3])], va[3])
    assert store.unit_vectors(a.ref, []) == {}


# -- memories and documents ---------------------------------------------------------------------


def test_list_units_filters_orders_and_pages(store: SqlMemoryStore) -> None:
    bank = _bank(store)
    units = [
        _unit("Kenji ran the Tokyo MARATHON", "Kenji", when=_day(3)),
        _unit("Kenji hurt his knee", "Kenji", when=_day(5), fact_type="experience"),
        _unit("100% sure about a_b", when=_day(5)),
        _unit("back\\slash here", when=_day(1)),
        _unit("no date at all"),
    ]
    seqs = _write(store, bank, *units, doc="d")
    [elsewhere] = _write(store, bank, _unit("another marathon", when=_day(2)), doc="e")

    def ids(flt: UnitFilter, limit: int = 10, offset: int = 0) -> tuple[list[int], int]:
        found, total = store.list_units(bank.ref, flt, limit, offset)
        return [u.seq for u in found], total

    assert ids(UnitFilter()) == ([elsewhere, *reversed(seqs)], 6)  # the newest first
    assert ids(UnitFilter(), 2, 1) == ([seqs[4], seqs[3]], 6)
    assert ids(UnitFilter(), -1, -3) == ([elsewhere, *reversed(seqs)], 6)
    assert ids(UnitFilter(), 0, 0) == ([], 6)
    assert ids(UnitFilter(fact_type="experience")) == ([seqs[1]], 1)
    assert ids(UnitFilter(document_id="e")) == ([elsewhere], 1)
    assert ids(UnitFilter(search="marathon")) == ([elsewhere, seqs[0]], 2)  # case-folded
    assert ids(UnitFilter(search="100%")) == ([seqs[2]], 1)
    assert ids(UnitFilter(search="a_b")) == ([seqs[2]], 1)
    assert ids(UnitFilter(search="k%e")) == ([seqs[3], seqs[1], seqs[0]], 3)  # % is a wildcard
    assert ids(UnitFilter(search="back\\slash")) == ([seqs[3]], 1)  # a backslash is itself
    kenji = store.entity_states(bank.ref, ["kenji"], 1)["Kenji"]["entity_id"]
    assert ids(UnitFilter(entity_id=kenji)) == ([seqs[1], seqs[0]], 2)
    by_time = UnitFilter(
        time_field="occurred_start", start=_day(2).isoformat(), end=_day(6).isoformat()
    )
    assert ids(by_time) == ([seqs[2], seqs[1], seqs[0], elsewhere], 4)  # ties: newer first
    assert ids(UnitFilter(time_field="mentioned_at")) == (
        [seqs[2], seqs[1], seqs[0], elsewhere, seqs[3]],
        5,
    )
    for holding_nul in (
        UnitFilter(search="x\x00"),
        UnitFilter(document_id="d\x00"),
        UnitFilter(entity_id="\x00"),
        UnitFilter(time_field="created_at", start="\x00"),
    ):
        assert store.list_units(bank.ref, holding_nul, 10, 0) == ([], 0)


def test_list_units_filters_by_tags_as_recall_does(store: SqlMemoryStore) -> None:
    """Every ``tags_match`` mode keeps what :func:`heed.memory.tags.tags_pass` (recall's
    rule) keeps, for tag lists stored inline and shared (longer than a reference), with the
    other filters, paging and the total."""
    bank = _bank(store)
    long = [f"project-{i:02d}-with-a-rather-long-name" for i in range(3)]  # a shared value
    sets: list[list[str]] = [[], ["a"], ["b"], ["a", "b"], ["b", "a"], ["a", "c"], long]
    sets.append([*long, "a"])
    seqs = _write(store, bank, *[_unit(f"unit {i}", tags=t) for i, t in enumerate(sets)])
    _write(store, _bank(store, "other"), _unit("elsewhere", tags=["a"]), _unit("untagged"))
    assert _count(store, "memory_values") == 2  # the two long lists, one per bank at most
    tags_of = dict(zip(seqs, sets, strict=True))

    def found(wanted: list[str] | None, match: TagsMatch, **kw: Any) -> tuple[list[int], int]:
        flt = UnitFilter(tags=wanted, tags_match=match, **kw)
        units, total = store.list_units(bank.ref, flt, 100, 0)
        return [u.seq for u in units], total

    newest_first = list(reversed(seqs))
    for match in TAGS_MATCH:
        for wanted in (None, [], ["a"], ["a", "b"], ["c"], ["zzz"], [long[0]], long):
            expected = [s for s in newest_first if tags_pass(tags_of[s], wanted, match)]
            assert found(wanted, match) == (expected, len(expected)), (match, wanted)
    # The rule, spelled out once: any/all keep the untagged, the _strict modes do not.
    a, _b, ab, ba, ac, lg, lga = seqs[1:]
    assert found(["a"], "any") == ([lga, ac, ba, ab, a, seqs[0]], 6)
    assert found(["a"], "any_strict") == ([lga, ac, ba, ab, a], 5)
    assert found(["a", "b"], "all") == ([ba, ab, seqs[0]], 3)
    assert found(["a", "b"], "all_strict") == ([ba, ab], 2)
    assert found(["a", "b"], "exact") == ([ba, ab], 2)
    assert found(None, "exact") == ([seqs[0]], 1)
    assert found(long, "all_strict") == ([lga, lg], 2)
    assert found(long, "exact") == ([lg], 1)
    # With the other filters and a page: the total counts every match.
    units, total = store.list_units(
        bank.ref, UnitFilter(tags=["a"], tags_match="any_strict", search="unit"), 2, 1
    )
    assert ([u.seq for u in units], total) == ([ac, ba], 5)
    assert found(["a"], "any_strict", search="nothing like this") == ([], 0)
    assert found(["a\x00"], "any") == ([], 0)  # NUL finds nothing
    # Many distinct tag lists (more than one IN list holds on SQLite): one parameter.
    many = _bank(store, "many")
    wide = _write(store, many, *[_unit(f"u{i}", tags=[f"t{i}", "common"]) for i in range(600)])
    units, total = store.list_units(
        many.ref, UnitFilter(tags=["common"], tags_match="all_strict"), 1000, 0
    )
    assert total == 600 and [u.seq for u in units] == list(reversed(wide))
    units, total = store.list_units(
        many.ref, UnitFilter(tags=["t7", "t9"], tags_match="any_strict"), 10, 0
    )
    assert [u.seq for u in units] == [wide[9], wide[7]] and total == 2


def test_delete_unit(store: SqlMemoryStore) -> None:
    bank = _bank(store)
    first, middle, last = _write(
        store, bank, _unit("a", "Ann"), _unit("b", "Ann"), _unit("c", "Ann")
    )
    unit = store.fetch_units(bank.ref, [middle])[middle]
    deleted = store.delete_unit(bank.ref, unit.id)
    assert deleted is not None and deleted.removed == [middle] and deleted.added == []
    assert store.get_unit(bank.ref, unit.id) is None
    assert store.delete_unit(bank.ref, unit.id) is None
    assert store.delete_unit(bank.ref, unit.id + "\x00") is None
    where = f"WHERE from_seq = {middle} OR to_seq = {middle}"
    assert _count(store, "memory_links", where) == 0
    assert _count(store, "memory_unit_entities", f"WHERE unit_seq = {middle}") == 0
    assert _count(store, "memory_entities") == 1  # entities outlive their units
    assert store.keyword_search(bank.ref, ["b"], 10) == []
    assert {s for s, _ in store.units_by_entities(bank.ref, ["ann"], 10)} == {first, last}


def test_list_documents_get_document_and_delete_document(store: SqlMemoryStore) -> None:
    bank = _bank(store)
    store.write_document(
        bank.ref, _doc([_unit("The Eiffel tower", "Sofia", tags=["t" * 80])], "paris")
    )
    store.write_document(bank.ref, _doc([_unit("Porto wedding", "Sofia"), _unit("June")], "porto"))
    docs, total = store.list_documents(bank.ref, None, 10, 0)
    assert total == 2 and [d.document_id for d in docs] == ["porto", "paris"]  # latest first
    assert docs[0].unit_count == 2 and docs[0].original_text is None
    assert docs[0].metadata == {"source": "test"} and docs[0].tags == ["doc-tag"]
    assert store.list_documents(bank.ref, "EIFFEL", 10, 0)[1] == 1
    assert store.list_documents(bank.ref, "port", 10, 0)[0][0].document_id == "porto"  # the id
    assert store.list_documents(bank.ref, None, 1, 1)[0][0].document_id == "paris"
    assert store.list_documents(bank.ref, None, -1, -1)[1] == 2
    assert store.list_documents(bank.ref, "x\x00", 10, 0) == ([], 0)
    info = store.get_document(bank.ref, "porto")
    assert info is not None and info.original_text == "Porto wedding\nJune"
    assert info.units_by_type == {"world": 2} and info.text_length == len(info.original_text)
    assert info.content_hash and store.get_document(bank.ref, "porto\x00") is None
    assert store.delete_document(bank.ref, "nope") is None
    assert store.delete_document(bank.ref, "porto\x00") is None
    removed = store.delete_document(bank.ref, "paris")
    assert removed is not None and len(removed.removed) == 1
    assert store.get_document(bank.ref, "paris") is None
    assert _count(store, "memory_units") == 2 and _count(store, "memory_chunks") == 1
    assert _count(store, "memory_values") == 0  # the long tags went with their last row
    assert _count(store, "memory_unit_entities") == 1 and _count(store, "memory_entities") == 1


def test_cancelled_reads_stop_inside_the_database(store: SqlMemoryStore) -> None:
    bank = _bank(store)
    _write(store, bank, *[_unit(f"Alice: note {i} about the garden", "Alice") for i in range(3000)])
    token = CancellationToken()
    token.cancel("client disconnected")
    with use_context(RequestContext(token=token)):
        with pytest.raises(OperationCancelled):
            store.keyword_search(bank.ref, ["garden", "note"], 100)
        with pytest.raises(OperationCancelled):
            store.units_by_entities(bank.ref, ["alice"], 100)
    assert len(store.units_by_entities(bank.ref, ["alice"], 100)) == 100  # usable again


def test_every_method_of_the_protocol_is_tested_here() -> None:
    methods = {
        name
        for protocol in (MemoryStore, VectorSearchingStore)
        for name, _ in inspect.getmembers(protocol, inspect.isfunction)
        if not name.startswith("_")
    }
    # This module and its siblings for the store's parts (test_memory_learning.py,
    # test_memory_directives.py, ...): every tests/storage/test_memory_*.py.
    parts = sorted(p.stem for p in Path(__file__).parent.glob("test_memory_*.py"))
    modules = [importlib.import_module(f"tests.storage.{stem}") for stem in parts]
    tests = " ".join(
        name
        for module in (sys.modules[__name__], *modules)
        for name in dir(module)
        if name.startswith("test_")
    )
    assert {m for m in methods if m not in tests} == set()
