"""Grounded turns: a turn of a bank-bound session recalls before its first model call.

Real server on a socket and the real memory engine; the scripted provider records what
each model call was asked, so the tests read the prompt the model got.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from heed.llm import ScriptedProvider
from heed.llm.grounding import MEMORIES_HEADING
from heed.settings import Settings
from tests.memory.conftest import StageGate
from tests.support import LiveServer, wait_for

from .http_support import new_session, run_phase, run_server, run_settings

ALICE = [
    {"content": "Alice adopted a grey cat named Pixel in March 2024.", "timestamp": "2024-03-10"},
    {"content": "Alice works as a nurse at St. Mary's hospital in Leeds."},
    {"content": "Alice is allergic to peanuts."},
]


def events(client: httpx.Client, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    with client.stream("GET", f"/v1/runs/{run_id}/stream", timeout=20) as resp:
        body = resp.read().decode()
    found = []
    for block in body.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in lines and "data" in lines:
            found.append((lines["event"], json.loads(lines["data"])["data"]))
    return found


def turn(client: httpx.Client, session_id: str, content: str) -> str:
    run_id = str(
        client.post(f"/v1/sessions/{session_id}/turns", json={"content": content}).json()["run_id"]
    )
    wait_for(lambda: run_phase(client, run_id) in ("completed", "cancelled", "failed"), 60)
    return run_id


def provider_of(server: LiveServer) -> ScriptedProvider:
    provider = server.app.state.services.turn_provider.get()
    assert isinstance(provider, ScriptedProvider)
    return provider


Served = tuple[LiveServer, httpx.Client]


@pytest.fixture
def served(make_settings: Callable[..., Settings]) -> Iterator[Served]:
    """A server with the scripted provider, and a client of it."""
    with (
        run_server(run_settings(make_settings)) as server,
        httpx.Client(base_url=server.url, timeout=30) as client,
    ):
        yield server, client


def alice_bank(client: httpx.Client) -> None:
    assert client.put("/v1/default/banks/alice", json={}).status_code in (200, 201)
    retained = client.post("/v1/default/banks/alice/memories", json={"items": ALICE})
    assert retained.status_code == 200, retained.text


def test_a_bank_bound_turn_recalls_first_and_the_model_sees_the_memories_with_dates(
    served: Served,
) -> None:
    server, client = served
    alice_bank(client)
    sid = new_session(client, bank_id="alice")
    run_id = turn(client, sid, "What is the name of Alice's cat?")
    assert run_phase(client, run_id) == "completed"

    journal = events(client, run_id)
    kinds = [k for k, _ in journal]
    first_text = kinds.index("text_delta")
    assert kinds[:4] == ["started", "user_message", "tool_call", "tool_result"]
    assert kinds.index("tool_result") < first_text, "the model was asked before the recall"
    call, result = journal[2][1], journal[3][1]
    assert call["name"] == "recall" and "Alice's cat" in call["arguments"]["query"]
    assert result["ok"] is True and "Pixel" in result["content"]
    assert "(2024-03-" in result["content"]  # when it happened: March 2024
    assert result["output"]["memories"] >= 1 and result["output"]["duration_ms"] > 0

    asked = provider_of(server).requests[-1]
    question = asked.messages[-1]
    assert question.role == "user" and question.content.startswith(MEMORIES_HEADING)
    assert "Pixel" in question.content and "(2024-03-" in question.content
    assert question.content.endswith("Question: What is the name of Alice's cat?")
    assert [t.name for t in asked.tools] == ["recall", "retain", "start_task"]

    run = client.get(f"/v1/runs/{run_id}").json()
    (grounding,) = run["result"]["trace"]["grounding"]
    assert grounding["ok"] is True and grounding["memories"] >= 1
    messages = client.get(f"/v1/sessions/{sid}").json()["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[1]["tool_calls"][0]["name"] == "recall"

    # The next turn's query carries whom the previous message named: "she" is still
    # Alice; the previous topic (the cat) stays out of it.
    second = turn(client, sid, "And where does she work?")
    call = next(d for k, d in events(client, second) if k == "tool_call")
    assert call["arguments"]["query"] == "And where does she work?\nalice"
    asked = provider_of(server).requests[-1]
    assert "St. Mary's hospital" in asked.messages[-1].content
    # earlier turns are seen as they were written, without their memories
    assert next(m.content for m in asked.messages if m.role == "user") == (
        "What is the name of Alice's cat?"
    )


def test_a_session_without_a_bank_does_not_recall(served: Served) -> None:
    server, client = served
    sid = new_session(client)
    run_id = turn(client, sid, "hello")
    kinds = [k for k, _ in events(client, run_id)]
    assert "tool_call" not in kinds and "tool_result" not in kinds
    assert provider_of(server).requests[-1].messages[-1].content == "hello"
    assert "grounding" not in client.get(f"/v1/runs/{run_id}").json()["result"]["trace"]


async def test_cancelling_during_the_grounding_recall_stops_it_before_any_model_call(
    served: Served,
) -> None:
    server, client = served
    alice_bank(client)
    sid = new_session(client, bank_id="alice")
    asked_before = len(provider_of(server).requests)
    engine = server.app.state.services.memory
    gate = StageGate("rerank")
    engine.recall_deps.hooks = gate
    try:
        run_id = client.post(f"/v1/sessions/{sid}/turns", json={"content": "cat?"}).json()["run_id"]
        assert await asyncio.to_thread(gate.entered.wait, 10.0), "the recall never ran"
        cancelled = client.post(f"/v1/runs/{run_id}/cancel", params={"wait": "true"})
    finally:
        engine.recall_deps.hooks = None
    assert cancelled.json()["phase"] == "cancelled"
    assert gate.reason is not None, "the recall's thread never saw the cancel"
    assert not gate.calls.get("enrichment"), gate.calls
    assert len(provider_of(server).requests) == asked_before, "the model was asked anyway"
    assert engine.recall_deps.lane.stats().in_use == 0


TWO_PARTS = "What is the name of Alice's cat and where does she work?"


@contextmanager
def without_tools(
    make_settings: Callable[..., Settings], work_reply: str
) -> Iterator[tuple[LiveServer, httpx.Client, str]]:
    """A server whose model cannot use tools and answers the two parts of :data:`TWO_PARTS`
    ("Pixel." for the cat, *work_reply* for her work), a client, and a session over Alice's
    bank."""
    script = {
        "follows_tools": False,
        "replies": [
            {"when": "Question: What is the name", "text": "Pixel."},
            {"when": "Question: Where does she work", "text": work_reply},
        ],
    }
    settings = run_settings(make_settings, llm_script=json.dumps(script))
    with run_server(settings) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        alice_bank(client)
        yield server, client, new_session(client, bank_id="alice")


def test_a_model_that_cannot_use_tools_answers_each_part_from_its_own_memories(
    make_settings: Callable[..., Settings],
) -> None:
    with without_tools(make_settings, "At St. Mary's hospital in Leeds.") as (server, client, sid):
        turn(client, sid, "Hello")  # an earlier exchange the model must not be shown
        before = len(provider_of(server).requests)
        run_id = turn(client, sid, TWO_PARTS)
        run = client.get(f"/v1/runs/{run_id}").json()
        assert run["result"]["text"] == "Pixel. At St. Mary's hospital in Leeds."

        calls = [d for k, d in events(client, run_id) if k == "tool_call"]
        assert [c["arguments"]["query"] for c in calls] == [
            "What is the name of Alice's cat?",
            "Where does she work?",
        ]
        asked = list(provider_of(server).requests)[before:]
        assert len(asked) == 2
        for request, fact in zip(asked, ("Pixel", "St. Mary's"), strict=True):
            assert request.tools == ()
            assert [m.role for m in request.messages] == ["system", "user"]  # no transcript
            assert fact in request.messages[1].content
        assert len(run["result"]["trace"]["grounding"]) == 2


def test_a_part_the_model_refuses_is_followed_by_its_best_memory_as_in_reflect(
    make_settings: Callable[..., Settings],
) -> None:
    """The grounded answer's rule (heed.llm.grounding), as in reflect: the refusal stays and
    the part's best memory follows it, quoted, in the stream as in the stored message."""
    with without_tools(make_settings, "I could not find that.") as (_server, client, sid):
        run_id = turn(client, sid, TWO_PARTS)
        text = client.get(f"/v1/runs/{run_id}").json()["result"]["text"]
        assert text.startswith("Pixel. I could not find that. From the memories: "), text
        quoted = text.split("From the memories: ", 1)[1]
        assert quoted in [item["content"] for item in ALICE]
        streamed = "".join(d["text"] for k, d in events(client, run_id) if k == "text_delta")
        assert streamed == text
        stored = client.get(f"/v1/sessions/{sid}").json()["messages"][-1]
        assert stored["role"] == "assistant" and stored["content"] == text


