"""SIGTERM drains a real ``heed serve``: open streams get their last event, then it exits."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from heed.runs.ending import SHUTDOWN
from heed.settings import Settings
from tests.runs.http_support import (
    Frame,
    new_session,
    run_server,
    run_settings,
    server_process,
    sse_frames,
)
from tests.support import free_port, wait_for


async def _collect(client: httpx.AsyncClient, url: str, into: list[Frame]) -> None:
    async with client.stream("GET", url, timeout=30) as response:
        assert response.status_code == 200
        async for frame in sse_frames(response):
            if not frame.comment:
                into.append(frame)


def test_sigterm_sends_terminal_events_and_exits_within_grace(tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    words = " ".join(f"w{i}" for i in range(400))  # 50 ms a word: 20 s, far past the grace
    with server_process(tmp_path / "data", port, HEED_SHUTDOWN_GRACE_SECONDS="3") as proc:
        with httpx.Client(base_url=base) as client:
            sid = new_session(client)
            run_id = client.post(f"/v1/sessions/{sid}/turns", json={"content": words}).json()[
                "run_id"
            ]
            wait_for(lambda: client.get(f"/v1/runs/{run_id}").json()["last_seq"] >= 3)

        async def scenario() -> tuple[list[Frame], list[Frame], int, float]:
            run_frames: list[Frame] = []
            channel_frames: list[Frame] = []
            async with httpx.AsyncClient(base_url=base) as aclient:
                streams = [
                    asyncio.create_task(_collect(aclient, f"/v1/runs/{run_id}/stream", run_frames)),
                    asyncio.create_task(
                        _collect(aclient, f"/v1/sessions/{sid}/events", channel_frames)
                    ),
                ]
                while not run_frames or not channel_frames:
                    await asyncio.sleep(0.05)
                sent = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                await asyncio.wait_for(asyncio.gather(*streams), timeout=20)
                code = await asyncio.to_thread(proc.wait, 20)
                return run_frames, channel_frames, code, time.monotonic() - sent

        run_frames, channel_frames, code, took = asyncio.run(scenario())

    # uvicorn re-raises the signal it handled once shutdown is complete
    assert code in (0, -signal.SIGTERM)
    assert took < 3 + 5  # the grace, plus start-up slack for a noisy machine
    # the run stream ended on its terminal event, and saw it exactly once
    assert run_frames[-1].event == "interrupted"
    assert run_frames[-1].data["data"]["reason"] == SHUTDOWN
    assert sum(1 for f in run_frames if f.event == "interrupted") == 1
    # the session channel said why it ended
    assert channel_frames[-1].event == "shutdown"

    # the run is recorded interrupted, with its partial output kept, and the next
    # process finds the session idle
    port2 = free_port()
    with (
        server_process(tmp_path / "data", port2),
        httpx.Client(base_url=f"http://127.0.0.1:{port2}") as client,
    ):
        run = client.get(f"/v1/runs/{run_id}").json()
        assert run["phase"] == "interrupted"
        messages = client.get(f"/v1/sessions/{sid}").json()["messages"]
        partial = [m for m in messages if m["run_id"] == run_id and m["role"] == "assistant"]
        assert len(partial) == 1 and partial[0]["status"] == "interrupted"
        assert client.get(f"/v1/sessions/{sid}/status").json()["busy"] is False


def test_requests_during_drain_answer_503_and_channels_end(
    make_settings: Callable[..., Settings],
) -> None:
    """Once draining, a new request is refused with Retry-After and an open channel ends
    with a ``shutdown`` event; the health probe says so too."""
    settings = run_settings(make_settings)
    with run_server(settings) as server, httpx.Client(base_url=server.url) as client:
        sid = new_session(client)

        async def scenario() -> list[Frame]:
            frames: list[Frame] = []
            async with httpx.AsyncClient(base_url=server.url) as aclient:
                task = asyncio.create_task(_collect(aclient, f"/v1/sessions/{sid}/events", frames))
                while not frames:
                    await asyncio.sleep(0.02)
                server.app.state.drain.begin()
                await asyncio.wait_for(task, timeout=10)
            return frames

        frames = asyncio.run(scenario())
        assert frames[-1].event == "shutdown"
        assert frames[-1].data["data"]["reason"] == "shutdown"
        refused = client.get("/v1/banks")
        assert refused.status_code == 503
        assert int(refused.headers["retry-after"]) >= 1
        assert "shutting down" in refused.json()["detail"]


def test_sigterm_under_load_refuses_cancels_and_leaves_every_run_terminal(tmp_path: Path) -> None:
    """Twelve clients recall in a loop, a turn and a streamed reflect are running: SIGTERM
    ends it all within the grace, no client ever sees a 5xx other than 503, and the next
    process finds both runs interrupted and nothing busy."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    words = " ".join(f"w{i}" for i in range(400))  # 50 ms a word: 20 s, far past the grace
    with server_process(tmp_path / "data", port, HEED_SHUTDOWN_GRACE_SECONDS="3") as proc:
        with httpx.Client(base_url=base, timeout=30) as client:
            client.put("/v1/default/banks/b", json={"name": "b"}).raise_for_status()
            facts = [
                {"content": f"Fact number {i} about the weather in town {i}."} for i in range(40)
            ]
            client.post("/v1/default/banks/b/memories", json={"items": facts}).raise_for_status()
            sid = new_session(client)
            turn = client.post(f"/v1/sessions/{sid}/turns", json={"content": words}).json()
            body = {"query": words, "stream": True, "on_disconnect": "continue"}
            with client.stream("POST", "/v1/default/banks/b/reflect", json=body) as response:
                reflect_id = response.headers["x-heed-run-id"]
            for run_id in (turn["run_id"], reflect_id):
                wait_for(lambda r=run_id: client.get(f"/v1/runs/{r}").json()["last_seq"] >= 3)

        statuses: list[int] = []
        errors: list[str] = []

        async def recaller(http: httpx.AsyncClient, stop: asyncio.Event) -> None:
            while not stop.is_set():
                try:
                    r = await http.post(
                        "/v1/default/banks/b/memories/recall", json={"query": "weather"}
                    )
                    statuses.append(r.status_code)
                except httpx.TransportError as exc:  # the server went away: expected
                    errors.append(type(exc).__name__)
                    await asyncio.sleep(0.05)

        async def scenario() -> tuple[int, float, int]:
            stop = asyncio.Event()
            async with httpx.AsyncClient(base_url=base, timeout=10) as http:
                clients = [asyncio.create_task(recaller(http, stop)) for _ in range(12)]
                await asyncio.sleep(1.5)
                before = len(statuses)
                sent = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                code = await asyncio.to_thread(proc.wait, 20)
                took = time.monotonic() - sent
                stop.set()
                await asyncio.gather(*clients)
            return code, took, before

        code, took, before = asyncio.run(scenario())

    assert code in (0, -signal.SIGTERM)
    assert took < 3 + 5  # the grace, plus slack for a noisy machine
    assert before > 20, "the load never got going"
    assert 200 in statuses
    assert set(statuses) <= {200, 499, 503}, sorted(set(statuses))

    port2 = free_port()
    with (
        server_process(tmp_path / "data", port2),
        httpx.Client(base_url=f"http://127.0.0.1:{port2}") as client,
    ):
        for run_id in (turn["run_id"], reflect_id):
            run = client.get(f"/v1/runs/{run_id}").json()
            assert run["phase"] == "interrupted", run
            with client.stream("GET", f"/v1/runs/{run_id}/stream") as resp:
                text = resp.read().decode()
            assert text.count("event: interrupted") == 1
        assert client.get(f"/v1/sessions/{sid}/status").json()["busy"] is False
