"""A recall of a loaded bank goes through the event loop as few times as it can."""

from __future__ import annotations

from typing import Any

import pytest

import heed.memory.engine as engine_module
import heed.memory.recall.pipeline as pipeline
from heed.memory import MemoryEngine
from heed.memory.models import RecallQuery, RetainItem
from heed.runtime import RequestContext, use_context


async def test_a_loaded_index_is_used_without_a_thread_hop_and_ranking_is_one_hop(
    engine: MemoryEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    with use_context(RequestContext()):
        bank = await engine.put_bank("hops", {})
        await engine.retain(
            bank,
            [RetainItem(content=f"Ann: note {i} about hiking in the hills") for i in range(12)],
        )
        assert engine.indexes.peek(bank.ref) is None or len(engine.indexes.peek(bank.ref)) == 12
        first = await engine.recall(bank, RecallQuery(query="hiking", trace=True))
        loaded = engine.indexes.peek(bank.ref)
        assert loaded is not None and len(loaded) == 12

        hops: list[str] = []

        def counting(module: Any) -> Any:
            real = module.run_in_thread

            async def run_in_thread(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
                hops.append(getattr(fn, "__name__", repr(fn)))
                return await real(fn, *args, **kwargs)

            return run_in_thread

        monkeypatch.setattr(pipeline, "run_in_thread", counting(pipeline))
        monkeypatch.setattr(engine_module, "run_in_thread", counting(engine_module))
        second = await engine.recall(
            bank, RecallQuery(query="hiking", trace=True, include_chunks=True)
        )
    assert [h.unit.id for h in second.hits] == [h.unit.id for h in first.hits]
    assert second.trace is not None
    names = [s["stage"] for s in second.trace["stages"]]
    assert names == [
        "admission",
        "index",
        "embedding",
        "retrieval",
        "fusion",
        "candidates",
        "rerank",
        "boost",
        "budget",
        "enrichment",
    ]
    # the two retrieval branches side by side, then everything else in one thread
    assert sorted(hops) == ["_embed_and_search", "_lexical_arms", "_rank_and_fill"]
