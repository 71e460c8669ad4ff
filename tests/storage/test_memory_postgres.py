"""The memory store on PostgreSQL + pgvector, on a real server (see :mod:`tests.pg_support`),
beside SQLite. What every database must do is ``test_memory_store.py``; here:

- both databases side by side: real retains (MiniLM vectors, entities, dates) written to
  each answer every method alike, and whole recalls through two engines agree;
- what only PostgreSQL has: schema checks (vector size, pgvector), HNSW's iterative scans
  under filters, keyword pruning in a large bank;
- what SQLite's single writer gives for free: cancelling a running statement in the server,
  several writers in one bank.

Time bounds are generous: a cancelled 10 s statement must stop within 2 s.
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
from heed.memory.retain.idempotency import IdempotencyConflict, RetainKey
from heed.memory.retain.prepare import plan_documents, prepare_documents
from heed.memory.store import UnitFilter
from heed.runtime import CancellationToken, OperationCancelled, RequestContext, use_context
from heed.services import build_lanes
from heed.settings import Settings
from heed.storage import SqliteDatabase, schema_version
from heed.storage.memory import SqlMemoryStore, memory_migrations
from heed.storage.memory.postgres import PostgresMemory, SchemaMismatch
from heed.storage.memory.schema import SEQ_BLOCK
from heed.storage.postgres import PostgresDatabase, Statements
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
def pg_store(pg_db: PostgresDatabase) -> SqlMemoryStore:
    store = SqlMemoryStore(pg_db, DIM)
    store.migrate()
    return store


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[SqlMemoryStore]:
    database = SqliteDatabase(tmp_path / "memory.db")
    store = SqlMemoryStore(database)
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


def _postgres(store: SqlMemoryStore) -> PostgresMemory:
    assert isinstance(store.dialect, PostgresMemory)
    return store.dialect


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


def test_migrate_refuses_another_dimension_and_an_old_pgvector(
    pg_store: SqlMemoryStore, pg_db: PostgresDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    pg_store.migrate()  # again: nothing to do
    assert schema_version(pg_db, "memory") == memory_migrations()[-1].version
    with pytest.raises(SchemaMismatch, match="384-dimensional vectors but the embedder makes 512"):
        SqlMemoryStore(pg_db, 512).migrate()
    monkeypatch.setattr("heed.storage.memory.postgres.PGVECTOR_MIN", (99, 0, 0))
    with pytest.raises(SchemaMismatch, match=r"pgvector is version [0-9.]+; .* 0.8 or later"):
        pg_store.migrate()


# -- parity with SQLite, method by method -------------------------------------------------


def test_real_retains_read_back_alike_on_both_databases(
    pg_store: SqlMemoryStore, sqlite_store: SqlMemoryStore
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


def test_keyword_search_drops_stop_words(pg_store: SqlMemoryStore) -> None:
    """PostgreSQL's English configuration (SQLite's porter tokenizer keeps them)."""
    bank = _bank(pg_store)
    pg_store.write_document(bank.ref, _doc([_unit("the cat and it", None)]))
    assert pg_store.keyword_search(bank.ref, ["the", "and", "it"], 10) == []
    assert len(pg_store.keyword_search(bank.ref, ["the", "cat"], 10)) == 1


def test_a_large_bank_scores_only_the_rarest_words_matches(pg_store: SqlMemoryStore) -> None:
    """In a bank past the pruning size, a common word no longer brings in every unit it
    matches: the rare word's units are the candidates, and both words score them."""
    bank = _bank(pg_store)
    rng = np.random.default_rng(9)
    common = [_unit(f"caroline walked the dog number {i}", _unit_vector(rng)) for i in range(300)]
    rare = [_unit(f"caroline painted a sunrise, picture {i}", _unit_vector(rng)) for i in range(5)]
    pg_store.write_document(bank.ref, _doc(common + rare))
    with pg_store.db.write() as conn:
        conn.execute("ANALYZE memory_units")  # the planner's lexeme statistics
    keywords = _postgres(pg_store).keywords
    exact = pg_store.keyword_search(bank.ref, ["caroline", "sunrise"], 400)
    assert len(exact) == 305  # every unit holds "caroline"
    assert keywords.plan(bank.ref, ["caroline", "sunrise"]) is None  # a small bank

    keywords.prune_above_units = 100
    keywords.candidates = 50
    keywords.forget_sizes()
    plan = keywords.plan(bank.ref, ["caroline", "sunrise"])
    assert plan is not None and plan.selective == {"sunrise"}
    pruned = pg_store.keyword_search(bank.ref, ["caroline", "sunrise"], 400)
    rare_seqs = {seq for seq, _ in exact[:5]}
    assert {seq for seq, _ in pruned} == rare_seqs  # only the rare word's units, all of them
    assert all(score > 0 for _, score in pruned)
    # a rare word alone is estimated within the bound: the search stays exact
    assert keywords.plan(bank.ref, ["sunrise"]) is None


# -- vectors -------------------------------------------------------------------------------


def _write_vectors(
    store: SqlMemoryStore, bank: Bank, vectors: np.ndarray, types: list[str]
) -> list[int]:
    units = [
        _unit(f"{bank.bank_id} unit {i}", v, fact_type=t)
        for i, (v, t) in enumerate(zip(vectors, types, strict=True))
    ]
    result = store.write_document(bank.ref, _doc(units))
    return [s for s, _ in result.added]


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
        store = SqlMemoryStore(database, DIM)
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


# -- cancellation --------------------------------------------------------------------------


def _cancel_later(token: CancellationToken, delay: float) -> threading.Timer:
    timer = threading.Timer(delay, token.cancel, args=("client disconnected",))
    timer.start()
    return timer


def test_cancel_stops_a_running_statement_and_the_connection_is_reused(pg_url: str) -> None:
    database = PostgresDatabase(pg_url, pool_size=1)  # one connection: the next call reuses it
    try:
        store = SqlMemoryStore(database, DIM)
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
                database.cancellable(transaction=transaction) as q,
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


def test_a_statement_timeout_is_not_a_cancellation(pg_store: SqlMemoryStore) -> None:
    with (
        use_context(RequestContext()),
        pytest.raises(psycopg.errors.QueryCanceled),
        pg_store.db.cancellable(transaction=True) as q,
    ):
        q.execute("SET LOCAL statement_timeout = 100")
        q.execute("SELECT pg_sleep(5)")


def _slow_statements(marker: str, when: str) -> Any:
    """``Statements.execute`` sleeping 10 s in SQL before each statement containing *when*."""
    original = Statements.execute

    def execute(self: Statements, sql: str, params: Any = None) -> Any:
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
    tmp_path: Path, pg_store: SqlMemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(data_dir=tmp_path)
    engine = build_memory_engine(settings, pg_store, build_lanes(settings))
    with use_context(RequestContext()):
        bank = await engine.put_bank("cancel", {})
        await engine.retain(bank, [RetainItem(content="Alice waters the tomato garden.")])
    marker = "heed-test-" + uuid.uuid4().hex
    monkeypatch.setattr(Statements, "execute", _slow_statements(marker, "plainto_tsquery"))
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
        stores = [SqlMemoryStore(d, DIM) for d in databases]
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
def engines(
    tmp_path: Path, pg_store: SqlMemoryStore, sqlite_store: SqlMemoryStore
) -> tuple[MemoryEngine, MemoryEngine]:
    settings = Settings(data_dir=tmp_path)
    lite = build_memory_engine(settings, sqlite_store, build_lanes(settings))
    pg = build_memory_engine(settings, pg_store, build_lanes(settings))
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
