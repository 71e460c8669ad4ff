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

import pytest

from heed.memory import MemoryEngine, build_memory_engine
from heed.memory.models import Bank, Conflict, NotFound, RetainItem
from heed.runtime import RequestContext, use_context
from heed.services import build_lanes
from heed.settings import Settings
from heed.storage import Database
from heed.storage.memory_store import SqliteMemoryStore
from heed.storage.pg_memory_store import PgMemoryStore
from heed.storage.postgres import PostgresDatabase
from tests.pg_support import fresh_schema

#: Tables whose rows belong to a bank (by ``bank_ref``).
BANK_TABLES = (
    "memory_banks",
    "memory_documents",
    "memory_chunks",
    "memory_units",
    "memory_entities",
    "memory_retain_ledger",
)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Any, Any]]:
    """Two stores on one database, each with its own connections."""
    if request.param == "sqlite":
        databases: list[Any] = [Database(tmp_path / "shared.db") for _ in range(2)]
        stores: list[Any] = [SqliteMemoryStore(db) for db in databases]
        try:
            yield stores[0], stores[1]
        finally:
            for db in databases:
                db.close()
        return
    with fresh_schema() as url:
        databases = [PostgresDatabase(url, pool_size=4) for _ in range(2)]
        stores = [PgMemoryStore(db) for db in databases]
        try:
            yield stores[0], stores[1]
        finally:
            for db in databases:
                db.close()


@pytest.fixture
async def engine_pair(
    store_pair: tuple[Any, Any], tmp_path: Path
) -> AsyncIterator[tuple[MemoryEngine, MemoryEngine]]:
    settings = Settings(data_dir=tmp_path)
    a, b = (build_memory_engine(settings, store, build_lanes(settings)) for store in store_pair)
    await a.start()
    await b.start()
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
