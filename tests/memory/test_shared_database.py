"""Several engines on one database: what each sees of the others' writes and deletes.

Two instances of ``heed serve`` on PostgreSQL, or ``heed serve`` and ``heed mcp`` on one
SQLite data dir, are two memory engines sharing one database, each with its own
in-process state (a 1-second bank cache, vector indexes). Here they are two engines in
this process on one database (a PostgreSQL schema, or one SQLite file opened twice, as
two processes would), or two real processes where only a process boundary shows it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from mcp import Client

from heed.api.app import create_app
from heed.memory import MemoryEngine, build_memory_engine
from heed.memory import engine as engine_module
from heed.memory.models import Bank, Conflict, NotFound, RecallQuery, RetainItem
from heed.memory.store import UnitFilter
from heed.runtime import RequestContext, use_context
from heed.services import build_lanes
from heed.settings import Settings
from heed.storage import SqliteDatabase
from heed.storage.memory import SqlMemoryStore
from heed.storage.postgres import PostgresDatabase
from tests.mcp_api.test_mcp_server import data
from tests.mcp_api.test_mcp_stdio import heed_mcp
from tests.pg_support import fresh_schema
from tests.support import live_server

#: Tables whose rows belong to a bank (by ``bank_ref``).
BANK_TABLES = (
    "memory_banks",
    "memory_documents",
    "memory_chunks",
    "memory_units",
    "memory_entities",
    "memory_retain_ledger",
)


def _migrated(databases: list[Any]) -> tuple[SqlMemoryStore, SqlMemoryStore]:
    a, b = (SqlMemoryStore(db) for db in databases)
    a.migrate()
    b.migrate()
    return a, b


@pytest.fixture(params=["sqlite", "postgresql"])
def store_pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Any, Any]]:
    """Two stores on one database, each with its own connections."""
    if request.param == "sqlite":
        databases: list[Any] = [SqliteDatabase(tmp_path / "shared.db") for _ in range(2)]
        try:
            yield _migrated(databases)
        finally:
            for db in databases:
                db.close()
        return
    with fresh_schema() as url:
        databases = [PostgresDatabase(url, pool_size=4) for _ in range(2)]
        try:
            yield _migrated(databases)
        finally:
            for db in databases:
                db.close()


@pytest.fixture
async def engine_pair(
    store_pair: tuple[Any, Any], tmp_path: Path
) -> AsyncIterator[tuple[MemoryEngine, MemoryEngine]]:
    settings = Settings(data_dir=tmp_path)
    a, b = (build_memory_engine(settings, store, build_lanes(settings)) for store in store_pair)
    with use_context(RequestContext()):
        yield a, b


def _rows(engine: MemoryEngine, bank_ref: str) -> dict[str, int]:
    store: Any = engine.store
    with store.db.read() as conn:
        return {
            table: int(
                conn.execute(
                    f"SELECT COUNT(*) FROM {table} WHERE"
                    f" {'ref' if table == 'memory_banks' else 'bank_ref'} = ?",
                    (bank_ref,),
                ).fetchone()[0]
            )
            for table in BANK_TABLES
        }


@pytest.mark.parametrize("key", [None, "retry-1"])
async def test_a_retain_into_a_bank_the_other_instance_deleted_is_not_found(
    engine_pair: tuple[MemoryEngine, MemoryEngine], key: str | None
) -> None:
    a, b = engine_pair
    await a.put_bank("x", {})
    bank = await b.get_bank("x")  # B looks it up (and keeps it for a second)
    await a.delete_bank("x")
    assert (await b.get_bank("x")).ref == bank.ref  # still cached on B: the race is open

    with pytest.raises(NotFound, match="'x' not found"):
        await b.retain(
            bank,
            [RetainItem(content="Ottoline keeps three tabby cats.", entities=[])],
            ["t"],
            idempotency_key=key,
        )
    assert _rows(a, bank.ref) == dict.fromkeys(BANK_TABLES, 0)  # nothing written
    with pytest.raises(NotFound):
        await b.get_bank("x")  # and B forgot the bank


async def test_work_naming_a_bank_the_other_instance_replaced_lands_in_the_new_bank(
    engine_pair: tuple[MemoryEngine, MemoryEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deletes bank x and creates it again while B keeps the old row in its cache: work
    B runs through ``on_bank`` (as a request naming x does) reads x again when the row it
    was given is gone, and runs once more on the new bank. A write: the retain succeeds,
    into the new bank; reads: the list and the recall find the new bank's memories, not
    nothing. Gone and not created again: 404, as before."""
    monkeypatch.setattr(engine_module, "BANK_CACHE_SECONDS", 3600.0)  # B never re-reads alone
    a, b = engine_pair
    first = await a.put_bank("x", {})
    await a.retain(first, [RetainItem(content="The first bank: Dora keeps bees.")])

    async def replaced_behind_b(text: str) -> Bank:
        stale = await b.get_bank("x")
        await a.delete_bank("x")
        new = await a.put_bank("x", {})
        await a.retain(new, [RetainItem(content=text)])
        assert (await b.get_bank("x")).ref == stale.ref != new.ref  # the race is open
        return new

    def listing(bank: Bank) -> Any:
        return b.list_units(bank, UnitFilter(), 10, 0)

    second = await replaced_behind_b("The second bank: Ottoline keeps three tabby cats.")
    units, total = await b.on_bank("x", listing, found=lambda page: bool(page[0]))
    assert total == 1
    assert [u.text for u in units] == ["The second bank: Ottoline keeps three tabby cats."]
    assert (await b.get_bank("x")).ref == second.ref  # B keeps the new row now

    third = await replaced_behind_b("The third bank: Bruno runs marathons.")
    summary = await b.on_bank(
        "x", lambda bank: b.retain(bank, [RetainItem(content="Written through B.")])
    )
    assert summary.units == 1
    assert _rows(a, third.ref)["memory_units"] == 2 and _rows(a, second.ref)["memory_units"] == 0
    texts = sorted(u.text for u in (await a.list_units(third, UnitFilter(), 10, 0))[0])
    assert texts == ["The third bank: Bruno runs marathons.", "Written through B."]

    await replaced_behind_b("The fourth bank: Priya bakes sourdough.")
    found = await b.on_bank(
        "x",
        lambda bank: b.recall(bank, RecallQuery(query="sourdough")),
        found=lambda o: bool(o.hits),
    )
    assert [h.unit.text for h in found.hits] == ["The fourth bank: Priya bakes sourdough."]

    stale = await b.get_bank("x")
    await a.delete_bank("x")  # and not created again
    with pytest.raises(NotFound, match="'x' not found"):
        await b.on_bank("x", listing, found=lambda page: bool(page[0]))
    with pytest.raises(NotFound, match="'x' not found"):
        await b.on_bank("x", lambda bank: b.retain(bank, [RetainItem(content="Lost.")]))
    assert _rows(a, stale.ref) == dict.fromkeys(BANK_TABLES, 0)


