"""The PostgreSQL + pgvector memory store, on a real server (see :mod:`tests.pg_support`).

Three kinds of checks: parity with the SQLite store (the same prepared documents written to
both, every method's answer compared; whole recalls compared through two engines), the
PostgreSQL-only parts (HNSW search against brute force, iterative scans under filters,
schema checks), and what SQLite's single writer used to give for free (cancelling a running
statement, several writers in one bank). Time bounds are generous: a cancelled 10 s
statement must stop within 2 s.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import numpy as np
import psycopg
import pytest

from heed.memory import MemoryEngine, build_memory_engine, shared_minilm, shared_token_counter
from heed.memory.idempotency import IdempotencyConflict, RetainKey
from heed.memory.models import (
    Bank,
    Chunk,
    EntityRef,
    PreparedDocument,
    PreparedUnit,
    RecallQuery,
    RetainItem,
    StoredUnit,
)
from heed.memory.retain import plan_documents, prepare_documents
from heed.memory.store import UnitFilter
from heed.runtime import CancellationToken, OperationCancelled, RequestContext, use_context
from heed.services import build_lanes
from heed.settings import Settings
from heed.storage import Database
from heed.storage.memory_store import SqliteMemoryStore
from heed.storage.pg_memory_store import (
    PG_MEMORY_MIGRATIONS,
    SEQ_BLOCK,
    PgMemoryStore,
    SchemaMismatch,
    _Statements,
)
from heed.storage.postgres import PostgresDatabase
from tests.pg_support import fresh_schema

DIM = 384
STOP_BOUND = 2.0  # seconds for a cancelled 10 s statement to stop


# -- fixtures and helpers -----------------------------------------------------------------


@pytest.fixture
def pg_url() -> Iterator[str]:
    with fresh_schema() as url:
        yield url


@pytest.fixture
def pg_db(pg_url: str) -> Iterator[PostgresDatabase]:
    database = PostgresDatabase(pg_url, pool_size=8)
    try:
        yield database
    finally:
        database.close()


@pytest.fixture
def pg_store(pg_db: PostgresDatabase) -> PgMemoryStore:
    store = PgMemoryStore(pg_db, DIM)
    store.migrate()
    return store


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[SqliteMemoryStore]:
    database = Database(tmp_path / "memory.db")
    store = SqliteMemoryStore(database)
    store.migrate()
    yield store
    database.close()


def _bank(store: Any, bank_id: str = "b", tenant: str = "t", ref: str | None = None) -> Bank:
    bank = Bank(tenant=tenant, bank_id=bank_id, ref=ref or str(uuid.uuid4()), name=bank_id)
    saved: Bank = store.save_bank(bank)
    return saved


def _unit_vector(rng: np.random.Generator, dim: int = DIM) -> np.ndarray:
    v = rng.standard_normal(dim).astype(np.float32)
    return v / np.linalg.norm(v)


def _unit(
    text: str,
    vector: np.ndarray | None = None,
    *,
    fact_type: str = "world",
    entities: list[str] | None = None,
    when: datetime | None = None,
) -> PreparedUnit:
    return PreparedUnit(
        id=str(uuid.uuid4()),
        text=text,
        index_text=text,
        fact_type=fact_type,
        context=None,
        chunk_index=0,
        occurred_start=when,
        occurred_end=when,
        mentioned_at=when,
        metadata={},
        tags=[],
        entities=[EntityRef(name) for name in entities or []],
        embedding=vector,
    )


def _doc(units: list[PreparedUnit], document_id: str | None = None) -> PreparedDocument:
    return PreparedDocument(
        document_id=document_id or str(uuid.uuid4()),
        replace=True,
        original_text="\n".join(u.text for u in units),
        metadata={},
        tags=[],
        chunks=[Chunk(str(uuid.uuid4()), 0, "\n".join(u.text for u in units))],
        units=units,
    )


def _prepare(items: list[RetainItem], tags: list[str] | None = None) -> list[PreparedDocument]:
    plans = plan_documents(items, tags or [])
    return prepare_documents(plans, shared_minilm(), shared_token_counter())


def _comparable(unit: StoredUnit) -> dict[str, Any]:
    """A unit's fields minus what each store assigns itself (seq, write time, entity order)."""
    data = asdict(unit)
    for key in ("seq", "created_at", "updated_at"):
        data.pop(key)
    data["entities"] = sorted(data["entities"])
    return data


def _links(store: Any) -> set[tuple[str, str, str, float]]:
    """Every link as (from unit id, to unit id, type, weight)."""
    with store.db.read() as conn:
        rows = conn.execute(
            "SELECT f.id, t.id, l.link_type, l.weight FROM memory_links l"
            " JOIN memory_units f ON f.seq = l.from_seq JOIN memory_units t ON t.seq = l.to_seq"
        ).fetchall()
    return {(r[0], r[1], r[2], float(r[3])) for r in rows}


def _count(store: Any, table: str) -> int:
    with store.db.read() as conn:
        return int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


