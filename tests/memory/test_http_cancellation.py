"""Cancellation over a real socket: a client leaving mid-recall, cancelling an operation."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hindsight_client import Hindsight

from heed.api.app import create_app
from heed.memory import MemoryEngine
from heed.settings import Settings
from tests.memory.conftest import StageGate
from tests.memory.test_cancellation import BlockingEmbedder
from tests.support import LiveServer, live_server


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[LiveServer]:
    with live_server(create_app(Settings(data_dir=tmp_path))) as srv:
        yield srv


def _engine(server: LiveServer) -> MemoryEngine:
    engine: MemoryEngine = server.app.state.services.memory
    return engine


@pytest.mark.parametrize("stage", ["embedding", "rerank", "enrichment"])
async def test_client_leaving_mid_recall_stops_the_stage(
    own_server: LiveServer, stage: str
) -> None:
    client = Hindsight(base_url=own_server.url)
    try:
        await client._acreate_bank("b")
        await client.aretain_batch(
            "b", [{"content": f"Alice: fact {i} about tea"} for i in range(20)]
        )
    finally:
        await client.aclose()
    engine = _engine(own_server)
    gate = StageGate(stage)
    engine.recall_deps.hooks = gate
    async with httpx.AsyncClient(base_url=own_server.url) as http:
        request = asyncio.create_task(
            http.post(
                "/v1/default/banks/b/memories/recall",
                json={"query": "tea", "include": {"chunks": {}}},
            )
        )
        await asyncio.to_thread(gate.entered.wait, 10.0)
        left_at = time.monotonic()
        request.cancel()  # closes the connection: the server sees http.disconnect
        with pytest.raises(asyncio.CancelledError):
            await request
    lane = engine.recall_deps.lane
    for _ in range(200):
        if lane.stats().in_use == 0 and gate.cancel_seen_at is not None:
            break
        await asyncio.sleep(0.01)
    assert gate.reason == "client disconnected"
    assert gate.cancel_seen_at is not None and gate.cancel_seen_at - left_at < 0.5
    assert lane.stats().in_use == 0


async def test_async_retain_cancelled_while_running_ends_cancelled_without_a_document(
    own_server: LiveServer,
) -> None:
    engine = _engine(own_server)
    client = Hindsight(base_url=own_server.url)
    try:
        await client._acreate_bank("b")
        blocking = BlockingEmbedder(engine.embedder)
        engine.embedder = blocking
        response = await client.aretain_batch(
            "b",
            [{"content": f"Bob: item {i}", "document_id": "doc"} for i in range(10)],
            retain_async=True,
        )
        operation_id = response.operation_id
        assert operation_id
        assert await asyncio.to_thread(blocking.entered.wait, 10.0)
        status = await client.operations.get_operation_status("b", operation_id)
        assert status.status == "processing"
        cancel = await client.operations.cancel_operation("b", operation_id)
        assert cancel.success
        for _ in range(300):
            status = await client.operations.get_operation_status("b", operation_id)
            if status.status != "processing":
                break
            await asyncio.sleep(0.02)
        assert status.status == "cancelled"
        # Terminal states are absorbing: a second cancel changes nothing.
        await client.operations.cancel_operation("b", operation_id)
        again = await client.operations.get_operation_status("b", operation_id)
        assert again.status == "cancelled"
        docs = await client.documents.list_documents("b")
        assert docs.total == 0
        memories = await client.alist_memories("b")
        assert memories.total == 0
    finally:
        await client.aclose()


async def test_sync_retain_stops_when_the_client_leaves_and_writes_nothing(
    own_server: LiveServer,
) -> None:
    engine = _engine(own_server)
    async with httpx.AsyncClient(base_url=own_server.url) as http:
        await http.put("/v1/default/banks/b", json={})
        blocking = BlockingEmbedder(engine.embedder)
        engine.embedder = blocking
        request = asyncio.create_task(
            http.post(
                "/v1/default/banks/b/memories",
                json={"items": [{"content": f"Cy: item {i}"} for i in range(50)]},
            )
        )
        assert await asyncio.to_thread(blocking.entered.wait, 10.0)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        lane = engine.retain_lane
        for _ in range(200):
            if lane.stats().in_use == 0:
                break
            await asyncio.sleep(0.01)
        assert lane.stats().in_use == 0
        listing = await http.get("/v1/default/banks/b/memories/list")
        assert listing.json()["total"] == 0
        docs = await http.get("/v1/default/banks/b/documents")
        assert docs.json()["total"] == 0


async def test_deleting_a_bank_cancels_its_running_operation_first(own_server: LiveServer) -> None:
    engine = _engine(own_server)
    client = Hindsight(base_url=own_server.url)
    try:
        await client._acreate_bank("b")
        blocking = BlockingEmbedder(engine.embedder)
        engine.embedder = blocking
        response = await client.aretain_batch(
            "b", [{"content": "Dee: late write"}], retain_async=True
        )
        assert await asyncio.to_thread(blocking.entered.wait, 10.0)
        deleted = await client.adelete_bank("b")
        assert deleted.success
        manager = own_server.app.state.services.manager
        run = await manager.get(response.operation_id)
        assert run.phase == "cancelled" and run.cancel_reason == "bank deleted"
        await client._acreate_bank("b")  # a new bank of the same name starts empty
        assert (await client.alist_memories("b")).total == 0
    finally:
        await client.aclose()
