"""A streamed reflect is a run: registry row, journal, resume, cancel by id, bank delete, recovery.

Real server on a socket, the scripted provider (reply 0: the structured-output call, reply 1:
the model's first call; see test_reflect_http.py).
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hindsight_client import Hindsight

from heed.api.app import create_app
from heed.api.wire.reflect import ReflectResponse
from heed.llm import ScriptedProvider
from heed.llm.base import Usage
from heed.memory.models import StoredUnit
from heed.reflect.agent import LLMTrace, ReflectOutcome, ToolTrace
from heed.reflect.result import ResultShape, reflect_result
from heed.settings import Settings
from tests.runs.http_support import Frame, server_process, sse_frames
from tests.support import LiveServer, free_port, live_server, wait_for

ROUTE = "/v1/default/banks/{bank_id}/reflect"
FACTS = ["Alice has two cats named Tom and Luna.", "Alice works as a nurse in Lyon."]
LONG = " ".join(f"word{i}" for i in range(300))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("reflect-runs"),
        llm_provider="scripted",
        run_reaper_interval=0.2,
        stream_heartbeat_seconds=0.5,
        stream_poll_seconds=0.2,
    )
    with live_server(create_app(settings)) as srv:
        yield srv


@pytest.fixture
async def http(server: LiveServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        yield client


@pytest.fixture
async def bank_id(server: LiveServer) -> str:
    bank = "rr-" + uuid.uuid4().hex[:8]
    hs = Hindsight(base_url=server.url, timeout=30)
    try:
        await hs._acreate_bank(bank)
        await hs.aretain_batch(bank, [{"content": f} for f in FACTS])
    finally:
        await hs.aclose()
    return bank


def use_script(server: LiveServer, replies: list[dict[str, Any]]) -> ScriptedProvider:
    provider = ScriptedProvider({"replies": [{"text": "unused"}, *replies]})
    server.app.state.services.reflect.provider = provider
    return provider


def slow_answer(server: LiveServer) -> ScriptedProvider:
    return use_script(server, [{"text": LONG, "token_delay": 0.02}])


async def assert_generation_stopped(server: LiveServer, provider: ScriptedProvider) -> None:
    """The model produces nothing more, and the reflect lane's slot is free."""
    stopped_at = provider.last_token_at
    await asyncio.sleep(0.2)
    assert provider.last_token_at == stopped_at, "the model kept generating"
    assert lane_in_use(server) == 0


def lane_in_use(server: LiveServer) -> int:
    return int(server.app.state.services.lanes["reflect"].stats().in_use)


async def read_until(
    source: httpx.Response | AsyncIterator[Frame], stop: str | None = None, count: int | None = None
) -> list[Frame]:
    """Frames (comments skipped) until one of type *stop*, or *count* frames, or the end.
    Pass ``sse_frames(response)`` to read one response in several steps."""
    frames: list[Frame] = []
    stream = sse_frames(source) if isinstance(source, httpx.Response) else source
    async for frame in stream:
        if frame.comment or (frame.event == "message" and not frame.data):
            continue
        frames.append(frame)
        if frame.event == stop or (count is not None and len(frames) >= count):
            break
    return frames