# A few dozen facts with people, places and dates (timestamps make the temporal arm work).
FACTS: list[tuple[str, datetime]] = [
    ("Alice adopted a grey cat named Luna from the shelter.", datetime(2021, 3, 6, tzinfo=UTC)),
    ("Alice: Luna knocked my coffee off the desk again this morning.",
     datetime(2021, 9, 2, tzinfo=UTC)),
    ("Marcus Chen moved from Toronto to Lisbon to work as a marine biologist.",
     datetime(2020, 1, 15, tzinfo=UTC)),
    ("Marcus Chen studies octopus behaviour at the Lisbon aquarium.",
     datetime(2020, 6, 3, tzinfo=UTC)),
    ("Priya bakes sourdough bread every Sunday morning.", datetime(2022, 4, 10, tzinfo=UTC)),
    ("Priya entered her sourdough in the county fair and won second prize.",
     datetime(2022, 8, 20, tzinfo=UTC)),
    ("Daniel proposed to Sofia at the top of the Eiffel Tower.",
     datetime(2022, 2, 14, tzinfo=UTC)),
    ("Sofia and Daniel set their wedding date for June 2023 in Porto.",
     datetime(2022, 3, 1, tzinfo=UTC)),
    ("Kenji ran the Tokyo marathon in under four hours.", datetime(2019, 3, 3, tzinfo=UTC)),
    ("Kenji injured his knee while training for the Berlin marathon.",
     datetime(2019, 8, 12, tzinfo=UTC)),
    ("Grandma Rosa taught Elena how to make tamales for Christmas.",
     datetime(2018, 12, 20, tzinfo=UTC)),
    ("Elena opened a small bakery called Dulce in Austin.", datetime(2023, 5, 5, tzinfo=UTC)),
    ("The bakery Dulce sells conchas and tres leches cake.", datetime(2023, 6, 1, tzinfo=UTC)),
    ("Omar is learning to play the oud from a teacher in Cairo.",
     datetime(2021, 11, 9, tzinfo=UTC)),
    ("Omar performed his first oud concert at the community centre.",
     datetime(2022, 10, 30, tzinfo=UTC)),
    ("Hannah's daughter Mia started kindergarten in September.",
     datetime(2022, 9, 5, tzinfo=UTC)),
    ("Mia is allergic to peanuts, so Hannah packs her lunch.", datetime(2022, 9, 6, tzinfo=UTC)),
    ("Liam bought a used sailboat and named it Wanderer.", datetime(2020, 7, 4, tzinfo=UTC)),
    ("Liam sailed Wanderer from Boston to Nantucket over a weekend.",
     datetime(2020, 8, 15, tzinfo=UTC)),
    ("Chloe switched careers from accounting to software engineering.",
     datetime(2021, 1, 11, tzinfo=UTC)),
    ("Chloe got her first job as a developer at a fintech startup in Berlin.",
     datetime(2021, 7, 19, tzinfo=UTC)),
    ("Raj and Meera celebrated their tenth anniversary in Goa.",
     datetime(2023, 2, 2, tzinfo=UTC)),
    ("Raj is training to climb Mount Kilimanjaro next year.", datetime(2023, 4, 4, tzinfo=UTC)),
    ("The team offsite in Denver was cancelled because of a snowstorm.",
     datetime(2022, 12, 12, tzinfo=UTC)),
    ("Nora volunteers at the animal shelter on Saturdays.", datetime(2021, 5, 15, tzinfo=UTC)),
    ("Nora fostered three kittens during the spring.", datetime(2021, 4, 20, tzinfo=UTC)),
    ("Victor restored a 1967 Mustang in his garage.", datetime(2019, 10, 1, tzinfo=UTC)),
    ("Victor drove the Mustang along Route 66 to Santa Monica.",
     datetime(2020, 5, 25, tzinfo=UTC)),
    ("Ines is writing a novel about her grandmother's village in Galicia.",
     datetime(2023, 1, 8, tzinfo=UTC)),
    ("Ines finished the first draft of her novel in November.",
     datetime(2023, 11, 28, tzinfo=UTC)),
    ("Tom Baker keeps bees on the roof of his apartment in Brooklyn.",
     datetime(2021, 6, 21, tzinfo=UTC)),
    ("Tom Baker harvested forty jars of honey this autumn.", datetime(2021, 10, 3, tzinfo=UTC)),
    ("Yuki moved into a new flat near Kyoto station.", datetime(2022, 1, 22, tzinfo=UTC)),
    ("Yuki's favourite restaurant serves handmade soba noodles.",
     datetime(2022, 2, 18, tzinfo=UTC)),
    ("Ben lost his passport on the way to Reykjavik and missed his flight.",
     datetime(2019, 2, 9, tzinfo=UTC)),
    ("Ben finally saw the northern lights in Iceland.", datetime(2019, 2, 16, tzinfo=UTC)),
]  # fmt: skip


def _fact_items() -> list[RetainItem]:
    return [
        RetainItem(
            content=text,
            timestamp=when,
            context="journal" if i % 3 == 0 else None,
            metadata={"source": f"s{i % 4}"},
            tags=["odd"] if i % 2 else ["even"],
            fact_type="experience" if i % 5 == 0 else "world",
        )
        for i, (text, when) in enumerate(FACTS)
    ]


# -- schema --------------------------------------------------------------------------------


def test_migrate_is_idempotent_and_refuses_another_dimension(
    pg_store: PgMemoryStore, pg_db: PostgresDatabase
) -> None:
    pg_store.migrate()  # again: nothing to do
    assert pg_db.schema_version("memory") == PG_MEMORY_MIGRATIONS[-1].version
    with pytest.raises(SchemaMismatch, match="384-dimensional vectors but the embedder makes 512"):
        PgMemoryStore(pg_db, 512).migrate()
    bank = _bank(pg_store)
    wrong = _doc([_unit("x", np.ones(8, dtype=np.float32) / np.sqrt(8))])
    with pytest.raises(ValueError, match="8-dimensional embedding"):
        pg_store.write_document(bank.ref, wrong)
    with pytest.raises(ValueError, match="8 dimensions"):
        pg_store.vector_search(bank.ref, np.ones(8, dtype=np.float32), 3, None)


# -- parity with SQLite, method by method -------------------------------------------------


