"""Cancellation of recall and retain, stage by stage, with hooks instead of timing luck.

Each test holds a stage open in its worker thread (``StageGate``), cancels the
request's token, and checks that the work stopped promptly, that later
stages never ran, and that the lane slot was released only once the worker
thread had stopped. Bounds in assertions are generous (the target is 50 ms;
the measured figures are in benchmarks/results/abandoned_recall.json).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from heed.memory import MemoryEngine, NotFound
from heed.memory.embeddings import Embedder
from heed.memory.models import RecallQuery, RetainItem
from heed.memory.store import UnitFilter
from heed.runtime import (
    CancellationToken,
    OperationCancelled,
    RequestContext,
    current_context,
    use_context,
)
from heed.storage.memory import SqlMemoryStore
from heed.storage.memory.writes import DocumentWrites
from tests.memory.conftest import StageGate

STOP_BOUND = 0.5  # seconds; the target is 0.05


async def _bank(engine: MemoryEngine, name: str = "b", n: int = 30) -> Any:
    with use_context(RequestContext()):
        bank = await engine.put_bank(name, {})
        items = [
            RetainItem(content=f"Speaker{i % 3}: note number {i} about hiking and painting")
            for i in range(n)
        ]
        await engine.retain(bank, items)
    return bank


def _start(engine: MemoryEngine, bank: Any, query: str = "hiking notes") -> tuple[Any, Any]:
    ctx = RequestContext()
    with use_context(ctx):
        task = asyncio.create_task(
            engine.recall(
                bank, RecallQuery(query=query, include_chunks=True, include_entities=True)
            )
        )
    return ctx, task


async def _entered(gate: StageGate) -> None:
    assert await asyncio.to_thread(gate.entered.wait, 10.0), f"{gate.stage} never ran"


LATER = {  # the lexical arms run beside the embedding, so "retrieval" may start with it
    "embedding": ["rerank", "enrichment"],
    "retrieval": ["rerank", "enrichment"],
    "rerank": ["enrichment"],
    "enrichment": [],
}


@pytest.mark.parametrize("stage", ["embedding", "retrieval", "rerank", "enrichment"])
async def test_cancel_during_stage_stops_it(engine: MemoryEngine, stage: str) -> None:
    bank = await _bank(engine)
    gate = StageGate(stage)
    engine.recall_deps.hooks = gate
    ctx, task = _start(engine, bank)
    await _entered(gate)
    cancelled_at = time.monotonic()
    ctx.token.cancel("client disconnected")
    with pytest.raises(OperationCancelled):
        await task
    stopped = time.monotonic() - cancelled_at
    print(f"{stage}: stopped {stopped * 1000:.2f} ms after the cancel")
    assert stopped < STOP_BOUND, f"{stage}: stopped after {stopped * 1000:.1f} ms"
    assert gate.reason == "client disconnected"
    assert engine.recall_deps.lane.stats().in_use == 0
    assert not any(gate.calls.get(later) for later in LATER[stage]), gate.calls


async def test_cancel_while_queued_never_starts(engine: MemoryEngine) -> None:
    bank = await _bank(engine)
    gate = StageGate("embedding")
    engine.recall_deps.hooks = gate
    first_ctx, first = _start(engine, bank)
    await _entered(gate)
    second_ctx, second = _start(engine, bank, "painting")
    lane = engine.recall_deps.lane
    for _ in range(200):
        if lane.stats().queued == 1:
            break
        await asyncio.sleep(0.005)
    assert lane.stats().queued == 1
    started = time.monotonic()
    second_ctx.token.cancel("client disconnected")
    with pytest.raises(OperationCancelled):
        await second
    waited = time.monotonic() - started
    print(f"queued: left the queue {waited * 1000:.2f} ms after the cancel")
    assert waited < STOP_BOUND
    assert gate.calls["embedding"] == 1, "the queued request computed its embedding"
    assert lane.stats().cancelled_in_queue_total == 1
    first_ctx.token.cancel("done")
    with pytest.raises(OperationCancelled):
        await first


async def test_slot_is_released_only_after_the_thread_stopped(engine: MemoryEngine) -> None:
    bank = await _bank(engine)
    gate = StageGate("rerank", stubborn=0.3)
    engine.recall_deps.hooks = gate
    ctx, task = _start(engine, bank)
    await _entered(gate)
    lane = engine.recall_deps.lane
    ctx.token.cancel("client disconnected")
    await asyncio.sleep(0.1)
    assert not task.done(), "the coroutine returned while its thread still ran"
    assert lane.stats().in_use == 1 and lane.stats().abandoned == 1
    with pytest.raises(OperationCancelled):
        await task
    released_at = time.monotonic()
    assert gate.left_at is not None and gate.left_at <= released_at
    assert lane.stats().in_use == 0


async def test_deleting_a_bank_cancels_its_recall_first(engine: MemoryEngine) -> None:
    bank = await _bank(engine)
    gate = StageGate("rerank", stubborn=0.1)
    engine.recall_deps.hooks = gate
    _ctx, recall = _start(engine, bank)
    await _entered(gate)
    with use_context(RequestContext()):
        deleted = await engine.delete_bank(bank.bank_id)
    assert deleted == 30
    assert recall.done(), "delete returned before the recall stopped"
    with pytest.raises(NotFound):
        await recall
    assert gate.reason == "bank deleted"


class BlockingEmbedder:
    """Wraps an embedder; blocks in the worker thread until the token is cancelled."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.dim = inner.dim
        self.entered = threading.Event()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.entered.set()
        token = current_context().token
        token.wait_sync(10.0)
        token.raise_if_cancelled()
        return self.inner.embed(texts)


