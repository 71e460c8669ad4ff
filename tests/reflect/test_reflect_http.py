"""Reflect end to end: a real server, hindsight-client, the scripted provider.

The scripted provider picks its reply by the number of assistant messages in
the conversation. Reflect's first, forced recall is shown to the model as an
assistant tool call, so the model's first call gets reply 1, its second reply 2,
and so on; reply 0 is what a fresh conversation (the structured-output call)
gets.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hindsight_client import Hindsight

from heed.api.app import create_app
from heed.llm import ScriptedProvider
from heed.llm.grounding import MEMORIES_HEADING
from heed.reflect import ITERATIONS
from heed.runtime import current_context
from heed.settings import Settings
from tests.support import LiveServer, live_server, metric_value

REFLECT_ROUTE = "/v1/default/banks/{bank_id}/reflect"
FACTS = [
    "Alice has two cats named Tom and Luna.",
    "Bob likes to ski in the Alps every winter.",
    "Alice works as a nurse in Lyon.",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = Settings(data_dir=tmp_path_factory.mktemp("reflect"), llm_provider="scripted")
    with live_server(create_app(settings)) as srv:
        yield srv


@pytest.fixture
async def client(server: LiveServer) -> AsyncIterator[Hindsight]:
    c = Hindsight(base_url=server.url, timeout=30)
    try:
        yield c
    finally:
        await c.aclose()


async def create_bank_with_facts(client: Hindsight, bank: str) -> None:
    await client._acreate_bank(bank)
    await client.aretain_batch(bank, [{"content": fact} for fact in FACTS])


@pytest.fixture
async def bank_id(client: Hindsight) -> str:
    bank = "reflect-" + uuid.uuid4().hex[:8]
    await create_bank_with_facts(client, bank)
    return bank


def use_script(server: LiveServer, script: dict[str, Any]) -> ScriptedProvider:
    provider = ScriptedProvider(script)
    server.app.state.services.reflect.provider = provider
    return provider


async def memory_id(client: Hindsight, bank_id: str, query: str, needle: str) -> str:
    recalled = await client.arecall(bank_id, query)
    return next(r.id for r in recalled.results if needle in r.text)


async def test_recall_first_tools_executed_and_based_on(
    server: LiveServer, client: Hindsight, bank_id: str
) -> None:
    cats = await memory_id(client, bank_id, "Alice cats", "cats")
    provider = use_script(
        server,
        {
            "replies": [
                {"text": "unused"},
                {"tool_calls": [{"name": "recall", "arguments": {"query": "Alice job"}}]},
                {
                    "tool_calls": [
                        {
                            "name": "done",
                            "arguments": {"answer": "Alice has two cats.", "memory_ids": [cats]},
                        }
                    ]
                },
            ]
        },
    )
    response = await client.areflect(
        bank_id, "What pets does Alice have?", include_facts=True, include_tool_calls=True
    )
    assert response.text == "Alice has two cats."
    assert response.based_on is not None
    assert [m.id for m in response.based_on.memories or []] == [cats]
    assert response.usage is not None and response.usage.total_tokens > 0

    # recall happened first: the model's very first call already saw the cat memory
    first_call = provider.requests[0]
    assert first_call.messages[2].tool_calls[0].name == "recall"
    assert "cats named Tom and Luna" in first_call.messages[3].content
    assert {t.name for t in first_call.tools} == {"recall", "expand", "done"}

    trace = response.trace
    assert trace is not None
    tools = [(t.tool, t.iteration) for t in trace.tool_calls or []]
    assert tools == [("recall", 0), ("recall", 1), ("done", 2)]
    second = (trace.tool_calls or [])[1]
    assert second.input == {"query": "Alice job"}
    assert second.output is not None
    assert any("nurse" in m["text"] for m in second.output["memories"])
    assert [c.scope for c in trace.llm_calls or []] == ["agent_1", "agent_2"]
    assert len(provider.requests) == 2


async def test_expand_reads_the_source(server: LiveServer, client: Hindsight, bank_id: str) -> None:
    nurse = await memory_id(client, bank_id, "Alice job", "nurse")
    use_script(
        server,
        {
            "replies": [
                {"text": "unused"},
                {"tool_calls": [{"name": "expand", "arguments": {"memory_id": nurse}}]},
                {"text": "She is a nurse."},
            ]
        },
    )
    response = await client.areflect(bank_id, "What is Alice's job?", include_tool_calls=True)
    assert response.text == "She is a nurse."
    expand = (response.trace.tool_calls or [])[1]  # type: ignore[union-attr]
    assert expand.tool == "expand"
    assert expand.output is not None
    assert "nurse in Lyon" in expand.output["text"]


async def test_budget_bounds_iterations_and_the_last_must_answer(
    server: LiveServer, client: Hindsight, bank_id: str
) -> None:
    calls = ITERATIONS["low"]
    again = {"tool_calls": [{"name": "recall", "arguments": {"query": "more"}}]}
    provider = use_script(
        server, {"replies": [{"text": "unused"}, *[again] * (calls - 1), {"text": "Final."}]}
    )
    response = await client.areflect(bank_id, "Tell me about Bob", budget="low")
    assert response.text == "Final."
    assert len(provider.requests) == calls
    assert provider.requests[-1].tools == ()  # the last call offers no tools
    assert all(r.tools for r in list(provider.requests)[:-1])


async def test_a_plain_text_reply_is_the_answer_based_on_what_was_recalled(
    server: LiveServer, client: Hindsight, bank_id: str
) -> None:
    use_script(server, {"replies": [{"text": "unused"}, {"text": "Bob skis."}]})
    response = await client.areflect(bank_id, "Does Bob ski?", include_facts=True)
    assert response.text == "Bob skis."
    texts = [m.text for m in response.based_on.memories or []]  # type: ignore[union-attr]
    assert any("ski" in t for t in texts)
    assert response.trace is None  # not asked for


async def test_structured_output(server: LiveServer, client: Hindsight, bank_id: str) -> None:
    use_script(
        server,
        {
            "replies": [
                {"text": '{"pets": 2, "names": ["Tom", "Luna"]}'},
                {"text": "Alice has two cats, Tom and Luna."},
            ]
        },
    )
    schema = {
        "type": "object",
        "properties": {"pets": {"type": "integer"}, "names": {"type": "array"}},
        "required": ["pets"],
    }
    response = await client.areflect(bank_id, "Alice's pets?", response_schema=schema)
    assert response.text == "Alice has two cats, Tom and Luna."
    assert response.structured_output == {"pets": 2, "names": ["Tom", "Luna"]}
    assert response.structured_output_error is None


async def test_a_backtracking_pattern_is_stopped_and_the_server_stays_responsive(
    server: LiveServer, client: Hindsight, bank_id: str
) -> None:
    crafted = "a" * 40 + "!"  # ^(a+)+$ needs ~2**40 steps to refuse this
    use_script(server, {"replies": [{"text": json.dumps({"v": crafted})}, {"text": "Done."}]})
    schema = {"type": "object", "properties": {"v": {"type": "string", "pattern": "^(a+)+$"}}}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        reflect = asyncio.create_task(
            http.post(
                REFLECT_ROUTE.format(bank_id=bank_id),
                json={"query": "q", "response_schema": schema},
            )
        )
        await asyncio.sleep(0.5)  # the validation is running by now
        health_started = time.monotonic()
        assert (await http.get("/health")).status_code == 200
        health_seconds = time.monotonic() - health_started
        response = await reflect
    assert response.status_code == 200
    body = response.json()
    assert body["text"] == "Done."
    assert body["structured_output"] is None
    assert "took longer than" in body["structured_output_error"]
    assert health_seconds < 1.0, "the event loop was blocked by the validation"


async def test_structured_output_that_does_not_match_is_reported(
    server: LiveServer, client: Hindsight, bank_id: str
) -> None:
    use_script(server, {"replies": [{"text": '{"pets": "two"}'}, {"text": "Two cats."}]})
    schema = {"type": "object", "properties": {"pets": {"type": "integer"}}}
    response = await client.areflect(bank_id, "Alice's pets?", response_schema=schema)
    assert response.text == "Two cats."
    assert response.structured_output is None
    assert "does not match" in (response.structured_output_error or "")


async def test_bad_requests_are_4xx_naming_the_problem(server: LiveServer, bank_id: str) -> None:
    async with httpx.AsyncClient(base_url=server.url) as http:
        url = REFLECT_ROUTE.format(bank_id=bank_id)
        bad_schema = await http.post(
            url, json={"query": "q", "response_schema": {"type": "objekt"}}
        )
        assert bad_schema.status_code == 400
        assert "response_schema: not valid JSON Schema" in bad_schema.json()["detail"]
        empty = await http.post(url, json={"query": "  "})
        assert empty.status_code == 400
        missing = await http.post(REFLECT_ROUTE.format(bank_id="no-such-bank"), json={"query": "q"})
        assert missing.status_code == 404
        budget = await http.post(url, json={"query": "q", "budget": "huge"})
        assert budget.status_code == 422


async def test_provider_errors_are_502_or_503_with_the_message(
    server: LiveServer, client: Hindsight, bank_id: str
) -> None:
    use_script(
        server,
        {
            "replies": [
                {"text": "unused"},
                {"error": "unavailable", "error_message": "gone fishing"},
            ]
        },
    )
    async with httpx.AsyncClient(base_url=server.url) as http:
        response = await http.post(REFLECT_ROUTE.format(bank_id=bank_id), json={"query": "q"})
    assert response.status_code == 503
    assert "gone fishing" in response.json()["detail"]


async def test_stream_true_sends_tool_calls_text_and_the_answer(
    server: LiveServer, bank_id: str
) -> None:
    use_script(
        server,
        {
            "replies": [
                {"text": "unused"},
                {"tool_calls": [{"name": "recall", "arguments": {"query": "Alice"}}]},
                {"text": "Alice is a nurse with two cats."},
            ]
        },
    )
    events: list[tuple[str, Any]] = []
    async with (
        httpx.AsyncClient(base_url=server.url, timeout=30) as http,
        http.stream(
            "POST",
            REFLECT_ROUTE.format(bank_id=bank_id),
            json={"query": "Who is Alice?", "stream": True, "include": {"facts": {}}},
        ) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        name = ""
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((name, json.loads(line.removeprefix("data: "))))
    names = [n for n, _ in events]
    assert names[:3] == ["started", "tool_call", "tool_result"]
    assert [e["seq"] for _, e in events] == list(range(1, len(events) + 1))
    assert events[1][1]["data"] == {
        "id": "call_0_recall",
        "name": "recall",
        "arguments": {"query": "Who is Alice?"},
        "iteration": 0,
    }
    assert events[2][1]["data"]["ok"] is True
    assert events[2][1]["data"]["output"]["memories"]
    assert names.count("tool_call") == 2
    deltas = "".join(e["data"]["text"] for n, e in events if n == "text_delta")
    assert deltas == "Alice is a nurse with two cats."
    assert names[-2:] == ["message", "completed"]
    result = events[-1][1]["data"]["result"]
    assert result["text"] == "Alice is a nurse with two cats."
    assert result["based_on"]["memories"]


async def seed_bank(server: LiveServer, bank: str) -> None:
    hs = Hindsight(base_url=server.url, timeout=30)
    try:
        await create_bank_with_facts(hs, bank)
    finally:
        await hs.aclose()


async def _wait_for_499(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.url) as http:
        for _ in range(300):
            text = (await http.get("/metrics")).text
            value = metric_value(
                text, "heed_http_requests_total", method="POST", route=REFLECT_ROUTE, status="499"
            )
            if value >= 1:
                return
            await asyncio.sleep(0.01)
    raise AssertionError("no 499 was recorded for reflect")


async def test_disconnect_during_the_final_answer_stops_the_call(
    tmp_path: Path,
) -> None:
    settings = Settings(data_dir=tmp_path, llm_provider="scripted")
    with live_server(create_app(settings)) as srv:
        await seed_bank(srv, "b")
        long_answer = " ".join(f"word{i}" for i in range(400))
        provider = use_script(
            srv, {"replies": [{"text": "unused"}, {"text": long_answer, "token_delay": 0.02}]}
        )
        lane = srv.app.state.services.lanes["reflect"]
        async with httpx.AsyncClient(base_url=srv.url) as http:
            request = asyncio.create_task(
                http.post(REFLECT_ROUTE.format(bank_id="b"), json={"query": "Tell me a story"})
            )
            while provider.last_token_at is None:
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.1)
            left_at = time.monotonic()
            request.cancel()  # closes the connection: the server sees http.disconnect
            with pytest.raises(asyncio.CancelledError):
                await request
        await _wait_for_499(srv)
        for _ in range(200):
            if lane.stats().in_use == 0:
                break
            await asyncio.sleep(0.01)
        assert lane.stats().in_use == 0
        stopped_at = provider.last_token_at
        await asyncio.sleep(0.2)
        assert provider.last_token_at == stopped_at, "the model call kept producing"
        assert stopped_at - left_at < 0.25
        assert len(provider.requests) == 1


class SecondRecallGate:
    """A recall hook that holds the second recall's embedding stage until cancelled."""

    def __init__(self) -> None:
        self.embeddings = 0
        self.entered = threading.Event()
        self.reason: str | None = None

    def __call__(self, stage: str) -> None:
        if stage != "embedding":
            return
        self.embeddings += 1
        if self.embeddings != 2:
            return
        self.entered.set()
        token = current_context().token
        token.wait_sync(10.0)
        self.reason = token.reason


