"""The embedded model answers from a bank's memories, in a chat turn and through reflect.

The example of the "grounded agent" issue, on the real local model (SmolLM2-135M through
llama-cpp-python) with no LLM setting, against a real server: a bank ``alice`` with three
plain facts, and questions a new user would ask. Skipped like ``test_local.py``, never
under CI.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from heed.api.app import create_app
from heed.llm.local import llama_available
from heed.settings import Settings
from tests.support import LiveServer, live_server, wait_for

pytestmark = pytest.mark.skipif(
    not llama_available() and os.environ.get("HEED_REQUIRE_LOCAL_MODEL") != "1",
    reason="llama-cpp-python is not installed: run scripts/install.sh (make test does)",
)

ALICE = [
    "Alice adopted a grey cat named Pixel in March 2024.",
    "Alice works as a nurse at St. Mary's hospital in Leeds.",
    "Alice is allergic to peanuts.",
]
BOTH = "What is the name of Alice's cat and where does she work?"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = Settings(data_dir=Path(tmp_path_factory.mktemp("alice")))
    assert settings.llm_provider == "local", "the embedded default is what this tests"
    with live_server(create_app(settings), timeout=120) as srv:
        with httpx.Client(base_url=srv.url, timeout=120) as client:
            assert client.put("/v1/default/banks/alice", json={}).status_code in (200, 201)
            items = {"items": [{"content": fact} for fact in ALICE]}
            assert client.post("/v1/default/banks/alice/memories", json=items).status_code == 200
        yield srv


def says_both(answer: str) -> bool:
    text = answer.lower()
    return "pixel" in text and "st. mary's hospital in leeds" in text


def chat(client: httpx.Client, session_id: str, content: str) -> str:
    run_id = client.post(f"/v1/sessions/{session_id}/turns", json={"content": content}).json()[
        "run_id"
    ]
    wait_for(lambda: client.get(f"/v1/runs/{run_id}").json()["phase"] != "running", 120)
    run = client.get(f"/v1/runs/{run_id}").json()
    assert run["phase"] == "completed", run
    return str(run["result"]["text"])


def test_reflect_answers_both_parts(server: LiveServer) -> None:
    with httpx.Client(base_url=server.url, timeout=120) as client:
        started = time.monotonic()
        answer = client.post("/v1/default/banks/alice/reflect", json={"query": BOTH}).json()
        print(f"reflect: {answer['text']!r} in {time.monotonic() - started:.1f} s")
    assert says_both(answer["text"]), answer["text"]


def test_a_chat_turn_answers_from_the_bank(server: LiveServer) -> None:
    with httpx.Client(base_url=server.url, timeout=120) as client:
        session = client.post("/v1/sessions", json={"bank_id": "alice"}).json()["id"]
        answer = chat(client, session, BOTH)
        print(f"chat: {answer!r}")
        assert says_both(answer), answer
        other = client.post("/v1/sessions", json={"bank_id": "alice"}).json()["id"]
        allergy = chat(client, other, "What is Alice allergic to?")
        print(f"chat: {allergy!r}")
        assert "peanut" in allergy.lower(), allergy
        transcript = client.get(f"/v1/sessions/{session}").json()["messages"]
    steps = [call["name"] for m in transcript for call in m.get("tool_calls") or []]
    assert steps == ["recall", "recall"], "each part of the question is recalled as a tool step"


def test_a_follow_up_question_in_the_same_session(server: LiveServer) -> None:
    with httpx.Client(base_url=server.url, timeout=120) as client:
        session = client.post("/v1/sessions", json={"bank_id": "alice"}).json()["id"]
        first = chat(client, session, "What is the name of Alice's cat?")
        follow_up = chat(client, session, "And where does she work?")
    print(f"chat: {first!r} then {follow_up!r}")
    assert "pixel" in first.lower(), first
    assert "st. mary's hospital" in follow_up.lower(), follow_up
