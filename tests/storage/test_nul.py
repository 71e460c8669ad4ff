"""NUL (U+0000) in text that reaches a store: one rule on both databases (issue #28 row 17).

The HTTP edge refuses NUL in a request; text can still reach a store by another path (the
MCP server over stdio, a model's output, a direct call). PostgreSQL's ``text`` cannot hold
NUL and SQLite's can, so the stores used to disagree: PostgreSQL answered a session id
holding NUL with a 500 (the driver's ``DataError``) and a turn failed with the driver's
text, its memory store rewrote NUL to U+FFFD, SQLite kept it. Now, on both: text holding
NUL is refused (:class:`heed.errors.InvalidText`, 400, or the memory domain's
``InvalidInput`` naming the field) before anything is written, and a key holding NUL
finds nothing.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mcp import Client

from heed.errors import InvalidText
from heed.memory import MemoryEngine, build_memory_engine
from heed.memory.models import (
    Bank,
    Chunk,
    EntityRef,
    InvalidInput,
    PreparedDocument,
    PreparedUnit,
    RecallQuery,
    RetainItem,
)
from heed.memory.store import UnitFilter
from heed.runs.model import Phase, Run
from heed.runtime import RequestContext, use_context
from heed.services import build_lanes
from heed.sessions.store import Message, Session
from heed.settings import Settings
from heed.storage import SqlDatabase
from heed.storage.memory import SqlMemoryStore
from heed.storage.postgres import PostgresDatabase
from heed.storage.run_store import SqlRunStore
from heed.storage.session_store import SqlSessionStore
from tests.mcp_api.test_mcp_server import data, error_text
from tests.mcp_api.test_mcp_stdio import heed_mcp
from tests.pg_support import fresh_schema

MEMORY_TABLES = ("memory_documents", "memory_chunks", "memory_units", "memory_entities")


def _memory_store(db: SqlDatabase) -> SqlMemoryStore:
    store = SqlMemoryStore(db)
    store.migrate()
    return store


def _rows(db: SqlDatabase, table: str) -> int:
    with db.read() as conn:
        return int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


def _document(text: str = "Plain text.", **unit: Any) -> PreparedDocument:
    vector = np.ones(384, dtype=np.float32) / np.sqrt(384)
    fields: dict[str, Any] = {
        "id": str(uuid.uuid4()),
        "text": text,
        "index_text": text,
        "fact_type": "world",
        "context": None,
        "chunk_index": 0,
        "occurred_start": None,
        "occurred_end": None,
        "mentioned_at": None,
        "metadata": {},
        "tags": [],
        "entities": [],
        "embedding": vector,
        **unit,
    }
    return PreparedDocument(
        document_id=str(uuid.uuid4()),
        replace=True,
        original_text=text,
        metadata={},
        tags=[],
        chunks=[Chunk(str(uuid.uuid4()), 0, text)],
        units=[PreparedUnit(**fields)],
    )


@pytest.mark.parametrize(
    "unit",
    [
        {"text": "a\x00b"},
        {"context": "ctx\x00"},
        {"tags": ["ok", "t\x00"]},
        {"metadata": {"k": "v\x00"}},
        {"metadata": {"k\x00": "v"}},
        {"entities": [EntityRef("Ann\x00a")]},
    ],
    ids=["text", "context", "tag", "metadata value", "metadata key", "entity"],
)
def test_both_memory_stores_refuse_a_document_holding_nul_and_write_nothing(
    sql_database: SqlDatabase, unit: dict[str, Any]
) -> None:
    store = _memory_store(sql_database)
    bank = store.save_bank(Bank(tenant="t", bank_id="b", ref=str(uuid.uuid4())))
    document = _document(**unit)
    if "text" in unit:
        document.original_text = unit["text"]
    with pytest.raises(InvalidText, match="NUL"):
        store.write_document(bank.ref, document)
    assert {t: _rows(sql_database, t) for t in MEMORY_TABLES} == dict.fromkeys(MEMORY_TABLES, 0)
    store.write_document(bank.ref, _document())  # the bank is fine
    assert _rows(sql_database, "memory_units") == 1


def test_both_memory_stores_refuse_a_bank_holding_nul(sql_database: SqlDatabase) -> None:
    store = _memory_store(sql_database)
    with pytest.raises(InvalidText, match="mission"):
        store.save_bank(Bank(tenant="t", bank_id="b", ref="r", mission="m\x00"))
    assert _rows(sql_database, "memory_banks") == 0
    assert store.get_bank("t", "b\x00") is None  # a key holding NUL finds nothing


@pytest.fixture
async def engine(sql_database: SqlDatabase, tmp_path: Path) -> AsyncIterator[MemoryEngine]:
    settings = Settings(data_dir=tmp_path)
    eng = build_memory_engine(settings, _memory_store(sql_database), build_lanes(settings))
    with use_context(RequestContext()):
        yield eng


async def test_the_memory_engine_names_the_field_holding_nul(engine: MemoryEngine) -> None:
    """What the MCP server over stdio reaches (no HTTP edge in front of it)."""
    bank = await engine.put_bank("b", {})
    cases = {
        "items[1].content": [RetainItem("fine"), RetainItem("bad\x00")],
        "items[0].tags[1]": [RetainItem("fine", tags=["a", "b\x00"])],
        "items[0].metadata['k']": [RetainItem("fine", metadata={"k": "\x00"})],
        "items[0].entities[0].text": [RetainItem("fine", entities=[EntityRef("A\x00")])],
        "items[0].document_id": [RetainItem("fine", document_id="d\x00")],
    }
    for field, items in cases.items():
        with pytest.raises(InvalidInput, match=re.escape(f"{field} holds a NUL")):
            await engine.retain(bank, items)
    with pytest.raises(InvalidInput, match=r"document_tags\[0\] holds a NUL"):
        await engine.retain(bank, [RetainItem("fine")], ["\x00"])
    with pytest.raises(InvalidInput, match=r"document_tags\[1\] holds a NUL"):
        engine.validate_items([RetainItem("fine")], ["ok", "\x00"])  # async retain's check
    with pytest.raises(InvalidInput, match="query holds a NUL"):
        await engine.recall(bank, RecallQuery(query="cats\x00"))
    with pytest.raises(InvalidInput, match="mission holds a NUL"):
        await engine.put_bank("b", {"mission": "\x00"})
    with pytest.raises(InvalidInput, match="document_id holds a NUL"):
        await engine.get_document(bank, "d\x00")
    assert (await engine.list_units(bank, UnitFilter(), 10, 0))[1] == 0  # nothing was written


def test_the_session_store_finds_nothing_by_a_key_holding_nul_and_stores_no_nul(
    sql_database: SqlDatabase,
) -> None:
    """``GET /v1/sessions/a%00b`` answered 500 on PostgreSQL, and a turn whose message held
    NUL failed with the driver's ``DataError``; SQLite found nothing and stored it."""
    store = SqlSessionStore(sql_database)
    store.migrate()
    now = time.time()
    session = store.create(Session("ses_1", "t", "chat", None, now, now))
    assert store.get("a\x00b") is None
    assert store.messages("a\x00b") == []
    assert store.pending_wakeups("a\x00b") == []
    assert store.update("a\x00b", title="x") is None
    assert store.delete("a\x00b") is False
    with pytest.raises(InvalidText, match="session title"):
        store.create(Session("ses_2", "t", "chat\x00", None, now, now))
    with pytest.raises(InvalidText, match="session title"):
        store.update(session.id, title="new\x00")
    message = Message("msg_1", session.id, 0, "assistant", "half\x00text", now, run_id="run_1")
    with pytest.raises(InvalidText, match="message content"):
        store.append_message(message)
    assert store.messages(session.id) == []
    assert _rows(sql_database, "sessions") == 1
    kept = store.get(session.id)
    assert kept is not None and kept.title == "chat"