async def test_an_update_of_a_bank_the_other_instance_deleted_writes_nothing(
    engine_pair: tuple[MemoryEngine, MemoryEngine],
) -> None:
    a, b = engine_pair
    created = await a.put_bank("x", {"mission": "first"})
    stored: Any = b.store
    row = stored.get_bank(created.tenant, "x")
    await a.delete_bank("x")
    row.mission = "second"
    with pytest.raises(NotFound):  # the store refuses to resurrect it under the old ref
        stored.save_bank(row)
    assert _rows(a, created.ref)["memory_banks"] == 0


async def test_two_instances_creating_one_bank_at_once(
    engine_pair: tuple[MemoryEngine, MemoryEngine],
) -> None:
    a, b = engine_pair
    await a.put_bank("x", {"mission": "from a"})
    stored: Any = b.store
    late = Bank(tenant="default", bank_id="x", ref="another-ref", name="x", mission="from b")
    with pytest.raises(Conflict, match="retry"):  # B looked before A created it
        stored.save_bank(late)
    assert (await b.put_bank("x", {"mission": "from b"})).mission == "from b"  # the retry
    assert (await a.get_bank("x")).ref == (await b.get_bank("x")).ref


# -- one SQLite data dir, two processes: every write is found by the other's recall --------


async def test_serve_and_mcp_on_one_data_dir_find_each_others_writes(tmp_path: Path) -> None:
    """The reproduction of issue #28 row 26: ``heed mcp`` (a child process, over stdio) and
    a server (this process) on one data dir, each having recalled the bank once (so each
    holds its vector index). A fact retained on one side must be found by a recall on the
    other whose words share nothing with it: only the semantic arm can find it."""
    data_dir = tmp_path / "data"
    settings = Settings(data_dir=data_dir, llm_provider="scripted")
    with live_server(create_app(settings)) as server:
        async with (
            httpx.AsyncClient(base_url=server.url, timeout=60) as http,
            Client(heed_mcp(data_dir)) as stdio,
        ):
            put = await http.put("/v1/default/banks/pets", json={})
            assert put.status_code in (200, 201), put.text

            async def over_http(query: str) -> list[str]:
                r = await http.post("/v1/default/banks/pets/memories/recall", json={"query": query})
                assert r.status_code == 200, r.text
                return [hit["text"] for hit in r.json()["results"]]

            async def over_stdio(query: str) -> list[str]:
                found = data(await stdio.call_tool("recall", {"bank_id": "pets", "query": query}))
                return [hit["text"] for hit in found["results"]]

            seed = await http.post(
                "/v1/default/banks/pets/memories",
                json={"items": [{"content": "The weather in Lisbon was mild all week."}]},
            )
            assert seed.status_code == 200, seed.text
            assert await over_http("weather") and await over_stdio("weather")  # both loaded

            data(
                await stdio.call_tool(
                    "retain",
                    {"bank_id": "pets", "items": [{"content": "Ottoline keeps three tabby cats."}]},
                )
            )
            assert any("tabby cats" in t for t in await over_http("feline companions she loves"))

            wrote = await http.post(
                "/v1/default/banks/pets/memories",
                json={"items": [{"content": "Bartholomew grows enormous pumpkins."}]},
            )
            assert wrote.status_code == 200, wrote.text
            assert any("pumpkins" in t for t in await over_stdio("giant squash in his garden"))


