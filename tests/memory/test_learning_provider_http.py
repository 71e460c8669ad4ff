"""The learning path through a real provider's failures and cancels, on SQLite and
PostgreSQL: heed as an operator runs it (``HEED_LLM_PROVIDER=openai``, default learning
settings) against the fake OpenAI-compatible upstream on loopback
(:mod:`tests.llm.fake_upstream`), which records when heed closed each connection.

- an upstream 5xx at retain: a clear 5xx naming the upstream, nothing written;
- a malformed consolidation reply: the facts are marked ``failed``, and
  ``consolidation/recover`` brings them back, consolidated by the next good reply;
- a merge of two observations, driven through a consolidation run;
- a cancel while the upstream holds its answer (the client leaving a retain, the
  consolidation operation cancelled, the bank deleted): the upstream sees its connection
  closed. The bound here is generous (a test asserts behaviour); the latency is measured by
  ``benchmarks/llm_cancel_latency.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.llm.fake_upstream import Behaviour, Record, RunningUpstream
from tests.memory.test_bank_learning_settings import (
    _marker_of,
    _streamed,
    _user_text,
    memories,
    new_bank,
    retain,
    server,
    upstream,
)
from tests.support import LiveServer, wait_for

__all__ = ["server", "upstream"]  # the fixtures, shared

#: Generous: a closed connection is seen in milliseconds; a loaded CI machine may be slow.
CLOSED_WITHIN = 2.0


def answer(
    extraction: Callable[[str], Behaviour | None],
    consolidation: Callable[[str], Behaviour | None],
) -> Callable[[dict[str, Any]], Behaviour | None]:
    """A responder sending extraction and consolidation requests to their own answer."""

    def respond(body: dict[str, Any]) -> Behaviour | None:
        user = _user_text(body)
        if user.startswith("[0] ("):
            return extraction(user)
        if user.startswith("New facts:"):
            return consolidation(user)
        return None

    return respond


def one_fact(user: str) -> Behaviour:
    marker = _marker_of(user)
    fact = {"text": f"{marker} keeps bees in Lyon.", "fact_type": "world", "sources": [0]}
    return _streamed({"facts": [fact]})


def held(seconds: float = 60.0) -> Behaviour:
    """An answer the upstream holds back (headers sent late), as a slow model does."""
    return Behaviour(header_delay=seconds, chunks=[])


def record_for(upstream: RunningUpstream, marker: str, start: str) -> Record:
    def found() -> Record | None:
        for record in list(upstream.app.records):
            user = _user_text(record.body)
            if user.startswith(start) and marker in user:
                return record
        return None

    record: Record = wait_for(found, seconds=30)
    return record


def operations(server: LiveServer, bank: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{server.url}/v1/default/banks/{bank}/operations", timeout=30)
    response.raise_for_status()
    ops: list[dict[str, Any]] = response.json()["operations"]
    return ops


def test_an_upstream_5xx_at_retain_is_a_clear_5xx_and_writes_nothing(
    server: LiveServer, upstream: RunningUpstream
) -> None:
    upstream.app.responder = answer(
        lambda user: Behaviour(status=500, body={"error": {"message": "model overloaded"}}),
        lambda user: None,
    )
    bank, marker = new_bank(server)
    response = httpx.post(
        f"{server.url}/v1/default/banks/{bank}/memories",
        json={"items": [{"content": f"{marker}: I keep bees in Lyon."}]},
        timeout=120,
    )
    assert 500 <= response.status_code < 600 and response.status_code != 500, response.text
    assert "upstream" in response.text.lower() or "provider" in response.text.lower()
    assert memories(server, bank) == []
    docs = httpx.get(f"{server.url}/v1/default/banks/{bank}/documents", timeout=30).json()
    assert docs["total"] == 0


def test_a_malformed_consolidation_reply_fails_the_facts_and_recover_retries_them(
    server: LiveServer, upstream: RunningUpstream
) -> None:
    good = {"value": False}

    def consolidation(user: str) -> Behaviour:
        if not good["value"]:
            return Behaviour(chunks=[{"choices": [{"delta": {"content": "no json here"}}]}])
        marker = _marker_of(user)
        return _streamed(
            {"actions": [{"action": "create", "text": f"{marker} keeps bees.", "facts": [0]}]}
        )

    upstream.app.responder = answer(one_fact, consolidation)
    bank, marker = new_bank(server)
    retain(server, bank, marker)
    failed = wait_for(lambda: memories(server, bank, consolidation_state="failed"), seconds=60)
    assert {m["text"] for m in failed} == {f"{marker} keeps bees in Lyon."}
    assert memories(server, bank, type="observation") == []

    good["value"] = True
    recovered = httpx.post(
        f"{server.url}/v1/default/banks/{bank}/consolidation/recover", timeout=30
    )
    assert recovered.status_code == 200 and recovered.json()["retried_count"] == 1
    [observation] = wait_for(lambda: memories(server, bank, type="observation"), seconds=60)
    assert observation["text"] == f"{marker} keeps bees."
    [fact] = [m for m in memories(server, bank) if m["text"].endswith("bees in Lyon.")]
    assert observation["source_memory_ids"] == [fact["id"]]
    assert fact["consolidation_state"] == "done"


def test_a_merge_of_two_observations_is_driven_through_a_run(
    server: LiveServer, upstream: RunningUpstream
) -> None:
    rounds = {"n": 0}

    def consolidation(user: str) -> Behaviour:
        rounds["n"] += 1
        marker = _marker_of(user)
        if rounds["n"] == 1:
            actions = [
                {"action": "create", "text": f"{marker} keeps bees.", "facts": [0]},
                {"action": "create", "text": f"{marker} is a beekeeper.", "facts": [0]},
            ]
        else:
            assert "O0" in user and "O1" in user, user
            actions = [
                {
                    "action": "merge",
                    "observations": [0, 1],
                    "text": f"{marker} keeps bees on a roof.",
                    "facts": [0],
                }
            ]
        return _streamed({"actions": actions})

    upstream.app.responder = answer(one_fact, consolidation)
    bank, marker = new_bank(server)
    retain(server, bank, marker)
    wait_for(lambda: len(memories(server, bank, type="observation")) == 2, seconds=60)
    retain(server, bank, marker)  # another fact on the same subject: the merge round
    merged = wait_for(
        lambda: [
            m
            for m in memories(server, bank, type="observation")
            if m["text"] == f"{marker} keeps bees on a roof."
        ],
        seconds=60,
    )
    assert len(memories(server, bank, type="observation")) == 1
    history = httpx.get(
        f"{server.url}/v1/default/banks/{bank}/memories/{merged[0]['id']}/history", timeout=30
    ).json()["history"]
    assert any("merged" in (h.get("reason") or "") for h in history), history
    kinds = {o["operation_type"] for o in operations(server, bank)}
    assert kinds == {"consolidation"}


def test_a_client_leaving_a_retain_closes_the_upstream_call(
    server: LiveServer, upstream: RunningUpstream
) -> None:
    upstream.app.responder = answer(lambda user: held(), lambda user: None)
    bank, marker = new_bank(server)

    async def leave() -> float:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            request = asyncio.create_task(
                http.post(
                    f"/v1/default/banks/{bank}/memories",
                    json={"items": [{"content": f"{marker}: I keep bees in Lyon."}]},
                )
            )
            await asyncio.to_thread(record_for, upstream, marker, "[0] (")
            left_at = time.monotonic()
            request.cancel()
            with pytest.raises(asyncio.CancelledError):
                await request
            return left_at

    left_at = asyncio.run(leave())
    record = record_for(upstream, marker, "[0] (")
    assert record.wait_disconnected(CLOSED_WITHIN)
    assert record.disconnected_at is not None
    assert record.disconnected_at - left_at < CLOSED_WITHIN
    assert memories(server, bank) == []


@pytest.mark.parametrize("how", ["operation cancel", "bank delete"])
def test_a_cancelled_consolidation_closes_the_upstream_call(
    server: LiveServer, upstream: RunningUpstream, how: str
) -> None:
    upstream.app.responder = answer(one_fact, lambda user: held())
    bank, marker = new_bank(server)
    retain(server, bank, marker)
    record = record_for(upstream, marker, "New facts:")
    [operation] = [o for o in operations(server, bank) if o["operation_type"] == "consolidation"]
    cancelled_at = time.monotonic()
    if how == "operation cancel":
        response = httpx.delete(
            f"{server.url}/v1/default/banks/{bank}/operations/{operation['id']}", timeout=30
        )
    else:
        response = httpx.delete(f"{server.url}/v1/default/banks/{bank}", timeout=60)
    assert response.status_code == 200, response.text
    assert record.wait_disconnected(CLOSED_WITHIN)
    assert record.disconnected_at is not None
    assert record.disconnected_at - cancelled_at < CLOSED_WITHIN
