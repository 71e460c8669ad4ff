"""SIGTERM drains a real ``heed serve``: open streams get their last event, then it exits."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from heed.runs.manager import SHUTDOWN
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
