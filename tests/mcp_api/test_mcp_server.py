"""heed's MCP server with the SDK's own client against a real server on loopback.

Every tool, tenancy by bearer key, progress notifications, and cancellation that really
stops the work: a cancelled reflect stops its generation and frees its lane slot (on the
2026-07-28 transport, where cancel is closing the stream, and on the handshake-era one,
where it is ``notifications/cancelled``), a cancelled recall stops mid-stage. The LLM is
the scripted provider (reply 0 is reflect's structured-output call, reply 1 the model's
first call).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult

from heed.api.app import create_app
from heed.llm import ScriptedProvider
from heed.settings import Settings
from tests.memory.conftest import StageGate
from tests.support import LiveServer, live_server, wait_for

KEYS = {"key-alpha": "alpha", "key-beta": "beta"}
ALPHA, BETA = "key-alpha", "key-beta"
LONG = " ".join(f"word{i}" for i in range(400))
FACTS = ["Alice has two cats named Tom and Luna.", "Alice works as a nurse in Lyon."]
STOP_BOUND = 2.0  # seconds: generous; the benchmark measures the real figure (target 50 ms)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("mcp"),
        llm_provider="scripted",
        api_keys=KEYS,
        stream_heartbeat_seconds=0.5,
        stream_poll_seconds=0.2,
    )
    with live_server(create_app(settings)) as srv:
        yield srv


@asynccontextmanager
async def connect(
    server: LiveServer, key: str = ALPHA, mode: str = "auto"
) -> AsyncIterator[Client]:
    """The SDK's client over streamable HTTP, authenticated with *key*."""
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0)) as http,
        Client(streamable_http_client(f"{server.url}/mcp", http_client=http), mode=mode) as client,
    ):
        yield client