def test_every_method_answers_as_the_sqlite_store_does(
    pg_store: PgMemoryStore, sqlite_store: SqliteMemoryStore
) -> None:
    items = _fact_items()
    # One document of several items (chunks, temporal links), plus per-item documents.
    items[30].document_id = items[31].document_id = "tom-baker"
    items[30].entities = [EntityRef("Tom Baker", "person")]
    documents = _prepare(items, tags=["journal-2024"])
    stores: list[Any] = [sqlite_store, pg_store]
    refs = {}
    for store in stores:
        bank = _bank(store, "parity", ref="0d6f3c1e-9f5b-4a53-8d0e-8f3c8a7e5b21")
        refs[id(store)] = bank.ref
        for document in documents:
            store.write_document(bank.ref, document)
    ref = "0d6f3c1e-9f5b-4a53-8d0e-8f3c8a7e5b21"

    answers: list[dict[str, Any]] = []
    for store in stores:
        ids = {u.seq: u.id for u in store.list_units(ref, UnitFilter(), 1000, 0)[0]}
        seq_of = {v: k for k, v in ids.items()}
        out: dict[str, Any] = {}
        units, total = store.list_units(ref, UnitFilter(), 1000, 0)
        out["all"] = (total, [_comparable(u) for u in units])
        for name, flt in {
            "type": UnitFilter(fact_type="experience"),
            "document": UnitFilter(document_id="tom-baker"),
            "search": UnitFilter(search="MARATHON"),
        }.items():
            units, total = store.list_units(ref, flt, 1000, 0)
            out[name] = (total, [u.id for u in units])
        units, total = store.list_units(
            ref,
            UnitFilter(time_field="occurred_start", start="2021-01-01", end="2022-01-01"),
            5,
            2,
        )
        out["window_page"] = (total, [u.id for u in units])
        page, _ = store.list_units(ref, UnitFilter(), 3, 4)
        out["page"] = [u.id for u in page]
        marcus = store.entity_states(ref, ["marcus chen"], per_entity=5)["Marcus Chen"]
        units, total = store.list_units(ref, UnitFilter(entity_id=marcus["entity_id"]), 10, 0)
        out["entity"] = (total, sorted(u.id for u in units))
        out["entity_states"] = {
            name: [o["text"] for o in state["observations"]]
            for name, state in store.entity_states(
                ref, ["marcus chen", "priya", "tom baker", "nobody"], per_entity=1
            ).items()
        }
        first = units[0]
        out["get_unit"] = _comparable(store.get_unit(ref, first.id))
        out["get_unit_missing"] = store.get_unit(ref, "no-such-id")
        out["by_entities"] = [
            (ids[s], w) for s, w in store.units_by_entities(ref, ["marcus chen", "lisbon"], 10)
        ]
        strong = [seq_of[first.id]]
        out["linked"] = sorted(
            (ids[s], w) for s, w in store.linked_units(ref, [*strong, seq_of[units[-1].id]], 50)
        )
        out["window"] = [
            (ids[s], when)
            for s, when in store.units_in_window(
                ref, "2022-02-01T00:00:00+00:00", "2022-03-31T00:00:00+00:00", 10
            )
        ]
        keyword = store.keyword_search(ref, ["sourdough", "bread"], 5)
        out["keyword_top"] = ids[keyword[0][0]]
        out["keyword_ids"] = {ids[s] for s, _ in keyword}
        fetched = store.fetch_units(ref, [seq_of[first.id], 10**12])
        out["fetch"] = {ids[s]: _comparable(u) for s, u in fetched.items()}
        chunk_ids = [c.id for d in documents for c in d.chunks][:5]
        out["chunks"] = store.fetch_chunks(ref, [*chunk_ids, "missing"])
        docs, total = store.list_documents(ref, None, 100, 0)
        out["documents"] = (total, sorted(d.document_id for d in docs))
        docs, total = store.list_documents(ref, "EIFFEL", 100, 0)
        out["document_search"] = (total, [d.document_id for d in docs])
        info = store.get_document(ref, "tom-baker")
        assert info is not None
        out["document"] = {
            k: v for k, v in asdict(info).items() if k not in ("created_at", "updated_at")
        }
        stats = store.bank_stats(ref)
        out["stats"] = (stats.units_by_type, stats.links_by_type, stats.documents)
        assert stats.last_write_at is not None
        banks, total = store.list_banks("t", 10, 0)
        out["banks"] = (total, [(b.bank_id, n) for b, n in banks])
        out["links"] = _links(store)
        answers.append(out)

    sqlite, pg = answers
    for key in sqlite:
        assert pg[key] == sqlite[key], key
    assert sqlite["all"][0] == len(FACTS)
    assert sqlite["entity"][0] == 2 and sqlite["search"][0] == 2
    assert sqlite["window_page"][0] > 5 and len(sqlite["window_page"][1]) == 5
    assert {t for _f, _t, t, _w in sqlite["links"]} == {"entity", "temporal"}
    assert sqlite["document"]["units_by_type"] and sqlite["document"]["original_text"]