async def test_deleting_a_bank_cancels_its_retain_and_nothing_is_written(
    engine: MemoryEngine,
) -> None:
    bank = await _bank(engine, n=1)
    blocking = BlockingEmbedder(engine.embedder)
    engine.embedder = blocking
    with use_context(RequestContext()):
        retain = asyncio.create_task(engine.retain(bank, [RetainItem(content="late write")]))
    assert await asyncio.to_thread(blocking.entered.wait, 10.0)
    with use_context(RequestContext()):
        await engine.delete_bank(bank.bank_id)
    with pytest.raises(NotFound):
        await retain
    store = engine.store
    assert isinstance(store, SqlMemoryStore)
    with store.db.read() as conn:
        assert conn.execute("SELECT COUNT(*) FROM memory_units").fetchone()[0] == 0


async def test_cancel_inside_the_document_transaction_rolls_it_back(
    engine: MemoryEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    bank = await _bank(engine, n=1)
    original = DocumentWrites._link
    linking = {"n": 0}

    def cancel_then_link(self: DocumentWrites, conn: Any, *args: Any, **kwargs: Any) -> None:
        # The units are in (two batches of them), uncommitted; the links come next.
        linking["n"] = conn.execute("SELECT COUNT(*) FROM memory_units").fetchone()[0]
        current_context().token.cancel("client disconnected")
        original(self, conn, *args, **kwargs)

    monkeypatch.setattr(DocumentWrites, "_link", cancel_then_link)
    transcript = "\n".join(f"Alice: line {i} of a long transcript" for i in range(300))
    ctx = RequestContext()
    with use_context(ctx), pytest.raises(OperationCancelled):
        await engine.retain(bank, [RetainItem(content=transcript, document_id="long")])
    assert linking["n"] == 301
    with use_context(RequestContext()):
        with pytest.raises(NotFound):
            await engine.get_document(bank, "long")
        _units, total = await engine.list_units(bank, UnitFilter(), 10, 0)
    assert total == 1  # only the unit written by _bank
    hits = engine.indexes.get(bank.ref)
    assert len(hits) == 1


def test_recall_queries_stop_inside_sqlite_when_cancelled(tmp_path: Any) -> None:
    import uuid

    from heed.memory.entities import extract_entities
    from heed.memory.models import Bank, Chunk, PreparedDocument, PreparedUnit
    from heed.storage import SqliteDatabase

    store = SqlMemoryStore(SqliteDatabase(tmp_path / "big.db"))
    store.migrate()
    bank = store.save_bank(Bank(tenant="t", bank_id="big", ref=str(uuid.uuid4())))
    units = [
        PreparedUnit(
            id=str(uuid.uuid4()),
            text=f"Alice: note {i} about the garden",
            index_text=f"Alice: note {i} about the garden",
            fact_type="world",
            context=None,
            chunk_index=0,
            occurred_start=None,
            occurred_end=None,
            mentioned_at=None,
            metadata={},
            tags=[],
            entities=extract_entities("", speaker="Alice"),
            embedding=np.zeros(384, dtype=np.float32),
        )
        for i in range(3000)
    ]
    store.write_document(
        bank.ref, PreparedDocument("doc", True, "x", {}, [], [Chunk("c", 0, "x")], units)
    )
    assert len(store.keyword_search(bank.ref, ["garden", "note"], 100)) == 100
    token = CancellationToken()
    token.cancel("client disconnected")
    with use_context(RequestContext(token=token)):
        with pytest.raises(OperationCancelled):
            store.keyword_search(bank.ref, ["garden", "note"], 100)
        with pytest.raises(OperationCancelled):
            store.units_by_entities(bank.ref, ["alice"], 100)
    # The connection is usable again afterwards (the handler was removed).
    assert len(store.units_by_entities(bank.ref, ["alice"], 100)) == 100
