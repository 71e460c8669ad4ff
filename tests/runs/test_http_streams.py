"""The run stream over a real socket: resume cursors, seam, gap, heartbeats, bad input."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx

from heed.settings import Settings
from tests.support import wait_for

from .http_support import SLOW_SCRIPT, new_session, run_phase, run_server, run_settings, sse_frames


async def read_stream(
    base: str,
    run_id: str,
    *,
    after: int | None = None,
    headers: dict[str, str] | None = None,
    stop_after: int | None = None,
) -> list:
    url = f"{base}/v1/runs/{run_id}/stream"
    if after is not None:
        url += f"?after={after}"
    frames = []
    async with (
        httpx.AsyncClient(timeout=20) as client,
        client.stream("GET", url, headers=headers or {}) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for frame in sse_frames(response):
            frames.append(frame)
            if stop_after is not None and len([f for f in frames if f.id]) >= stop_after:
                break
    return frames


def start_turn(client: httpx.Client, session_id: str, content: str) -> str:
    r = client.post(f"/v1/sessions/{session_id}/turns", json={"content": content})
    assert r.status_code == 202, r.text
    body = r.json()
    assert body["stream_url"] == f"/v1/runs/{body['run_id']}/stream"
    return str(body["run_id"])


async def test_finished_run_replays_in_full_and_ends(
    make_settings: Callable[..., Settings],
) -> None:
    with (
        run_server(run_settings(make_settings)) as server,
        httpx.Client(base_url=server.url) as client,
    ):
        sid = new_session(client)
        run_id = start_turn(client, sid, "one two three four")
        wait_for(lambda: run_phase(client, run_id) == "completed")
        frames = [f for f in await read_stream(server.url, run_id) if f.id]
        seqs = [int(f.id) for f in frames]
        assert seqs == list(range(1, len(seqs) + 1))
        assert frames[-1].event == "completed"
        text = "".join(f.data["data"]["text"] for f in frames if f.event == "text_delta")
        assert text == "one two three four"
        # resume by Last-Event-ID and by ?after (which wins)
        tail = [
            f for f in await read_stream(server.url, run_id, headers={"Last-Event-ID": "3"}) if f.id
        ]
        assert [int(f.id) for f in tail] == seqs[3:]
        tail = [
            f
            for f in await read_stream(server.url, run_id, after=5, headers={"Last-Event-ID": "2"})
            if f.id
        ]
        assert [int(f.id) for f in tail] == seqs[5:]
        # a malformed Last-Event-ID counts as 0
        full = [
            f
            for f in await read_stream(server.url, run_id, headers={"Last-Event-ID": "abc"})
            if f.id
        ]
        assert [int(f.id) for f in full] == seqs


async def test_live_tail_has_no_gap_or_duplicate_across_reconnects(
    make_settings: Callable[..., Settings],
) -> None:
    settings = run_settings(make_settings, llm_script=SLOW_SCRIPT)
    words = " ".join(f"w{i}" for i in range(40))
    with run_server(settings) as server, httpx.Client(base_url=server.url) as client:
        sid = new_session(client)
        run_id = start_turn(client, sid, words)
        seen: list[int] = []
        text: list[str] = []
        cursor = 0
        for _ in range(100):  # reconnect after every 3 events
            frames = await read_stream(server.url, run_id, after=cursor, stop_after=3)
            for f in frames:
                if not f.id:
                    continue
                seen.append(int(f.id))
                if f.event == "text_delta":
                    text.append(f.data["data"]["text"])
                cursor = int(f.id)
            if frames and any(f.event == "completed" for f in frames):
                break
        assert seen == list(range(1, len(seen) + 1))
        assert "".join(text) == words
        stored = client.get(f"/v1/sessions/{sid}").json()["messages"]
        assert stored[-1]["content"] == words


async def test_after_beyond_the_end_waits_with_heartbeats(
    make_settings: Callable[..., Settings],
) -> None:
    settings = run_settings(make_settings, llm_script=SLOW_SCRIPT)
    with run_server(settings) as server, httpx.Client(base_url=server.url) as client:
        sid = new_session(client)
        run_id = start_turn(client, sid, " ".join(["x"] * 30))
        frames = await read_stream(server.url, run_id, after=20)
        ids = [int(f.id) for f in frames if f.id]
        assert ids and ids[0] == 21 and frames[-1].event == "completed"
        assert any(f.comment for f in frames)  # heartbeats while waiting for seq 21


async def test_old_cursor_gets_explicit_gap(make_settings: Callable[..., Settings]) -> None:
    with (
        run_server(run_settings(make_settings)) as server,
        httpx.Client(base_url=server.url) as client,
    ):
        sid = new_session(client)
        run_id = start_turn(client, sid, "a b c d e f")
        wait_for(lambda: run_phase(client, run_id) == "completed")
        server.app.state.services.run_store.trim_journal(run_id, 5)
        frames = await read_stream(server.url, run_id, after=1)
        assert frames[0].event == "gap"
        assert frames[0].data["first_retained"] == 5
        assert int(frames[1].id) == 5
        frames = await read_stream(server.url, run_id, after=6)
        assert all(f.event != "gap" for f in frames)


async def test_unknown_ids_are_404(make_settings: Callable[..., Settings]) -> None:
    with (
        run_server(run_settings(make_settings)) as server,
        httpx.Client(base_url=server.url) as client,
    ):
        assert client.get("/v1/runs/run_nope").status_code == 404
        assert client.get("/v1/runs/run_nope/stream").status_code == 404
        assert client.post("/v1/runs/run_nope/cancel").status_code == 404
        assert client.get("/v1/sessions/ses_nope").status_code == 404
        assert client.get("/v1/sessions/ses_nope/status").status_code == 404
        assert client.get("/v1/sessions/ses_nope/events").status_code == 404
        r = client.post("/v1/sessions/ses_nope/turns", json={"content": "hi"})
        assert r.status_code == 404


async def test_stream_stops_when_client_leaves(make_settings: Callable[..., Settings]) -> None:
    settings = run_settings(make_settings, llm_script=SLOW_SCRIPT)
    with run_server(settings) as server, httpx.Client(base_url=server.url) as client:
        sid = new_session(client)
        run_id = start_turn(client, sid, " ".join(["y"] * 200))
        broker = server.app.state.services.broker
        await read_stream(server.url, run_id, stop_after=2)
        await asyncio.sleep(0.3)
        assert broker.subscriber_count(f"run:{run_id}") == 0
        client.post(f"/v1/runs/{run_id}/cancel?wait=true")
        # a finished run's journal: a cursor at its end ends the stream at once
        frames = await read_stream(server.url, run_id, after=999)
        assert [f for f in frames if f.id] == []
        # an idle stream (waiting beyond the end of a live run) and an idle session channel
        # stop as soon as their client leaves
        live = start_turn(client, sid, " ".join(["y"] * 200))
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as ac:
            for path, topic in (
                (f"/v1/runs/{live}/stream?after=999", f"run:{live}"),
                (f"/v1/sessions/{sid}/events", f"session:{sid}"),
            ):
                async with ac.stream("GET", path) as resp:
                    assert resp.status_code == 200
                    await asyncio.sleep(0.2)
                    assert broker.subscriber_count(topic) == 1
                await asyncio.sleep(0.3)
                assert broker.subscriber_count(topic) == 0
        client.post(f"/v1/runs/{live}/cancel?wait=true")


async def test_other_tenants_runs_and_sessions_are_404(
    make_settings: Callable[..., Settings],
) -> None:
    settings = run_settings(make_settings, api_keys="ka=alpha,kb=beta")
    with run_server(settings) as server:
        a = httpx.Client(base_url=server.url, headers={"Authorization": "Bearer ka"})
        b = httpx.Client(base_url=server.url, headers={"Authorization": "Bearer kb"})
        with a, b:
            sid = new_session(a)
            run_id = start_turn(a, sid, "secret words")
            assert b.get(f"/v1/sessions/{sid}").status_code == 404
            assert b.get(f"/v1/sessions/{sid}/status").status_code == 404
            assert b.post(f"/v1/sessions/{sid}/turns", json={"content": "x"}).status_code == 404
            assert b.get(f"/v1/runs/{run_id}").status_code == 404
            assert b.get(f"/v1/runs/{run_id}/stream").status_code == 404
            assert b.post(f"/v1/runs/{run_id}/cancel").status_code == 404
            assert b.get("/v1/sessions").json()["sessions"] == []
            assert a.get(f"/v1/runs/{run_id}").status_code == 200