def test_document_replace_append_and_delete_cascade(pg_store: PgMemoryStore) -> None:
    bank = _bank(pg_store)
    rng = np.random.default_rng(1)
    first = _doc(
        [_unit(f"Alice note {i}", _unit_vector(rng), entities=["Alice"]) for i in range(4)],
        "d1",
    )
    result = pg_store.write_document(bank.ref, first)
    seqs = [s for s, _ in result.added]
    assert seqs == list(range(seqs[0], seqs[0] + 4))  # one document: consecutive seqs
    assert result.removed == []

    again = _doc([_unit("Alice replaced note", _unit_vector(rng), entities=["Alice"])], "d1")
    replaced = pg_store.write_document(bank.ref, again)
    assert replaced.removed == seqs
    assert pg_store.fetch_units(bank.ref, seqs) == {}
    units, total = pg_store.list_units(bank.ref, UnitFilter(document_id="d1"), 10, 0)
    assert total == 1 and units[0].text == "Alice replaced note"

    appended = _doc([_unit("Alice appended note", _unit_vector(rng), entities=["Alice"])], "d1")
    appended.replace = False
    appended.original_text = "more text"
    pg_store.write_document(bank.ref, appended)
    info = pg_store.get_document(bank.ref, "d1")
    assert info is not None
    assert info.original_text == "Alice replaced note\nmore text"
    assert info.unit_count == 2
    with pg_store.db.read() as conn:
        assert [r[0] for r in conn.execute(
            "SELECT chunk_index FROM memory_chunks WHERE document_id = 'd1' ORDER BY 1"
        ).fetchall()] == [0, 1]  # fmt: skip

    assert _count(pg_store, "memory_links") > 0 and _count(pg_store, "memory_unit_entities") > 0
    unit = units[0]
    deleted = pg_store.delete_unit(bank.ref, unit.id)
    assert deleted is not None and deleted.removed == [unit.seq]
    assert pg_store.delete_unit(bank.ref, unit.id) is None
    assert pg_store.get_unit(bank.ref, unit.id) is None
    with pg_store.db.read() as conn:
        left = conn.execute(
            "SELECT COUNT(*) FROM memory_links WHERE from_seq = ? OR to_seq = ?",
            (unit.seq, unit.seq),
        ).fetchone()[0]
    assert left == 0
    assert pg_store.delete_document(bank.ref, "nope") is None
    removed = pg_store.delete_document(bank.ref, "d1")
    assert removed is not None and len(removed.removed) == 1
    assert pg_store.get_document(bank.ref, "d1") is None
    for table in ("memory_units", "memory_links", "memory_unit_entities", "memory_chunks"):
        assert _count(pg_store, table) == 0, table
    assert _count(pg_store, "memory_entities") == 1  # entities outlive their units, as on SQLite


TALK = [
    "Joanna: What is your favourite dish from the show?",
    "Nate: Coconut milk ice cream, smooth and creamy.",
    "Joanna: Did you film it in the studio downtown?",
    "Nate: Yes, with my turtles watching from the tank.",
    "Joanna: My stuffed dog Tilly sits with me while I write.",
]


def _talk_units(texts: list[str]) -> list[PreparedUnit]:
    items = [RetainItem(content=t, document_id="talk") for t in texts]
    [document] = _prepare(items)
    return document.units


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
@pytest.mark.parametrize("split", [[1, 1, 1, 1, 1], [2, 3], [4, 1]])
def test_an_append_indexes_as_if_the_document_were_retained_whole(
    backend: str, split: list[int], request: pytest.FixtureRequest
) -> None:
    store = request.getfixturevalue("sqlite_store" if backend == "sqlite" else "pg_store")
    whole, parts = _bank(store, "whole"), _bank(store, "parts")
    store.write_document(whole.ref, _doc(_talk_units(TALK), "talk"))
    store.write_document(parts.ref, _doc([_unit("Maria: The shelter needs volunteers.")], "x"))
    start = 0
    for size in split:
        document = _doc(_talk_units(TALK[start : start + size]), "talk")
        document.replace = start == 0
        store.write_document(parts.ref, document)
        start += size

    def found(bank: Bank, word: str) -> set[str]:
        seqs = [s for s, _ in store.keyword_search(bank.ref, [word], 20)]
        return {u.text for u in store.fetch_units(bank.ref, seqs).values()}

    words = ["favourite", "coconut", "studio", "turtles", "tilly", "shelter"]
    assert {w: found(parts, w) - {"Maria: The shelter needs volunteers."} for w in words} == {
        w: found(whole, w) for w in words
    }
    # two units on either side: the question finds its answer and the next exchange, not more
    assert found(whole, "favourite") == set(TALK[:3])
    assert found(whole, "tilly") == set(TALK[2:])
    units, _ = store.list_units(parts.ref, UnitFilter(document_id="talk"), 10, 0)
    assert sorted(u.text for u in units) == sorted(TALK)  # the texts stay the units' own


def test_banks_and_delete_bank_leaves_other_banks_alone(pg_store: PgMemoryStore) -> None:
    rng = np.random.default_rng(2)
    one = _bank(pg_store, "one")
    two = _bank(pg_store, "two")
    _bank(pg_store, "other-tenant", tenant="u")
    assert one.created_at and one.created_at == one.updated_at
    one.mission = "remember pets"
    one.config["enable_reranking"] = False
    saved = pg_store.save_bank(one)
    got = pg_store.get_bank("t", "one")
    assert got is not None and got.mission == "remember pets"
    assert got.config == {"enable_reranking": False} and got.created_at == saved.created_at
    assert pg_store.get_bank("u", "one") is None
    for bank in (one, two):
        key = RetainKey("k", "fp")
        document = _doc(
            [_unit(f"{bank.bank_id} fact {i}", _unit_vector(rng), entities=["Ann"])
             for i in range(3)]
        )  # fmt: skip
        pg_store.write_document(bank.ref, document, (key, 0))
    banks, total = pg_store.list_banks("t", 10, 0)
    assert total == 2 and [(b.bank_id, n) for b, n in banks] == [("one", 3), ("two", 3)]
    assert [b.bank_id for b, _ in pg_store.list_banks("t", 1, 1)[0]] == ["two"]
    assert pg_store.bank_stats(one.ref).units_by_type == {"world": 3}
    assert pg_store.bank_stats(one.ref).links_by_type == {"entity": 6, "temporal": 4}

    assert pg_store.delete_bank(one.ref) == 3
    assert pg_store.get_bank("t", "one") is None
    stats = pg_store.bank_stats(two.ref)
    assert stats.units_by_type == {"world": 3} and stats.documents == 1
    assert stats.links_by_type == {"entity": 6, "temporal": 4}
    assert len(pg_store.retain_ledger(two.ref, "k")) == 1
    for table, left in {
        "memory_units": 3,
        "memory_entities": 1,
        "memory_unit_entities": 3,
        "memory_links": 10,
        "memory_chunks": 1,
        "memory_documents": 1,
        "memory_retain_ledger": 1,
        "memory_banks": 2,
    }.items():
        assert _count(pg_store, table) == left, table
    assert pg_store.delete_bank(one.ref) == 0  # already gone