def data(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


def error_text(result: CallToolResult) -> str:
    assert result.is_error, result.structured_content
    return " ".join(getattr(c, "text", "") for c in result.content)


async def new_bank(client: Client, facts: list[str] = FACTS) -> str:
    bank_id = "mcp-" + uuid.uuid4().hex[:8]
    data(await client.call_tool("create_bank", {"bank_id": bank_id, "name": "Alice"}))
    if facts:
        data(
            await client.call_tool(
                "retain", {"bank_id": bank_id, "items": [{"content": f} for f in facts]}
            )
        )
    return bank_id


def use_script(server: LiveServer, replies: list[dict[str, Any]]) -> ScriptedProvider:
    provider = ScriptedProvider({"replies": [{"text": "unused"}, *replies]})
    server.app.state.services.reflect.provider = provider
    return provider


def reflect_lane_in_use(server: LiveServer) -> int:
    return int(server.app.state.services.lanes["reflect"].stats().in_use)


async def run_of(server: LiveServer, run_id: str, key: str = ALPHA) -> dict[str, Any]:
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {key}"}
    ) as http:
        response = await http.get(f"/v1/runs/{run_id}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def until(predicate: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def assert_generation_stopped(server: LiveServer, provider: ScriptedProvider) -> None:
    """The model produces nothing more, and the reflect lane's slot is free."""
    await until(lambda: reflect_lane_in_use(server) == 0, STOP_BOUND)
    stopped_at = provider.last_token_at
    await asyncio.sleep(0.3)
    assert provider.last_token_at == stopped_at, "the model kept generating"


class Progress:
    def __init__(self) -> None:
        self.updates: list[tuple[float, float | None, str | None]] = []

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self.updates.append((progress, total, message))

    @property
    def messages(self) -> list[str]:
        return [m or "" for _, _, m in self.updates]

    def run_id(self) -> str:
        first = self.messages[0]
        assert first.startswith("run "), self.messages
        return first.split()[1]


# -- tools ---------------------------------------------------------------------------


async def test_the_tools_and_the_bank_resource_are_listed(server: LiveServer) -> None:
    async with connect(server) as client:
        tools = {t.name for t in (await client.list_tools()).tools}
        templates = (await client.list_resource_templates()).resource_templates
    assert tools == {
        *("list_banks", "create_bank", "recall", "retain", "reflect", "start_turn"),
        *("list_mental_models", "get_mental_model", "create_mental_model", "refresh_mental_model"),
        *("list_directives", "create_directive", "update_directive", "delete_directive"),
    }
    assert [t.uri_template for t in templates] == ["heed://banks/{bank_id}"]


async def test_retain_reports_progress_per_document_and_recall_finds_it(server: LiveServer) -> None:
    async with connect(server) as client:
        bank_id = await new_bank(client, facts=[])
        progress = Progress()
        items = [
            {"content": f"Note {i}: Alice hiked Mont Blanc in year {2000 + i}."} for i in range(5)
        ]
        summary = data(
            await client.call_tool(
                "retain", {"bank_id": bank_id, "items": items}, progress_callback=progress
            )
        )
        assert summary["items"] == 5 and summary["documents"] == 5 and summary["units"] >= 5
        assert [(p, t) for p, t, _ in progress.updates] == [(i, 5) for i in range(1, 6)]
        assert progress.messages[-1] == "5 of 5 documents"

        found = data(
            await client.call_tool("recall", {"bank_id": bank_id, "query": "Mont Blanc hike"})
        )
        assert found["results"], found
        assert "Mont Blanc" in found["results"][0]["text"]

        banks = data(await client.call_tool("list_banks", {}))
        mine = [b for b in banks["banks"] if b["bank_id"] == bank_id]
        assert mine and mine[0]["units"] == summary["units"]

        resource = await client.read_resource(f"heed://banks/{bank_id}")
        profile = json.loads(resource.contents[0].text)  # type: ignore[union-attr]
        assert profile["bank_id"] == bank_id and profile["stats"]["documents"] == 5


async def test_bad_input_is_a_tool_error_naming_the_problem(server: LiveServer) -> None:
    async with connect(server) as client:
        bank_id = await new_bank(client, facts=[])
        cases = {
            ("recall", "bank 'nope' not found"): {"bank_id": "nope", "query": "cats"},
            ("recall", "query has no words"): {"bank_id": bank_id, "query": "?!"},
            ("recall", "unknown fact type"): {
                "bank_id": bank_id,
                "query": "cats",
                "types": ["opinion"],
            },
            ("retain", "items[0].timestamp"): {
                "bank_id": bank_id,
                "items": [{"content": "x", "timestamp": "not a date"}],
            },
            ("retain", "items"): {"bank_id": bank_id, "items": []},
            ("create_bank", "invalid bank_id 'a/b'"): {"bank_id": "a/b"},
            # `$` with re.match accepts a final newline: the bank would look like "abc"
            ("create_bank", "invalid bank_id 'abc\\n'"): {"bank_id": "abc\n"},
            ("reflect", "bank 'nope' not found"): {"bank_id": "nope", "query": "why?"},
            ("start_turn", "no session"): {"message": "hi", "session_id": "ses_missing"},
        }
        for (tool, expected), arguments in cases.items():
            text = error_text(await client.call_tool(tool, arguments))
            assert expected in text, (tool, text)
        # nothing half-written: the failed retains stored nothing, no bad bank was created
        banks = data(await client.call_tool("list_banks", {}))
        assert [b["units"] for b in banks["banks"] if b["bank_id"] == bank_id] == [0]
        assert not [b for b in banks["banks"] if b["bank_id"].startswith(("a/b", "abc"))]


async def test_tenants_see_only_their_own_banks_sessions_and_runs(server: LiveServer) -> None:
    use_script(server, [{"text": "Two cats."}])
    async with connect(server, ALPHA) as alpha:
        bank_id = await new_bank(alpha)
        answer = data(await alpha.call_tool("reflect", {"bank_id": bank_id, "query": "Pets?"}))
        turn = data(await alpha.call_tool("start_turn", {"message": "Remember me"}))
    async with connect(server, BETA) as beta:
        listed = data(await beta.call_tool("list_banks", {}))
        assert bank_id not in [b["bank_id"] for b in listed["banks"]]
        for tool, arguments in {
            "recall": {"bank_id": bank_id, "query": "cats"},
            "retain": {"bank_id": bank_id, "items": [{"content": "intruder"}]},
            "reflect": {"bank_id": bank_id, "query": "Pets?"},
        }.items():
            assert f"bank {bank_id!r} not found" in error_text(
                await beta.call_tool(tool, arguments)
            )
        text = error_text(
            await beta.call_tool("start_turn", {"message": "hi", "session_id": turn["session_id"]})
        )
        assert "no session" in text
        with pytest.raises(Exception, match="not found"):
            await beta.read_resource(f"heed://banks/{bank_id}")
    async with httpx.AsyncClient(base_url=server.url) as http:
        for run_id in (answer["run_id"], turn["run_id"]):
            other = await http.get(
                f"/v1/runs/{run_id}", headers={"Authorization": f"Bearer {BETA}"}
            )
            assert other.status_code == 404
        anonymous = await http.post(
            "/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            headers={"Accept": "application/json, text/event-stream"},
        )
        assert anonymous.status_code == 401


async def test_reflect_is_a_run_reported_step_by_step(server: LiveServer) -> None:
    use_script(
        server,
        [
            {"tool_calls": [{"name": "recall", "arguments": {"query": "cats names"}}]},
            {"text": "Alice has two cats, Tom and Luna."},
        ],
    )
    async with connect(server) as client:
        bank_id = await new_bank(client)
        progress = Progress()
        answer = data(
            await client.call_tool(
                "reflect",
                {"bank_id": bank_id, "query": "What are the cats called?"},
                progress_callback=progress,
            )
        )
    assert answer["text"] == "Alice has two cats, Tom and Luna."
    assert progress.run_id() == answer["run_id"]
    assert progress.messages[1:] == [
        "calling recall",
        "recall returned",
        "calling recall",
        "recall returned",
        "answer written",
    ]
    run = await run_of(server, answer["run_id"])
    assert (run["kind"], run["phase"], run["tenant"]) == ("reflect", "completed", "alpha")
    assert run["result"]["text"] == answer["text"]


async def test_start_turn_creates_a_session_and_continues_it(server: LiveServer) -> None:
    async with connect(server) as client:
        bank_id = await new_bank(client)
        first = data(
            await client.call_tool("start_turn", {"message": "Hello heed", "bank_id": bank_id})
        )
        second = data(
            await client.call_tool(
                "start_turn", {"message": "And again", "session_id": first["session_id"]}
            )
        )
    assert first["session_id"] == second["session_id"] and first["run_id"] != second["run_id"]
    assert first["text"] and second["text"]
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {ALPHA}"}
    ) as http:
        session = (await http.get(f"/v1/sessions/{first['session_id']}")).json()
    assert session["bank_id"] == bank_id
    # each turn of a bank-bound session recalls first: a tool step before the answer
    grounded_turn = ["user", "assistant", "tool", "assistant"]
    assert [m["role"] for m in session["messages"]] == grounded_turn * 2
    assert session["messages"][-1]["content"] == second["text"]
    run = await run_of(server, second["run_id"])
    assert (run["kind"], run["phase"]) == ("turn", "completed")