async def test_disconnect_between_iterations_stops_before_the_next(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, llm_provider="scripted")
    with live_server(create_app(settings)) as srv:
        await seed_bank(srv, "b")
        provider = use_script(
            srv,
            {
                "replies": [
                    {"text": "unused"},
                    {"tool_calls": [{"name": "recall", "arguments": {"query": "Bob"}}]},
                    {"text": "never produced"},
                ]
            },
        )
        gate = SecondRecallGate()
        srv.app.state.services.memory.recall_deps.hooks = gate
        async with httpx.AsyncClient(base_url=srv.url) as http:
            request = asyncio.create_task(
                http.post(REFLECT_ROUTE.format(bank_id="b"), json={"query": "Who skis?"})
            )
            assert await asyncio.to_thread(gate.entered.wait, 20.0)
            request.cancel()
            with pytest.raises(asyncio.CancelledError):
                await request
        await _wait_for_499(srv)
        await asyncio.sleep(0.2)
        assert gate.reason == "client disconnected"
        assert len(provider.requests) == 1, "a model call started after the client left"


FALLBACK = {"when": MEMORIES_HEADING, "text": "Alice has cats."}


async def test_a_broken_tool_call_falls_back_to_one_answer_from_the_memories(
    server: LiveServer, client: Hindsight, bank_id: str
) -> None:
    provider = use_script(
        server,
        {
            "replies": [
                {"text": "unused"},
                {"text": '{"tool": "recall", "arguments": {"query": '},
                {"text": "never asked"},
                FALLBACK,
            ]
        },
    )
    response = await client.areflect(bank_id, "Alice's pets?")
    assert response.text == "Alice has cats."
    assert len(provider.requests) == 2, "the loop went on after the broken call"
    fallback = provider.requests[1]
    assert fallback.tools == () and [m.role for m in fallback.messages] == ["system", "user"]
    assert "Tom and Luna" in fallback.messages[1].content  # the recalled memories
    assert "Question: Alice's pets?" in fallback.messages[1].content


