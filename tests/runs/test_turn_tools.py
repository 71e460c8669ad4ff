"""The turn worker's memory tools against the real memory engine, and their errors."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx

from heed.sessions.tools import NOT_BOUND
from heed.settings import Settings
from tests.support import wait_for

from .http_support import new_session, run_phase, run_server, run_settings


def tool_results(client: httpx.Client, run_id: str) -> list[dict[str, object]]:
    with client.stream("GET", f"/v1/runs/{run_id}/stream", timeout=20) as resp:
        body = resp.read().decode()
    results = []
    for block in body.split("\n\n"):
        if "event: tool_result" in block:
            data = block.split("data: ", 1)[1]
            results.append(json.loads(data)["data"])
    return results


def test_retain_then_recall_on_the_session_bank(make_settings: Callable[..., Settings]) -> None:
    script = {
        "replies": [
            {"tool_calls": [{"name": "retain", "arguments": {"content": "Alice has two cats."}}]},
            {"tool_calls": [{"name": "recall", "arguments": {"query": "How many cats?"}}]},
            {"text": "Alice has two cats."},
        ]
    }
    settings = run_settings(make_settings, llm_script=json.dumps(script))
    with run_server(settings) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.put("/v1/default/banks/pets", json={}).status_code in (200, 201)
        assert client.post("/v1/sessions", json={"bank_id": "nope"}).status_code == 404
        sid = new_session(client, bank_id="pets")
        run_id = client.post(f"/v1/sessions/{sid}/turns", json={"content": "remember"}).json()[
            "run_id"
        ]
        wait_for(lambda: run_phase(client, run_id) == "completed", seconds=60)
        grounded, retained, recalled = tool_results(client, run_id)
        assert grounded["name"] == "recall" and grounded["content"] == "(nothing found)"
        assert retained["name"] == "retain" and retained["ok"] is True
        assert recalled["name"] == "recall" and recalled["ok"] is True
        assert "Alice has two cats." in str(recalled["content"])
        messages = client.get(f"/v1/sessions/{sid}").json()["messages"]
        assert [m["role"] for m in messages] == [
            "user",
            "assistant",  # the turn's own recall (grounding), before the model is asked
            "tool",
            "assistant",
            "tool",
            "assistant",
            "tool",
            "assistant",
        ]
        assert messages[-1]["content"] == "Alice has two cats."


def test_memory_tools_without_a_bank_and_unknown_tools_return_a_tool_error(
    make_settings: Callable[..., Settings],
) -> None:
    script = {
        "replies": [
            {"tool_calls": [{"name": "recall", "arguments": {"query": "cats"}}]},
            {"tool_calls": [{"name": "nope", "arguments": {}}]},
            {"text": "I could not look."},
        ]
    }
    settings = run_settings(make_settings, llm_script=json.dumps(script))
    with run_server(settings) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        sid = new_session(client)  # bound to no bank
        run_id = client.post(f"/v1/sessions/{sid}/turns", json={"content": "look"}).json()["run_id"]
        wait_for(lambda: run_phase(client, run_id) == "completed", seconds=30)
        unbound, unknown = tool_results(client, run_id)
        assert unbound["ok"] is False and unbound["content"] == NOT_BOUND
        assert unknown["ok"] is False and "unknown tool 'nope'" in str(unknown["content"])
