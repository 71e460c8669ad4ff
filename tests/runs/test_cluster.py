"""Two ``heed serve`` processes on PostgreSQL and Redis act as one service.

Each instance has its own data dir, so everything they share goes through PostgreSQL
(state) and Redis (signals). The servers are real child processes on loopback ports.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest
import redis

from tests.pg_support import fresh_schema
from tests.support import free_port, wait_for

from .http_support import new_session, run_phase, server_process, sse_frames

REDIS_URL = os.environ.get("HEED_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
LONG = " ".join(["k"] * 400)  # 400 words at 50 ms each: a turn of 20 s


@contextmanager
def cluster(tmp_path: Path, **env: str) -> Iterator[tuple[str, str, list[int]]]:
    """Two instances (A, B) on one fresh PostgreSQL schema and one Redis prefix; yields
    their base URLs and their pids."""
    with fresh_schema() as database_url, ExitStack() as stack:
        shared = {
            "HEED_DATABASE_URL": database_url,
            "HEED_REDIS_URL": REDIS_URL,
            "HEED_REDIS_PREFIX": f"heed-test-{uuid.uuid4().hex[:8]}:",
            **env,
        }
        ports = [free_port(), free_port()]
        procs = [
            stack.enter_context(server_process(tmp_path / f"data-{i}", port, **shared))
            for i, port in enumerate(ports)
        ]
        a, b = (f"http://127.0.0.1:{port}" for port in ports)
        yield a, b, [p.pid for p in procs]


async def test_admission_is_atomic_across_instances(tmp_path: Path) -> None:
    with cluster(tmp_path) as (a, b, _):
        with httpx.Client(base_url=a) as client:
            sid = new_session(client, title="shared")
        with httpx.Client(base_url=b) as client:
            assert client.get(f"/v1/sessions/{sid}").json()["title"] == "shared"
        async with httpx.AsyncClient(timeout=30) as ac:
            responses = await asyncio.gather(
                *(
                    ac.post(f"{(a, b)[i % 2]}/v1/sessions/{sid}/turns", json={"content": "p q r"})
                    for i in range(40)
                )
            )
        codes = [r.status_code for r in responses]
        assert codes.count(202) == 1 and codes.count(409) == 39, codes
        busy = next(r for r in responses if r.status_code == 409).json()
        winner = next(r for r in responses if r.status_code == 202).json()["run_id"]
        assert winner in str(busy)  # the refusal names the run that holds the session


async def test_a_turn_on_a_streams_resumes_and_cancels_from_b(tmp_path: Path) -> None:
    # The reaper (which would also notice a cancel, at its next lease renewal) runs every
    # 30 s here: a worker that stops within seconds was told through Redis.
    with cluster(tmp_path, HEED_RUN_REAPER_INTERVAL="30", HEED_RUN_LEASE_SECONDS="90") as (
        a,
        b,
        _,
    ):
        with httpx.Client(base_url=a) as client:
            sid = new_session(client)
        async with httpx.AsyncClient(timeout=30) as ac:
            async with ac.stream("GET", f"{b}/v1/sessions/{sid}/events") as events:
                started = await ac.post(f"{a}/v1/sessions/{sid}/turns", json={"content": LONG})
                assert started.status_code == 202, started.text
                run_id = started.json()["run_id"]
                async for frame in sse_frames(events):
                    if frame.event == "turn_started":
                        assert frame.data["data"]["run_id"] == run_id
                        break

            # B streams A's run, leaves after a few events, and resumes where it left.
            first: list[int] = []
            async with ac.stream("GET", f"{b}/v1/runs/{run_id}/stream") as resp:
                async for frame in sse_frames(resp):
                    if frame.id:
                        first.append(int(frame.id))
                    if len(first) == 5:
                        break
            resumed: list[int] = []
            headers = {"Last-Event-ID": str(first[-1])}
            async with ac.stream("GET", f"{b}/v1/runs/{run_id}/stream", headers=headers) as resp:
                async for frame in sse_frames(resp):
                    if frame.id:
                        resumed.append(int(frame.id))
                    if len(resumed) == 5:
                        break
            seqs = first + resumed
            assert seqs == list(range(1, len(seqs) + 1)), seqs

            # Cancelled from B: the worker on A stops, told through Redis.
            sent = time.monotonic()
            cancel = await ac.post(f"{b}/v1/runs/{run_id}/cancel")
            assert cancel.json()["phase"] in ("cancelling", "cancelled")
        with httpx.Client(base_url=b) as client:
            wait_for(lambda: run_phase(client, run_id) == "cancelled", seconds=10)
            assert time.monotonic() - sent < 10
            assert client.get(f"/v1/sessions/{sid}/status").json()["busy"] is False
            last = client.get(f"/v1/runs/{run_id}").json()["last_seq"]
        with httpx.Client(base_url=a) as client:
            time.sleep(0.5)  # a worker that had not stopped would still be appending
            assert client.get(f"/v1/runs/{run_id}").json()["last_seq"] == last
            messages = client.get(f"/v1/sessions/{sid}").json()["messages"]
        assert [m["status"] for m in messages if m["role"] == "assistant"] == ["cancelled"]


@pytest.mark.slow
async def test_kill_9_of_an_instance_leaves_its_turn_interrupted_by_the_other(
    tmp_path: Path,
) -> None:
    with cluster(tmp_path, HEED_RUN_LEASE_SECONDS="2", HEED_RUN_REAPER_INTERVAL="0.5") as (
        a,
        b,
        pids,
    ):
        with httpx.Client(base_url=a) as client:
            sid = new_session(client)
            run_id = client.post(f"/v1/sessions/{sid}/turns", json={"content": LONG}).json()[
                "run_id"
            ]
            wait_for(lambda: client.get(f"/v1/runs/{run_id}").json()["last_seq"] >= 3)
        os.kill(pids[0], signal.SIGKILL)
        killed = time.monotonic()
        with httpx.Client(base_url=b) as client:
            wait_for(lambda: run_phase(client, run_id) == "interrupted", seconds=20)
            took = time.monotonic() - killed
            assert took < 2 + 0.5 + 5, took  # lease + one reaper pass, and slack
            assert client.get(f"/v1/sessions/{sid}/status").json()["busy"] is False
            frames: list[str] = []
            async with (
                httpx.AsyncClient(base_url=b, timeout=30) as ac,
                ac.stream("GET", f"/v1/runs/{run_id}/stream") as resp,
            ):
                async for frame in sse_frames(resp):
                    if frame.id:
                        frames.append(frame.event)
            assert frames[-1] == "interrupted"
            # and the session takes a new turn at once
            again = client.post(f"/v1/sessions/{sid}/turns", json={"content": "after"})
            assert again.status_code == 202, again.text


@contextmanager
def private_redis(directory: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A ``redis-server`` of this test alone (so the test may kill it)."""
    port = free_port()
    args = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(
        ["redis-server", *args, "--dir", str(directory)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"redis://127.0.0.1:{port}/0"

        def up() -> bool:
            try:
                return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
            except redis.RedisError:
                return False

        wait_for(up, seconds=10)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


async def test_losing_redis_loses_no_event_and_cancels_still_arrive(tmp_path: Path) -> None:
    with (
        private_redis(tmp_path) as (redis_url, redis_proc),
        cluster(tmp_path, HEED_REDIS_URL=redis_url, HEED_RUN_REAPER_INTERVAL="0.5") as (a, b, _),
    ):
        with httpx.Client(base_url=a) as client:
            sid = new_session(client)
            words = " ".join(f"w{i}" for i in range(60))  # 3 s of tokens
            run_id = client.post(f"/v1/sessions/{sid}/turns", json={"content": words}).json()[
                "run_id"
            ]
        seqs: list[int] = []
        last_event = ""
        async with (
            httpx.AsyncClient(timeout=30) as ac,
            ac.stream("GET", f"{b}/v1/runs/{run_id}/stream") as resp,
        ):
            async for frame in sse_frames(resp):
                if frame.id:
                    seqs.append(int(frame.id))
                    last_event = frame.event
                if len(seqs) == 5:
                    redis_proc.kill()  # mid-stream: B now learns of A's events by polling
                if frame.event in ("completed", "failed", "cancelled", "interrupted"):
                    break
        assert last_event == "completed"
        assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) > 20
        with httpx.Client(base_url=b) as client:
            assert client.get(f"/v1/runs/{run_id}").json()["last_seq"] == seqs[-1]
            # A cancel sent to B reaches A's worker through the database (lease renewal).
            long_run = client.post(f"/v1/sessions/{sid}/turns", json={"content": LONG}).json()[
                "run_id"
            ]
            wait_for(lambda: client.get(f"/v1/runs/{long_run}").json()["last_seq"] >= 3)
            client.post(f"/v1/runs/{long_run}/cancel").raise_for_status()
            wait_for(lambda: run_phase(client, long_run) == "cancelled", seconds=10)