# -- cancellation --------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_cancelling_a_reflect_call_stops_the_generation_and_frees_the_slot(
    server: LiveServer, mode: str
) -> None:
    async with connect(server, mode=mode) as client:
        bank_id = await new_bank(client)
        provider = use_script(server, [{"text": LONG, "token_delay": 0.02}])
        progress = Progress()
        call = asyncio.create_task(
            client.call_tool(
                "reflect", {"bank_id": bank_id, "query": "Pets?"}, progress_callback=progress
            )
        )
        await until(lambda: provider.last_token_at is not None)
        assert reflect_lane_in_use(server) == 1
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await assert_generation_stopped(server, provider)
    run = await run_of(server, progress.run_id())
    assert (run["phase"], run["cancel_reason"]) == ("cancelled", "mcp call cancelled")


async def test_notifications_cancelled_alone_stops_the_reflect(server: LiveServer) -> None:
    """The handshake-era cancel, sent while the call's response stream stays open."""
    headers = {
        "Authorization": f"Bearer {ALPHA}",
        "Accept": "application/json, text/event-stream",
    }
    async with connect(server) as client:
        bank_id = await new_bank(client)
    provider = use_script(server, [{"text": LONG, "token_delay": 0.02}])
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as http:
        init = await http.post(
            "/mcp",
            json={
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "0"},
                },
            },
        )
        assert init.status_code == 200, init.text
        session = {
            "mcp-session-id": init.headers["mcp-session-id"],
            "mcp-protocol-version": "2025-06-18",
        }
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert (await http.post("/mcp", json=note, headers=session)).status_code == 202
        call = {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "tools/call",
            "params": {"name": "reflect", "arguments": {"bank_id": bank_id, "query": "Pets?"}},
        }
        async with http.stream("POST", "/mcp", json=call, headers=session) as stream:
            await until(lambda: provider.last_token_at is not None)
            cancel = {
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": 7, "reason": "user pressed stop"},
            }
            assert (await http.post("/mcp", json=cancel, headers=session)).status_code == 202
            await assert_generation_stopped(server, provider)
            assert not stream.is_closed, "the stream was closed: this test is not about that"