def units_of(client: httpx.Client, bank: str) -> list[str]:
    listed = client.get(f"/v1/default/banks/{bank}/memories/list").json()
    return [item["text"] for item in listed["items"]]


def test_remember_messages_retains_what_the_user_says_after_the_recall(served: Served) -> None:
    _, client = served
    alice_bank(client)
    quiet = new_session(client, bank_id="alice")
    turn(client, quiet, "Alice's brother is called Tom.")
    assert not any("brother" in text for text in units_of(client, "alice")), "off by default"

    sid = new_session(client, bank_id="alice", remember_messages=True)
    assert client.get(f"/v1/sessions/{sid}").json()["remember_messages"] is True
    run_id = turn(client, sid, "Alice's brother is called Tom.")
    assert any("brother is called Tom" in text for text in units_of(client, "alice"))
    steps = [(k, d["name"]) for k, d in events(client, run_id) if k.startswith("tool_")]
    assert steps == [
        ("tool_call", "recall"),
        ("tool_result", "recall"),
        ("tool_call", "retain"),
        ("tool_result", "retain"),
    ]
    recalled = next(d for k, d in events(client, run_id) if k == "tool_result")
    assert "brother" not in recalled["content"], "the message was its own memory"
    run = client.get(f"/v1/runs/{run_id}").json()
    assert run["result"]["trace"]["remembered"]["ok"] is True

    # switched off again, nothing more is retained
    patched = client.patch(f"/v1/sessions/{sid}", json={"remember_messages": False})
    assert patched.status_code == 200 and patched.json()["remember_messages"] is False
    turn(client, sid, "Alice's sister is called Ann.")
    assert not any("sister" in text for text in units_of(client, "alice"))


def test_remember_messages_needs_a_bank(served: Served) -> None:
    _, client = served
    refused = client.post("/v1/sessions", json={"remember_messages": True})
    assert refused.status_code == 400 and "bank_id" in refused.json()["detail"]
    sid = new_session(client)
    unchanged = client.patch(f"/v1/sessions/{sid}", json={})
    assert unchanged.status_code == 200 and unchanged.json()["remember_messages"] is False
    bankless = client.patch(f"/v1/sessions/{sid}", json={"remember_messages": True})
    assert bankless.status_code == 409 and "bank" in bankless.json()["detail"]
    renamed = client.patch(f"/v1/sessions/{sid}", json={"title": "Notes"})
    assert renamed.json()["title"] == "Notes" and renamed.json()["remember_messages"] is False
