"""Lists a retain copies onto every document and unit are stored once (issue #28 row 4).

A request's ``document_tags`` go onto each of its documents and units, an item's tags and
metadata onto each of its units. The stores keep each such value once per bank
(:mod:`heed.storage.memory.values`): what a bank holds grows with the distinct values, not
with the rows that carry them. On both databases, through the engine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from heed.memory import MemoryEngine, build_memory_engine
from heed.memory.models import Bank, RecallQuery, RetainItem
from heed.memory.store import UnitFilter
from heed.runtime import RequestContext, use_context
from heed.services import build_lanes
from heed.settings import Settings
from heed.storage import SqlDatabase
from heed.storage.memory import SqlMemoryStore

#: 64 document tags of 256 characters: the most a request may send (16 KB as JSON).
DOCUMENT_TAGS = [f"tag-{i:02d}-" + "x" * 249 for i in range(64)]
TAGS_JSON = 64 * 258 + 63 * 2 + 2
ROW_TABLES = ("memory_units", "memory_documents")


@pytest.fixture
async def engine(sql_database: SqlDatabase, tmp_path: Path) -> AsyncIterator[MemoryEngine]:
    store = SqlMemoryStore(sql_database)
    store.migrate()
    settings = Settings(data_dir=tmp_path)
    eng = build_memory_engine(settings, store, build_lanes(settings))
    with use_context(RequestContext()):
        yield eng


def _stored_chars(engine: MemoryEngine, column: str, tables: tuple[str, ...] = ROW_TABLES) -> int:
    """Characters of *column* (``tags``, ``metadata``, ``context``) held for the units and
    documents (*tables*), shared values included."""
    db: Any = engine.store.db  # type: ignore[attr-defined]
    sums = [f"SELECT COALESCE(SUM(LENGTH({column})), 0) FROM {t}" for t in tables]
    with db.read() as conn:
        total = sum(int(conn.execute(sql).fetchone()[0]) for sql in sums)
        shared = "SELECT COALESCE(SUM(LENGTH(body)), 0) FROM memory_values"
        return total + int(conn.execute(shared).fetchone()[0])


def _values(engine: MemoryEngine) -> int:
    db: Any = engine.store.db  # type: ignore[attr-defined]
    with db.read() as conn:
        return int(conn.execute("SELECT COUNT(*) FROM memory_values").fetchone()[0])


async def test_document_tags_are_stored_once_however_many_items_carry_them(
    engine: MemoryEngine,
) -> None:
    bank = await engine.put_bank("b", {})
    items = [RetainItem(content=f"Fact {i} about the garden shed.") for i in range(200)]
    summary = await engine.retain(bank, items, DOCUMENT_TAGS)
    assert summary.documents == 200 and summary.units == 200

    # Before: 400 copies of 16.7 KB (6.7 MB). Now one, and a reference per row.
    assert _stored_chars(engine, "tags") < 2 * TAGS_JSON
    units, total = await engine.list_units(bank, UnitFilter(), 1000, 0)
    assert total == 200 and all(u.tags == DOCUMENT_TAGS for u in units)
    document = await engine.get_document(bank, units[0].document_id or "")
    assert document.tags == DOCUMENT_TAGS
    hits = (
        await engine.recall(
            bank, RecallQuery(query="garden shed", tags=DOCUMENT_TAGS[:2], tags_match="all")
        )
    ).hits
    assert hits and all(h.unit.tags == DOCUMENT_TAGS for h in hits)


async def test_an_items_metadata_is_stored_once_for_all_its_units(engine: MemoryEngine) -> None:
    bank = await engine.put_bank("b", {})
    metadata = {f"key{i}": f"{i}" + "m" * 999 for i in range(8)}
    talk = "\n".join(f"{('Ann', 'Bob')[i % 2]}: line {i} of the talk" for i in range(300))
    summary = await engine.retain(bank, [RetainItem(content=talk, metadata=metadata)])
    assert summary.units == 300

    # Before: 301 copies of 8 KB (the units' and the document's). Now one.
    assert _stored_chars(engine, "metadata") < 2 * 8_200
    units, _ = await engine.list_units(bank, UnitFilter(), 1000, 0)
    assert len(units) == 300 and all(u.metadata == metadata for u in units)
    assert (await engine.get_unit(bank, units[0].id)).metadata == metadata


async def test_an_items_context_is_stored_once_and_indexed_in_part(engine: MemoryEngine) -> None:
    bank = await engine.put_bank("b", {})
    context = "Holiday in Japan with the family. " + "filler " * 3000 + "zanzibar"
    talk = "\n".join(f"{('Ann', 'Bob')[i % 2]}: line {i} of the talk" for i in range(300))
    await engine.retain(bank, [RetainItem(content=talk, context=context)])

    # Before: the 21 KB context on each of the 300 units (6.3 MB), and in each one's index.
    assert _stored_chars(engine, "context", ("memory_units",)) < 2 * len(context)
    units, _ = await engine.list_units(bank, UnitFilter(), 1000, 0)
    assert len(units) == 300 and all(u.context == context for u in units)
    trace: Any = (await engine.recall(bank, RecallQuery(query="Japan", trace=True))).trace
    assert trace["arms"]["keyword"]  # the context's start is indexed with each unit
    trace = (await engine.recall(bank, RecallQuery(query="zanzibar", trace=True))).trace
    assert not trace["arms"].get("keyword")  # what is past INDEX_CONTEXT_CHARS is not


async def test_a_shared_value_goes_with_the_last_row_that_uses_it(engine: MemoryEngine) -> None:
    bank: Bank = await engine.put_bank("b", {})
    other = [f"other-{i:02d}-" + "y" * 60 for i in range(4)]
    await engine.retain(bank, [RetainItem(content="Alpha.", document_id="a")], DOCUMENT_TAGS)
    await engine.retain(bank, [RetainItem(content="Beta.", document_id="b")], DOCUMENT_TAGS)
    assert _values(engine) == 1
    await engine.delete_document(bank, "a")
    assert _values(engine) == 1  # document b still carries it
    await engine.retain(bank, [RetainItem(content="Beta again.", document_id="b")], other)
    assert _values(engine) == 1  # replaced: the first is gone, the second is in
    assert (await engine.get_document(bank, "b")).tags == other

    metadata = {"note": "z" * 100}
    two = RetainItem(
        content="Gamma one.\n\nDelta two.", document_id="c", metadata=metadata, context="k" * 99
    )
    await engine.retain(bank, [two])
    units, _ = await engine.list_units(bank, UnitFilter(document_id="c"), 10, 0)
    assert len(units) == 2 and _values(engine) == 3
    await engine.delete_unit(bank, units[0].id)
    assert _values(engine) == 3
    await engine.delete_unit(bank, units[1].id)
    assert _values(engine) == 2  # the context went; the document itself carries the metadata
    await engine.delete_document(bank, "c")
    await engine.delete_document(bank, "b")
    assert _values(engine) == 0
    await engine.retain(bank, [RetainItem(content="Again.")], DOCUMENT_TAGS)
    await engine.delete_bank("b")
    assert _values(engine) == 0