async def test_a_refusal_although_memories_were_recalled_is_answered_from_them(
    server: LiveServer, client: Hindsight, bank_id: str
) -> None:
    refusal = {"text": "I could not find an answer in the memories."}
    provider = use_script(server, {"replies": [{"text": "unused"}, refusal, FALLBACK]})
    response = await client.areflect(bank_id, "Alice's pets?")
    assert response.text == "Alice has cats."
    assert MEMORIES_HEADING in provider.requests[-1].messages[-1].content


async def test_when_even_the_fallback_refuses_the_best_memories_follow_the_refusal(
    server: LiveServer, client: Hindsight, bank_id: str
) -> None:
    """The grounded answer's rule (heed.llm.grounding), as in a chat turn: the refusal stays
    (it was streamed) and the best memories follow it, quoted."""
    refusal = {"text": "There is no information about that."}
    use_script(
        server,
        {"replies": [{"text": "unused"}, refusal, {**FALLBACK, "text": "I don't know."}]},
    )
    response = await client.areflect(bank_id, "What are the names of Alice's cats?")
    assert response.text.startswith("I don't know. From the memories: ")
    assert "Tom and Luna" in response.text


async def test_a_model_that_cannot_use_tools_answers_each_part_of_the_question(
    server: LiveServer, client: Hindsight, bank_id: str
) -> None:
    provider = use_script(
        server,
        {
            "follows_tools": False,
            "replies": [
                {"when": "Question: What are the names", "text": "Tom and Luna."},
                {"when": "Question: What is her work", "text": "She is a nurse in Lyon."},
            ],
        },
    )
    response = await client.areflect(
        bank_id, "What are the names of Alice's cats and what is her work?", include_tool_calls=True
    )
    assert response.text == "Tom and Luna. She is a nurse in Lyon."
    assert all(r.tools == () for r in provider.requests), "tools were offered"
    assert len(provider.requests) == 2
    queries = [c.input["query"] for c in response.trace.tool_calls]  # type: ignore[union-attr]
    assert queries[1:] == ["What are the names of Alice's cats?", "What is her work?"]