def test_ledger_and_idempotency_conflict(pg_store: PgMemoryStore) -> None:
    bank = _bank(pg_store)
    rng = np.random.default_rng(3)
    key = RetainKey("key-1", "fingerprint")
    assert pg_store.retain_ledger(bank.ref, "key-1") == []
    for index in (1, 0):
        pg_store.write_document(
            bank.ref, _doc([_unit("a", _unit_vector(rng))], f"doc-{index}"), (key, index)
        )
    entries = pg_store.retain_ledger(bank.ref, "key-1")
    assert [(e.document_index, e.document_id, e.units, e.fingerprint) for e in entries] == [
        (0, "doc-0", 1, "fingerprint"),
        (1, "doc-1", 1, "fingerprint"),
    ]
    with pytest.raises(IdempotencyConflict, match="already running"):
        pg_store.write_document(bank.ref, _doc([_unit("b", _unit_vector(rng))], "x"), (key, 0))
    assert pg_store.get_document(bank.ref, "x") is None  # the whole transaction rolled back
    assert pg_store.list_units(bank.ref, UnitFilter(), 10, 0)[1] == 2
    with pg_store.db.write() as conn:  # an expired key is forgotten at the next read
        conn.execute("UPDATE memory_retain_ledger SET created_at = created_at - 2 * 86400")
    assert pg_store.retain_ledger(bank.ref, "key-1") == []