async def test_continue_leaves_the_run_to_be_cancelled_by_id_over_http(server: LiveServer) -> None:
    async with connect(server) as client:
        bank_id = await new_bank(client)
        provider = use_script(server, [{"text": LONG, "token_delay": 0.02}])
        progress = Progress()
        call = asyncio.create_task(
            client.call_tool(
                "reflect",
                {"bank_id": bank_id, "query": "Pets?", "on_disconnect": "continue"},
                progress_callback=progress,
            )
        )
        await until(lambda: provider.last_token_at is not None)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    async with httpx.AsyncClient(base_url=server.url) as http:
        listed = await http.get(
            "/v1/runs",
            params={"active": "true", "kind": "reflect"},
            headers={"Authorization": f"Bearer {ALPHA}"},
        )
        others = await http.get("/v1/runs", headers={"Authorization": f"Bearer {BETA}"})
    assert [r["id"] for r in listed.json()["runs"]] == [progress.run_id()]
    assert progress.run_id() not in [r["id"] for r in others.json()["runs"]]
    run_id = progress.run_id()
    await asyncio.sleep(0.3)
    generated = provider.last_token_at
    assert (await run_of(server, run_id))["phase"] == "running"
    await until(lambda: provider.last_token_at != generated)  # still generating
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {ALPHA}"}
    ) as http:
        cancelled = await http.post(f"/v1/runs/{run_id}/cancel", params={"wait": "true"})
    assert cancelled.json()["phase"] == "cancelled"
    await assert_generation_stopped(server, provider)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_cancelling_a_recall_call_stops_it_mid_stage(server: LiveServer, mode: str) -> None:
    engine = server.app.state.services.memory
    async with connect(server, mode=mode) as client:
        bank_id = await new_bank(client)
        gate = StageGate("rerank")
        engine.recall_deps.hooks = gate
        try:
            call = asyncio.create_task(
                client.call_tool("recall", {"bank_id": bank_id, "query": "cats"})
            )
            assert await asyncio.to_thread(gate.entered.wait, 10.0), "rerank never ran"
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            await asyncio.to_thread(wait_for, lambda: gate.left_at is not None, STOP_BOUND)
        finally:
            engine.recall_deps.hooks = None
    assert gate.reason is not None
    assert not gate.calls.get("enrichment"), gate.calls
    await until(lambda: engine.recall_deps.lane.stats().in_use == 0, STOP_BOUND)


def test_the_tools_length_limits_are_the_http_apis() -> None:
    from heed.api import input_rules
    from heed.mcp import tools

    assert (tools.NAME_CHARS, tools.TEXT_CHARS, tools.LIST_ITEMS) == (
        input_rules.MAX_NAME_CHARS,
        input_rules.MAX_TEXT_CHARS,
        input_rules.MAX_LIST_ITEMS,
    )


async def test_an_over_long_argument_is_refused_by_name(server: LiveServer) -> None:
    async with connect(server) as client:
        text = error_text(
            await client.call_tool("create_bank", {"bank_id": "long", "name": "n" * 501})
        )
        listed = data(await client.call_tool("list_banks", {}))
    assert "name" in text and "500" in text, text
    assert "long" not in [b["bank_id"] for b in listed["banks"]]


# -- the domains' rules, the same through both front ends ----------------------------------


async def test_a_new_sessions_bank_must_exist_over_http_and_mcp_alike(server: LiveServer) -> None:
    """SessionService.create owns the rule: both front ends refuse in its words, and neither
    leaves a session behind."""
    headers = {"Authorization": f"Bearer {ALPHA}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers) as http:
        before = (await http.get("/v1/sessions")).json()["sessions"]
        refused = await http.post("/v1/sessions", json={"bank_id": "nope"})
        assert refused.status_code == 404
        assert refused.json()["detail"] == "no memory bank 'nope'"
        async with connect(server) as client:
            arguments = {"message": "hi", "bank_id": "nope"}
            text = error_text(await client.call_tool("start_turn", arguments))
        assert "no memory bank 'nope'" in text
        assert (await http.get("/v1/sessions")).json()["sessions"] == before
        bankless = await http.post("/v1/sessions", json={"remember_messages": True})
        assert bankless.status_code == 400 and "bank_id" in bankless.json()["detail"]


async def test_a_reflect_whose_provider_cannot_be_built_is_refused_before_any_run(
    tmp_path: Path,
) -> None:
    """ReflectService owns the rule: a plain reflect, a streamed one and the MCP tool all
    answer the provider's error, and no run is written."""
    settings = Settings(
        data_dir=tmp_path, llm_provider="scripted", reflect_llm_provider="nope", api_keys=KEYS
    )
    headers = {"Authorization": f"Bearer {ALPHA}"}
    with live_server(create_app(settings)) as srv:
        async with httpx.AsyncClient(base_url=srv.url, headers=headers) as http:
            assert (await http.put("/v1/default/banks/b", json={})).status_code in (200, 201)
            for body in ({"query": "q"}, {"query": "q", "stream": True}):
                answer = await http.post("/v1/default/banks/b/reflect", json=body)
                assert answer.status_code == 400, answer.text
                assert "unknown LLM provider 'nope'" in answer.json()["detail"]
            async with connect(srv) as client:
                text = error_text(await client.call_tool("reflect", {"bank_id": "b", "query": "q"}))
            assert "unknown LLM provider 'nope'" in text
            assert (await http.get("/v1/runs")).json()["runs"] == []