def test_postgres_refuses_nul_in_any_parameter_before_the_server_sees_it() -> None:
    """The net under every store: never the driver's ``DataError`` (SQLite can hold NUL;
    there the stores' own checks are all there is)."""
    with fresh_schema() as url:
        database = PostgresDatabase(url, pool_size=1)
        try:
            with database.read() as conn:
                with pytest.raises(InvalidText):
                    conn.execute("SELECT ?::text", ("a\x00b",))
                with pytest.raises(InvalidText):
                    conn.execute("SELECT ?::text[]", (["ok", "a\x00b"],))
                with pytest.raises(InvalidText):
                    conn.executemany("SELECT ?::text", [("ok",), ("a\x00b",)])
                assert conn.execute("SELECT ?::text", ("fine",)).fetchone()[0] == "fine"
        finally:
            database.close()


def test_the_run_store_finds_nothing_by_a_key_holding_nul_and_always_records_an_ending(
    sql_database: SqlDatabase,
) -> None:
    """A run's ending must be stored whatever its description holds: an exception's text
    with NUL ends the run ``failed`` with U+FFFD in its place, on both databases (on
    PostgreSQL the transition used to fail, leaving the run to the reaper)."""
    store = SqlRunStore(sql_database)
    store.migrate()
    store.create(Run(id="run_1", kind="turn", tenant="t", phase="queued", created_at=time.time()))
    assert store.get("run\x001") is None
    assert store.events_after("run\x001", 0) == []
    assert store.list_runs(session_id="ses\x00") == []
    ended = store.transition(
        "run_1", Phase.FAILED, fields={"error": "upstream said a\x00b"}, event=("failed", {})
    )
    assert ended is not None and ended.run.error == "upstream said a\ufffdb"
    stored = store.get("run_1")
    assert stored is not None and (stored.phase, stored.error) == (
        "failed",
        "upstream said a\ufffdb",
    )


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
async def test_over_mcp_stdio_nul_is_a_tool_error_naming_the_field(
    tmp_path: Path, database: str
) -> None:
    """``heed mcp`` over stdio has no HTTP edge in front of it: the domains and the stores
    refuse NUL there, on both databases, with an error naming what held it."""
    with ExitStack() as stack:
        env = (
            {"HEED_DATABASE_URL": stack.enter_context(fresh_schema())}
            if database != "sqlite"
            else {}
        )
        async with Client(heed_mcp(tmp_path / "data", **env)) as client:
            data(await client.call_tool("create_bank", {"bank_id": "notes"}))
            refused = await client.call_tool(
                "retain",
                {"bank_id": "notes", "items": [{"content": "Fine.", "tags": ["a", "b\x00"]}]},
            )
            assert "items[0].tags[1] holds a NUL character" in error_text(refused)
            found = await client.call_tool("recall", {"bank_id": "notes", "query": "cats\x00"})
            assert "query holds a NUL character" in error_text(found)
            session_id = data(await client.call_tool("start_turn", {"message": "hello"}))[
                "session_id"
            ]
            turn = await client.call_tool(
                "start_turn", {"message": "hi\x00there", "session_id": session_id}
            )
            assert "the message holds a NUL character" in error_text(turn)
            nobody = await client.call_tool("start_turn", {"message": "hi", "session_id": "a\x00b"})
            assert "no session with id" in error_text(nobody)