def test_a_cancelled_write_leaves_nothing(pg_store: PgMemoryStore) -> None:
    bank = _bank(pg_store)
    rng = np.random.default_rng(4)
    document = _doc([_unit(f"u{i}", _unit_vector(rng)) for i in range(600)], "big")
    token = CancellationToken()
    calls = {"n": 0}
    original = PgMemoryStore._unit_row

    def row_then_cancel(*args: Any) -> tuple[Any, ...]:
        calls["n"] += 1
        if calls["n"] == 300:  # in the second batch: the first is already inserted
            token.cancel("client disconnected")
        return original(*args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(PgMemoryStore, "_unit_row", staticmethod(row_then_cancel))
        with use_context(RequestContext(token=token)), pytest.raises(OperationCancelled):
            pg_store.write_document(bank.ref, document)
    assert calls["n"] >= 300
    assert pg_store.get_document(bank.ref, "big") is None
    assert _count(pg_store, "memory_units") == 0


def test_keyword_search_takes_any_input(pg_store: PgMemoryStore) -> None:
    bank = _bank(pg_store)
    rng = np.random.default_rng(5)
    pg_store.write_document(
        bank.ref,
        _doc([
            _unit("O'Brien's café serves \"strong\" coffee & tea (really!)", _unit_vector(rng)),
            _unit("Running shoes for the marathon", _unit_vector(rng)),
            _unit("A quiet evening with tea", _unit_vector(rng)),
        ]),
    )  # fmt: skip
    odd = [
        [],
        [""],
        ["   "],
        ["the", "and", "it"],  # stop words only
        ["'", '"', "&", "|", "!", ":*", "(", ")", "\\", "%", "_", "?"],
        ["o'brien's", 'str"ong', "tea)", "caf\u00e9", "nul\x00byte"],
        ["a" * 3000],
    ]
    for terms in odd:
        hits = pg_store.keyword_search(bank.ref, terms, 10)
        assert isinstance(hits, list), terms
    assert pg_store.keyword_search(bank.ref, [], 10) == []
    assert pg_store.keyword_search(bank.ref, ["the", "it"], 10) == []
    assert len(pg_store.keyword_search(bank.ref, ["o'brien's", "tea)"], 10)) == 2
    (hit,) = pg_store.keyword_search(bank.ref, ["runs"], 10)  # stemmed: runs ~ running
    assert hit[1] > 0
    top = pg_store.keyword_search(bank.ref, ["coffee", "tea"], 10)
    assert (
        top[0][0] == pg_store.list_units(bank.ref, UnitFilter(search="coffee"), 1, 0)[0][0].seq
    )  # both terms beat one
    assert top[0][1] > top[1][1] > 0
    assert pg_store.keyword_search(bank.ref, ["coffee"], 0) == []


def test_a_large_bank_scores_only_the_rarest_words_matches(pg_store: PgMemoryStore) -> None:
    """In a bank past the pruning size, a common word no longer brings in every unit it
    matches: the rare word's units are the candidates, and both words score them."""
    bank = _bank(pg_store)
    rng = np.random.default_rng(9)
    common = [_unit(f"caroline walked the dog number {i}", _unit_vector(rng)) for i in range(300)]
    rare = [_unit(f"caroline painted a sunrise, picture {i}", _unit_vector(rng)) for i in range(5)]
    pg_store.write_document(bank.ref, _doc(common + rare))
    with pg_store.db.write() as conn:
        conn.execute("ANALYZE memory_units")  # the planner's lexeme statistics
    exact = pg_store.keyword_search(bank.ref, ["caroline", "sunrise"], 400)
    assert len(exact) == 305  # every unit holds "caroline"
    assert pg_store._keyword_plan(bank.ref, ["caroline", "sunrise"]) is None  # a small bank

    pg_store.keyword_prune_above_units = 100
    pg_store.keyword_candidates = 50
    pg_store._bank_sizes.clear()
    plan = pg_store._keyword_plan(bank.ref, ["caroline", "sunrise"])
    assert plan is not None and plan.selective == {"sunrise"}
    pruned = pg_store.keyword_search(bank.ref, ["caroline", "sunrise"], 400)
    rare_seqs = {seq for seq, _ in exact[:5]}
    assert {seq for seq, _ in pruned} == rare_seqs  # only the rare word's units, all of them
    assert all(score > 0 for _, score in pruned)
    # a rare word alone is estimated within the bound: the search stays exact
    assert pg_store._keyword_plan(bank.ref, ["sunrise"]) is None


# -- vectors -------------------------------------------------------------------------------


def _write_vectors(
    store: PgMemoryStore, bank: Bank, vectors: np.ndarray, types: list[str]
) -> list[int]:
    units = [
        _unit(f"{bank.bank_id} unit {i}", v, fact_type=t)
        for i, (v, t) in enumerate(zip(vectors, types, strict=True))
    ]
    result = store.write_document(bank.ref, _doc(units))
    return [s for s, _ in result.added]


def test_vector_search_is_exact_on_a_small_bank_and_stays_in_its_bank(
    pg_store: PgMemoryStore,
) -> None:
    rng = np.random.default_rng(6)
    a, b = _bank(pg_store, "a"), _bank(pg_store, "b")
    va = np.stack([_unit_vector(rng) for _ in range(200)])
    vb = np.stack([_unit_vector(rng) for _ in range(200)])
    types = ["world" if i % 3 else "experience" for i in range(200)]
    seqs_a = np.asarray(_write_vectors(pg_store, a, va, types))
    seqs_b = _write_vectors(pg_store, b, vb, types)
    for _ in range(5):
        query = _unit_vector(rng)
        scores = va @ query
        order = np.argsort(-scores)[:10]
        hits = pg_store.vector_search(a.ref, query, 10, None)
        assert [s for s, _ in hits] == [int(seqs_a[i]) for i in order]
        assert np.allclose([c for _, c in hits], scores[order], atol=1e-5)
        experience = np.flatnonzero(np.asarray(types) == "experience")
        best = experience[np.argsort(-scores[experience])[:5]]
        typed = pg_store.vector_search(a.ref, query, 5, ["experience"])
        assert [s for s, _ in typed] == [int(seqs_a[i]) for i in best]
    # The other bank's nearest unit is never an answer of this bank.
    hits = pg_store.vector_search(a.ref, vb[0], 50, None)
    assert hits and not set(seqs_b) & {s for s, _ in hits}
    assert pg_store.vector_search(b.ref, vb[0], 1, None)[0][0] == seqs_b[0]
    assert pg_store.vector_search(a.ref, vb[0], 0, None) == []
    assert pg_store.vector_search(a.ref, vb[0], 5, []) == []
    assert pg_store.vector_search(a.ref, vb[0], 5, ["observation"]) == []


def _with_options(url: str, options: str) -> str:
    """*url* with more ``-c`` settings in its ``options`` parameter."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query)
    merged = [(k, f"{v} {options}" if k == "options" else v) for k, v in query]
    if not any(k == "options" for k, _ in query):
        merged.append(("options", options))
    return urlunsplit(parts._replace(query=urlencode(merged, quote_via=quote)))


def test_filtered_hnsw_search_still_returns_k_rows(pg_url: str) -> None:
    """A selective filter under an HNSW scan: the iterative scan keeps walking the graph.

    On a table this small the planner would sort the bank's rows exactly instead, so the
    sessions here disable sorting, which leaves the HNSW index as the only ordered path
    (as on a large table). Without the iterative scan the same query finds fewer rows.
    """
    database = PostgresDatabase(_with_options(pg_url, "-cenable_sort=off"), pool_size=2)
    try:
        store = PgMemoryStore(database, DIM)
        store.migrate()
        rng = np.random.default_rng(7)
        a, b = _bank(store, "a"), _bank(store, "b")
        n = 3000
        va = np.stack([_unit_vector(rng) for _ in range(n)])
        types = ["experience" if i % 100 == 0 else "world" for i in range(n)]  # 30 rare rows
        seqs_a = _write_vectors(store, a, va, types)
        _write_vectors(store, b, np.stack([_unit_vector(rng) for _ in range(n)]), ["world"] * n)
        rare = {seqs_a[i] for i in range(n) if types[i] == "experience"}
        query = _unit_vector(rng)
        literal = "[" + ",".join(map(str, query.tolist())) + "]"
        sql = (
            "SELECT seq FROM memory_units WHERE bank_ref = ? AND embedding IS NOT NULL"
            " AND fact_type = ANY(?::text[]) ORDER BY embedding <=> ?::vector LIMIT 20"
        )
        with database.write() as conn:
            conn.execute("ANALYZE memory_units")
            conn.execute("SET LOCAL hnsw.iterative_scan = off")
            plan = "\n".join(
                r[0] for r in conn.execute("EXPLAIN " + sql, (a.ref, ["experience"], literal))
            )
            assert "memory_units_embedding" in plan, plan  # the HNSW index
            plain = conn.execute(sql, (a.ref, ["experience"], literal)).fetchall()
        assert len(plain) < 20  # the control: a plain HNSW scan loses filtered rows
        hits = store.vector_search(a.ref, query, 20, ["experience"])
        assert len(hits) == 20 and {s for s, _ in hits} <= rare
        scores = [c for _, c in hits]
        assert scores == sorted(scores, reverse=True)
        exact = sorted(float(va[i] @ query) for i in range(n) if types[i] == "experience")
        assert scores[0] == pytest.approx(exact[-1], abs=1e-5)  # the best one is found
        unfiltered = store.vector_search(a.ref, query, 100, None)
        assert len(unfiltered) == 100 and set(seqs_a) >= {s for s, _ in unfiltered}
    finally:
        database.close()


def test_load_vectors_and_unit_vectors_round_trip(pg_store: PgMemoryStore) -> None:
    rng = np.random.default_rng(8)
    bank = _bank(pg_store)
    vectors = np.stack([_unit_vector(rng) for _ in range(20)])
    types = ["world", "experience"] * 10
    seqs = _write_vectors(pg_store, bank, vectors, types)
    pg_store.write_document(bank.ref, _doc([_unit("no vector", None)]))
    rows = pg_store.load_vectors(bank.ref)
    assert rows.seqs.tolist() == seqs and rows.types == types
    assert rows.matrix.dtype == np.float32 and np.array_equal(rows.matrix, vectors)  # exact
    got = pg_store.unit_vectors(bank.ref, [seqs[3], seqs[7], 10**12])
    assert set(got) == {seqs[3], seqs[7]} and np.array_equal(got[seqs[3]], vectors[3])
    assert pg_store.unit_vectors(_bank(pg_store, "empty").ref, seqs) == {}
    empty = pg_store.load_vectors(str(uuid.uuid4()))
    assert empty.seqs.shape == (0,) and empty.matrix.shape == (0, 0)


# -- cancellation --------------------------------------------------------------------------


def _cancel_later(token: CancellationToken, delay: float) -> threading.Timer:
    timer = threading.Timer(delay, token.cancel, args=("client disconnected",))
    timer.start()
    return timer


def test_cancel_stops_a_running_statement_and_the_connection_is_reused(pg_url: str) -> None:
    database = PostgresDatabase(pg_url, pool_size=1)  # one connection: the next call reuses it
    try:
        store = PgMemoryStore(database, DIM)
        store.migrate()
        bank = _bank(store)
        store.write_document(
            bank.ref, _doc([_unit("garden note", _unit_vector(np.random.default_rng(9)))])
        )
        for transaction in (False, True):
            token = CancellationToken()
            _cancel_later(token, 0.3)
            started = time.monotonic()
            with (
                use_context(RequestContext(token=token)),
                pytest.raises(OperationCancelled) as info,
                store._cancellable(transaction=transaction) as q,
            ):
                q.execute("SELECT pg_sleep(10)")
            assert time.monotonic() - started < STOP_BOUND
            assert info.value.reason == "client disconnected"
            assert isinstance(info.value.__cause__, psycopg.errors.QueryCanceled)
            with database.read() as conn:
                assert conn.raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
                assert conn.execute("SELECT 1").fetchone()[0] == 1
            assert len(store.keyword_search(bank.ref, ["garden"], 10)) == 1
        # A token cancelled before the call: no statement starts.
        token = CancellationToken()
        token.cancel("gone")
        with use_context(RequestContext(token=token)), pytest.raises(OperationCancelled):
            store.keyword_search(bank.ref, ["garden"], 10)
        # A query that ends before any cancel: nothing is cancelled later on that connection.
        token = CancellationToken()
        with use_context(RequestContext(token=token)):
            assert len(store.keyword_search(bank.ref, ["garden"], 10)) == 1
        token.cancel("late")
        with database.read() as conn:
            assert conn.execute("SELECT pg_sleep(0.5), 1").fetchone()[1] == 1
    finally:
        database.close()


def test_a_statement_timeout_is_not_a_cancellation(pg_store: PgMemoryStore) -> None:
    with (
        use_context(RequestContext()),
        pytest.raises(psycopg.errors.QueryCanceled),
        pg_store._cancellable(transaction=True) as q,
    ):
        q.execute("SET LOCAL statement_timeout = 100")
        q.execute("SELECT pg_sleep(5)")


def _slow_statements(marker: str, when: str) -> Any:
    """``_Statements.execute`` sleeping 10 s in SQL before each statement containing *when*."""
    original = _Statements.execute

    def execute(self: _Statements, sql: str, params: Any = None) -> Any:
        if when in sql:
            original(self, f"SELECT pg_sleep(10) /* {marker} */", ())
        return original(self, sql, params)

    return execute


def _sleeping(database: PostgresDatabase, marker: str) -> bool:
    with database.read() as conn:
        row = conn.execute(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE ?",
            (f"%pg_sleep(10) /* {marker} */%",),
        ).fetchone()
    return int(row[0]) > 0


async def test_cancelling_a_recall_stops_its_keyword_query_in_the_server(
    tmp_path: Path, pg_store: PgMemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(data_dir=tmp_path)
    engine = build_memory_engine(settings, pg_store, build_lanes(settings))
    await engine.start()
    with use_context(RequestContext()):
        bank = await engine.put_bank("cancel", {})
        await engine.retain(bank, [RetainItem(content="Alice waters the tomato garden.")])
    marker = "heed-test-" + uuid.uuid4().hex
    monkeypatch.setattr(_Statements, "execute", _slow_statements(marker, "plainto_tsquery"))
    ctx = RequestContext()
    with use_context(ctx):
        task = asyncio.create_task(engine.recall(bank, RecallQuery(query="tomato garden")))
    deadline = time.monotonic() + 10
    while not await asyncio.to_thread(_sleeping, pg_store.db, marker):
        assert time.monotonic() < deadline, "the slow keyword query never started"
        await asyncio.sleep(0.02)
    started = time.monotonic()
    ctx.token.cancel("client disconnected")
    with pytest.raises(OperationCancelled):
        await asyncio.wait_for(task, 10)
    assert time.monotonic() - started < STOP_BOUND
    assert not await asyncio.to_thread(_sleeping, pg_store.db, marker)
    monkeypatch.undo()
    with use_context(RequestContext()):
        outcome = await engine.recall(bank, RecallQuery(query="tomato garden"))
    assert outcome.hits and "tomato" in outcome.hits[0].unit.text


# -- several writers ---------------------------------------------------------------------


def test_concurrent_writers_into_one_bank(pg_url: str) -> None:
    """Threads on two databases (as two processes would be) write one bank at once."""
    databases = [PostgresDatabase(pg_url, pool_size=4) for _ in range(2)]
    try:
        stores = [PgMemoryStore(d, DIM) for d in databases]
        for store in stores:
            store.migrate()
        bank = _bank(stores[0])
        rng = np.random.default_rng(10)
        names = ["Alice", "Bob", "Carol", "Dan", "Eve"]
        threads_n, docs_per_thread, units_per_doc = 6, 5, 20
        plans = [
            [
                _doc(
                    [
                        _unit(
                            f"thread {t} doc {d} unit {u}",
                            _unit_vector(rng),
                            entities=[names[(t + u) % 5], names[(d + u) % 5]],
                        )
                        for u in range(units_per_doc)
                    ],
                    f"t{t}-d{d}",
                )
                for d in range(docs_per_thread)
            ]
            for t in range(threads_n)
        ]
        errors: list[BaseException] = []
        results: dict[str, list[int]] = {}
        barrier = threading.Barrier(threads_n)

        def work(t: int) -> None:
            try:
                store = stores[t % 2]
                barrier.wait(10)
                for d, document in enumerate(plans[t]):
                    key = RetainKey(f"key-{t}", "fp")
                    result = store.write_document(bank.ref, document, (key, d))
                    results[document.document_id] = [s for s, _ in result.added]
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(threads_n)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not errors, errors
        total_units = threads_n * docs_per_thread * units_per_doc
        store = stores[1]
        assert store.list_units(bank.ref, UnitFilter(), 1, 0)[1] == total_units
        stats = store.bank_stats(bank.ref)
        assert stats.units_by_type == {"world": total_units}
        assert stats.documents == threads_n * docs_per_thread
        assert stats.links_by_type["temporal"] == 2 * threads_n * docs_per_thread * (
            units_per_doc - 1
        )
        assert _count(store, "memory_entities") == len(names)
        assert _count(store, "memory_unit_entities") == sum(
            len({e.name for e in u.entities}) for p in plans for d in p for u in d.units
        )
        for seqs in results.values():  # each document's units are consecutive
            assert seqs == list(range(seqs[0], seqs[0] + units_per_doc))
            assert seqs[0] % SEQ_BLOCK == 1
        assert len({s for seqs in results.values() for s in seqs}) == total_units
        assert sum(len(store.retain_ledger(bank.ref, f"key-{t}")) for t in range(threads_n)) == (
            threads_n * docs_per_thread
        )

        # Two writers racing on one ledger entry: exactly one writes, the other is told.
        outcomes: list[str] = []
        race = threading.Barrier(2)

        def same_key(t: int) -> None:
            document = _doc([_unit(f"race {t}", _unit_vector(np.random.default_rng(t)))])
            race.wait(10)
            try:
                stores[t].write_document(bank.ref, document, (RetainKey("race", "fp"), 0))
                outcomes.append("written")
            except IdempotencyConflict:
                outcomes.append("conflict")

        racers = [threading.Thread(target=same_key, args=(t,)) for t in range(2)]
        for thread in racers:
            thread.start()
        for thread in racers:
            thread.join(30)
        assert sorted(outcomes) == ["conflict", "written"]
        assert store.list_units(bank.ref, UnitFilter(search="race "), 10, 0)[1] == 1
    finally:
        for database in databases:
            database.close()


# -- whole recalls, SQLite and PostgreSQL side by side -------------------------------------


@pytest.fixture
async def engines(tmp_path: Path, pg_store: PgMemoryStore) -> tuple[MemoryEngine, MemoryEngine]:
    settings = Settings(data_dir=tmp_path)
    lite = build_memory_engine(
        settings, SqliteMemoryStore(Database(tmp_path / "lite.db")), build_lanes(settings)
    )
    pg = build_memory_engine(settings, pg_store, build_lanes(settings))
    for engine in (lite, pg):
        await engine.start()
    return lite, pg


QUERIES = [
    # (query, expected text fragment, the arm that must have found something)
    ("What kind of pet does Alice have?", "grey cat named Luna", "semantic"),
    ("sourdough", "sourdough", "keyword"),
    ("What does Marcus Chen do for a living?", "marine biologist", "graph"),
    ("Who got engaged in February 2022?", "proposed to Sofia", "temporal"),
    ("Tell me about Kenji and the marathon", "Kenji", "graph"),
]


async def test_recall_on_postgres_matches_recall_on_sqlite(
    engines: tuple[MemoryEngine, MemoryEngine],
) -> None:
    outcomes: list[dict[str, Any]] = []
    for engine in engines:
        with use_context(RequestContext()):
            bank = await engine.put_bank("parity", {})
            await engine.retain(bank, _fact_items())
            per_query = {}
            for query, _expected, _arm in QUERIES:
                per_query[query] = await engine.recall(
                    bank,
                    RecallQuery(
                        query=query,
                        trace=True,
                        include_chunks=True,
                        include_entities=True,
                        query_timestamp=datetime(2024, 1, 1, tzinfo=UTC),
                    ),
                )
        outcomes.append(per_query)
    lite, pg = outcomes
    for query, expected, arm in QUERIES:
        a, b = lite[query], pg[query]
        assert a.trace is not None and b.trace is not None
        assert [s["stage"] for s in a.trace["stages"]] == [s["stage"] for s in b.trace["stages"]]
        assert set(a.trace["arms"]) == set(b.trace["arms"]), query
        assert b.trace["arms"][arm], (query, arm)
        assert a.trace["query"] == b.trace["query"]
        for outcome in (a, b):
            top3 = [h.unit.text for h in outcome.hits[:3]]
            assert any(expected in text for text in top3), (query, top3)
            assert outcome.entities is not None and outcome.chunks is not None
        top_a = [h.unit.text for h in a.hits[:10]]
        top_b = [h.unit.text for h in b.hits[:10]]
        assert len(top_a) == len(top_b)
        overlap = len(set(top_a) & set(top_b)) / len(top_a)
        assert overlap >= 0.7, (query, top_a, top_b)
        hit_a, hit_b = a.hits[0], b.hits[0]
        assert sorted(asdict(hit_a)) == sorted(asdict(hit_b))
        assert (hit_a.semantic is None) == (hit_b.semantic is None)
        assert set(a.entities or {}) & set(b.entities or {}) or not a.entities
    keyword = pg["sourdough"].hits[0]
    assert keyword.keyword is not None and keyword.keyword > 0