async def run_of(http: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    response = await http.get(f"/v1/runs/{run_id}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def wait_phase(http: httpx.AsyncClient, run_id: str, phase: str) -> dict[str, Any]:
    for _ in range(500):
        run = await run_of(http, run_id)
        if run["phase"] == phase:
            return run
        await asyncio.sleep(0.02)
    raise AssertionError(f"run {run_id} never became {phase}: {run}")


async def test_the_stream_is_the_journal_of_a_reflect_run(
    server: LiveServer, http: httpx.AsyncClient, bank_id: str
) -> None:
    use_script(server, [{"text": "Alice is a nurse."}])
    body = {"query": "Who is Alice?", "stream": True, "include": {"facts": {}}}
    async with http.stream("POST", ROUTE.format(bank_id=bank_id), json=body) as response:
        assert response.status_code == 200
        run_id = response.headers["x-heed-run-id"]
        assert response.headers["content-location"] == f"/v1/runs/{run_id}/stream"
        frames = await read_until(response)
    assert [f.id for f in frames] == [str(i) for i in range(1, len(frames) + 1)]
    assert frames[-1].event == "completed"
    streamed = frames[-1].data["data"]["result"]

    run = await run_of(http, run_id)
    assert (run["kind"], run["phase"]) == ("reflect", "completed")
    assert run["result"] == streamed
    # the registry's journal is the same stream, frame for frame
    async with http.stream("GET", f"/v1/runs/{run_id}/stream") as replay:
        again = await read_until(replay)
    assert [(f.id, f.event, f.data) for f in again] == [(f.id, f.event, f.data) for f in frames]

    # and the streamed result is what the plain reflect answers (the same object, validated)
    use_script(server, [{"text": "Alice is a nurse."}])
    plain = await http.post(ROUTE.format(bank_id=bank_id), json={**body, "stream": False})
    assert plain.status_code == 200
    assert set(plain.json()) == set(streamed) - {"llm_usage"}  # a run's own: its tokens
    assert streamed["llm_usage"]["by_kind"]["reflect"]["calls"] >= 1
    assert plain.json()["text"] == streamed["text"] == "Alice is a nurse."
    assert [m["id"] for m in plain.json()["based_on"]["memories"]] == [
        m["id"] for m in streamed["based_on"]["memories"]
    ]


async def test_a_client_that_leaves_cancels_the_run_by_default(
    server: LiveServer, http: httpx.AsyncClient, bank_id: str
) -> None:
    provider = slow_answer(server)
    body = {"query": "Tell me everything", "stream": True}
    async with http.stream("POST", ROUTE.format(bank_id=bank_id), json=body) as response:
        run_id = response.headers["x-heed-run-id"]
        await read_until(response, count=8)  # some text_deltas have arrived
    run = await wait_phase(http, run_id, "cancelled")
    assert run["cancel_reason"] == "client disconnected"
    await assert_generation_stopped(server, provider)


async def test_continue_lets_it_finish_and_a_resume_sees_each_event_once(
    server: LiveServer, http: httpx.AsyncClient, bank_id: str
) -> None:
    slow_answer(server)
    body = {"query": "Tell me everything", "stream": True, "on_disconnect": "continue"}
    async with http.stream("POST", ROUTE.format(bank_id=bank_id), json=body) as response:
        run_id = response.headers["x-heed-run-id"]
        first = await read_until(response, count=6)
    assert (await run_of(http, run_id))["phase"] == "running"
    last_seen = first[-1].id
    assert last_seen is not None
    headers = {"Last-Event-ID": last_seen}
    async with http.stream("GET", f"/v1/runs/{run_id}/stream", headers=headers) as resumed:
        rest = await read_until(resumed)
    seqs = [int(f.id or 0) for f in first + rest]
    assert seqs == list(range(1, len(seqs) + 1)), "a gap or a duplicate at the seam"
    assert rest[-1].event == "completed"
    text = "".join(f.data["data"]["text"] for f in first + rest if f.event == "text_delta")
    assert text == LONG


async def test_cancel_by_id_ends_the_stream_and_frees_the_slot(
    server: LiveServer, http: httpx.AsyncClient, bank_id: str
) -> None:
    provider = slow_answer(server)
    body = {"query": "Tell me everything", "stream": True}
    async with http.stream("POST", ROUTE.format(bank_id=bank_id), json=body) as response:
        run_id = response.headers["x-heed-run-id"]
        stream = sse_frames(response)
        await read_until(stream, count=5)
        cancel = await http.post(f"/v1/runs/{run_id}/cancel", params={"wait": "true"})
        assert cancel.status_code == 200
        assert cancel.json()["phase"] == "cancelled"
        rest = await read_until(stream)
    assert rest[-1].event == "cancelled"
    await assert_generation_stopped(server, provider)


async def test_deleting_the_bank_cancels_its_streamed_reflect(
    server: LiveServer, http: httpx.AsyncClient, bank_id: str
) -> None:
    slow_answer(server)
    body = {"query": "Tell me everything", "stream": True, "on_disconnect": "continue"}
    async with http.stream("POST", ROUTE.format(bank_id=bank_id), json=body) as response:
        run_id = response.headers["x-heed-run-id"]
        stream = sse_frames(response)
        await read_until(stream, count=5)
        deleted = await http.delete(f"/v1/default/banks/{bank_id}")
        assert deleted.status_code == 200, deleted.text
        rest = await read_until(stream)
    assert rest[-1].event == "cancelled"
    assert rest[-1].data["data"]["reason"] == "bank deleted"
    assert (await run_of(http, run_id))["phase"] == "cancelled"
    assert lane_in_use(server) == 0


async def test_errors_before_any_work_are_plain_json(http: httpx.AsyncClient, bank_id: str) -> None:
    missing = await http.post(
        ROUTE.format(bank_id="no-such-bank"), json={"query": "x", "stream": True}
    )
    assert missing.status_code == 404
    assert missing.headers["content-type"].startswith("application/json")
    bad = await http.post(
        ROUTE.format(bank_id=bank_id), json={"query": "x", "stream": True, "on_disconnect": "later"}
    )
    assert bad.status_code == 422


def test_the_result_object_is_the_wire_response_field_for_field() -> None:
    unit = StoredUnit(
        id="u1",
        seq=1,
        text="Alice has cats.",
        fact_type="world",
        context=None,
        document_id="d1",
        chunk_id="c1",
        occurred_start="2024-03-01T00:00:00+00:00",
        occurred_end=None,
        mentioned_at=None,
        metadata={"k": "v"},
        tags=["t"],
        entities=["Alice"],
        created_at="2024-03-01T00:00:00+00:00",
    )
    outcome = ReflectOutcome(
        text="Cats.",
        based_on=[unit],
        usage=Usage(10, 5),
        tool_calls=[ToolTrace("recall", {"query": "q"}, {"memories": []}, 3, 0)],
        llm_calls=[LLMTrace("agent_1", 7)],
        structured_output={"a": 1},
        structured_output_error=None,
    )
    for shape in (ResultShape(), ResultShape(facts=True, trace=True)):
        result = reflect_result(outcome, shape)
        assert ReflectResponse.model_validate(result).model_dump(mode="json") == result


def test_a_reflect_running_when_its_process_dies_is_interrupted(tmp_path: Path) -> None:
    data = tmp_path / "data"
    port = free_port()
    query = " ".join(f"w{i}" for i in range(400))  # the scripted echo answers slowly
    with (
        server_process(data, port) as proc,
        httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client,
    ):
        assert client.put("/v1/default/banks/b", json={"name": "b"}).status_code in (200, 201)
        body = {"query": query, "stream": True, "on_disconnect": "continue"}
        with client.stream("POST", ROUTE.format(bank_id="b"), json=body) as response:
            run_id = response.headers["x-heed-run-id"]
        wait_for(lambda: client.get(f"/v1/runs/{run_id}").json()["last_seq"] >= 10, 20)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)

    port = free_port()
    with (
        server_process(data, port),
        httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client,
    ):
        run = client.get(f"/v1/runs/{run_id}").json()
        assert (run["kind"], run["phase"]) == ("reflect", "interrupted")
        with client.stream("GET", f"/v1/runs/{run_id}/stream") as resp:
            text = resp.read().decode()
        assert text.rstrip().split("event: ")[-1].startswith("interrupted")
