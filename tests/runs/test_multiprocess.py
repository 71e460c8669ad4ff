"""Two server processes sharing one database: admission and streams still hold."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from tests.support import free_port, wait_for

from .http_support import new_session, run_phase, server_process, sse_frames


async def test_two_processes_admit_one_turn_and_stream_each_others_runs(tmp_path: Path) -> None:
    data = tmp_path / "data"
    port_a, port_b = free_port(), free_port()
    with server_process(data, port_a), server_process(data, port_b):
        a, b = f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"
        with httpx.Client(base_url=a) as client:
            sid = new_session(client)
        async with httpx.AsyncClient(timeout=30) as ac:
            responses = await asyncio.gather(
                *(
                    ac.post(f"{(a, b)[i % 2]}/v1/sessions/{sid}/turns", json={"content": "p q r s"})
                    for i in range(50)
                )
            )
            codes = [r.status_code for r in responses]
            assert codes.count(202) == 1 and codes.count(409) == 49, codes
            winner = next(r for r in responses if r.status_code == 202)
            run_id = winner.json()["run_id"]
            owner = str(winner.request.url).split("/v1/")[0]
            other = b if owner == a else a
            # the other process streams the run from the shared journal (polling it)
            seqs: list[int] = []
            async with ac.stream("GET", f"{other}/v1/runs/{run_id}/stream") as resp:
                async for frame in sse_frames(resp):
                    if frame.id:
                        seqs.append(int(frame.id))
                    if frame.event == "completed":
                        break
            assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) > 4
        with httpx.Client(base_url=other) as client:
            wait_for(lambda: run_phase(client, run_id) == "completed")
            assert client.get(f"/v1/sessions/{sid}/status").json()["busy"] is False
            # a cancel sent to the process that does not own the worker reaches it
            long_run = client.post(
                f"/v1/sessions/{sid}/turns", json={"content": " ".join(["k"] * 300)}
            ).json()["run_id"]
        with httpx.Client(base_url=owner) as owner_client, httpx.Client(base_url=other) as c2:
            wait_for(lambda: owner_client.get(f"/v1/runs/{long_run}").json()["last_seq"] >= 3)
            assert c2.post(f"/v1/runs/{long_run}/cancel").json()["phase"] in (
                "cancelling",
                "cancelled",
            )
            wait_for(lambda: run_phase(c2, long_run) == "cancelled", seconds=10)