@pytest.mark.parametrize("store_pair", ["sqlite"], indirect=True)
async def test_an_index_drops_what_another_process_deleted_and_rereads_a_reused_seq(
    engine_pair: tuple[MemoryEngine, MemoryEngine],
) -> None:
    a, b = engine_pair
    bank = await a.put_bank("x", {})
    for text, doc in (("Alma rides a red bicycle.", "d1"), ("Alma paints in oils.", "d1")):
        await a.retain(bank, [RetainItem(content=text, document_id=doc, update_mode="append")])
    await a.retain(bank, [RetainItem(content="Bruno sails on Sundays.", document_id="d2")])
    await a.retain(bank, [RetainItem(content="Eva plays the cello.", document_id="d3")])
    query = RecallQuery(query="hobbies")
    assert len((await b.recall(bank, query)).hits) == 4
    index = b.indexes.get(bank.ref)
    assert len(index) == 4

    await a.delete_document(bank, "d1")
    await b.recall(bank, query)
    assert len(index) == 2  # B's index forgot A's deletion

    # SQLite gives the largest rowid again once its row is gone: the same seq, another unit.
    units = {u.text: u for u in (await a.list_units(bank, UnitFilter(), 10, 0))[0]}
    eva = units["Eva plays the cello."]
    await a.delete_unit(bank, eva.id)
    await a.retain(bank, [RetainItem(content="Chiara collects vintage typewriters.")])
    units = {u.text: u for u in (await a.list_units(bank, UnitFilter(), 10, 0))[0]}
    chiara = units["Chiara collects vintage typewriters."]
    assert chiara.seq == eva.seq
    hits = (await b.recall(bank, RecallQuery(query="old writing machines"))).hits
    assert hits[0].unit.text == chiara.text
    stored = a.store.load_vectors(bank.ref)
    row = list(stored.seqs).index(chiara.seq)
    assert np.array_equal(index.vectors_for([chiara.seq])[chiara.seq], stored.matrix[row])


@pytest.mark.parametrize("store_pair", ["sqlite"], indirect=True)
async def test_a_recall_of_a_bank_another_process_deleted_is_not_found(
    engine_pair: tuple[MemoryEngine, MemoryEngine],
) -> None:
    a, b = engine_pair
    bank = await a.put_bank("x", {})
    await a.retain(bank, [RetainItem(content="Dora keeps bees.")])
    await b.recall(bank, RecallQuery(query="bees"))
    await a.delete_bank("x")
    with pytest.raises(NotFound, match="'x' not found"):
        await b.recall(bank, RecallQuery(query="bees"))
    assert b.indexes.loaded() == []


async def test_a_recall_finds_what_the_other_engine_just_retained(
    engine_pair: tuple[MemoryEngine, MemoryEngine],
) -> None:
    """Both databases: on SQLite through the generation check, on PostgreSQL because no
    engine holds vectors (pgvector searches them)."""
    a, b = engine_pair
    bank = await a.put_bank("x", {})
    await a.retain(bank, [RetainItem(content="The weather in Lisbon was mild all week.")])
    assert len((await b.recall(bank, RecallQuery(query="weather"))).hits) == 1  # B is loaded
    await a.retain(bank, [RetainItem(content="Ottoline keeps three tabby cats.")])
    found = await b.recall(bank, RecallQuery(query="feline companions she loves", trace=True))
    assert found.trace is not None
    semantic = found.trace["arms"]["semantic"]
    texts = {h.unit.text for h in found.hits}
    assert "Ottoline keeps three tabby cats." in texts and len(semantic) == 2
