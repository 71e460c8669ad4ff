"""Sessions over a real socket: the attach loop, status, admission, cancel, wakeups."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import httpx

from heed.settings import Settings
from tests.support import metric_value, wait_for

from .http_support import (
    SLOW_SCRIPT,
    WedgedProvider,
    new_session,
    run_phase,
    run_server,
    run_settings,
    sse_frames,
)


def turn(client: httpx.Client, sid: str, content: str, strategy: str = "reject") -> httpx.Response:
    return client.post(
        f"/v1/sessions/{sid}/turns", json={"content": content, "multitask_strategy": strategy}
    )


async def test_idle_session_with_wedged_cancelling_run_never_loops(
    make_settings: Callable[..., Settings],
) -> None:
    """The seed's loop: subscribe, attach when told, resubscribe after a terminal event.

    With a cancelling run whose worker is wedged, the session is busy but nothing is
    attachable: over 5 s the client attaches at most once (here: never).
    """
    wedged = WedgedProvider()
    with (
        run_server(run_settings(make_settings)) as server,
        httpx.Client(base_url=server.url) as client,
    ):
        server.app.state.services.turn_provider.current = wedged
        sid = new_session(client)
        run_id = turn(client, sid, "hello").json()["run_id"]
        wait_for(wedged.entered.is_set)
        cancelled = client.post(f"/v1/runs/{run_id}/cancel").json()
        assert cancelled["phase"] == "cancelling"

        attaches = 0
        subscriptions = 0
        deadline = time.monotonic() + 5.0
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as ac:
            while time.monotonic() < deadline:
                subscriptions += 1
                told: str | None = None
                try:
                    async with asyncio.timeout(max(0.01, deadline - time.monotonic())):
                        async with ac.stream("GET", f"/v1/sessions/{sid}/events") as resp:
                            async for frame in sse_frames(resp):
                                if frame.event == "turn_started":
                                    told = frame.data["data"]["run_id"]
                                    break
                except TimeoutError:
                    break
                if told is None:
                    continue
                attaches += 1
                async with ac.stream("GET", f"/v1/runs/{told}/stream") as resp:
                    async for frame in sse_frames(resp):
                        if frame.event in ("completed", "cancelled", "failed", "interrupted"):
                            break
        assert attaches <= 1, f"attached {attaches} times in {subscriptions} subscriptions"
        assert attaches == 0
        # lifecycle-busy, yet nothing to attach to
        status = client.get(f"/v1/sessions/{sid}/status").json()
        assert status["busy"] is True and status["busy_run_id"] == run_id
        assert status["active_run_id"] is None
        r = turn(client, sid, "again")
        assert r.status_code == 409 and r.json()["busy_run_id"] == run_id
        # ?wait=true is bounded: a wedged worker is still unwinding
        waited = client.post(f"/v1/runs/{run_id}/cancel?wait=true&timeout=0.3").json()
        assert waited["phase"] == "cancelling"
        wedged.release.set()
        wait_for(lambda: run_phase(client, run_id) == "cancelled")
        status = client.get(f"/v1/sessions/{sid}/status").json()
        assert status["busy"] is False
        messages = client.get(f"/v1/sessions/{sid}").json()["messages"]
        assert messages[-1]["role"] == "assistant" and messages[-1]["status"] == "cancelled"
        assert messages[-1]["content"].startswith("partial")


async def test_wedged_worker_is_never_reclaimed_by_age_and_shows_in_metrics(
    make_settings: Callable[..., Settings],
) -> None:
    wedged = WedgedProvider()
    settings = run_settings(make_settings, run_unwind_window=0.3)
    with run_server(settings) as server, httpx.Client(base_url=server.url) as client:
        server.app.state.services.turn_provider.current = wedged
        sid = new_session(client)
        run_id = turn(client, sid, "hello").json()["run_id"]
        wait_for(wedged.entered.is_set)
        client.post(f"/v1/runs/{run_id}/cancel")
        time.sleep(1.5)  # far past the unwind window, several reaper passes
        assert run_phase(client, run_id) == "cancelling"
        assert client.get(f"/v1/sessions/{sid}/status").json()["busy"] is True
        metrics = client.get("/metrics").text
        assert metric_value(metrics, "heed_runs_wedged") == 1.0
        wedged.release.set()
        wait_for(lambda: run_phase(client, run_id) == "cancelled")
        wait_for(lambda: metric_value(client.get("/metrics").text, "heed_runs_wedged") == 0.0)
        assert client.get(f"/v1/sessions/{sid}/status").json()["busy"] is False


async def test_running_turn_is_replayed_on_subscribe_and_attachable(
    make_settings: Callable[..., Settings],
) -> None:
    settings = run_settings(make_settings, llm_script=SLOW_SCRIPT)
    with run_server(settings) as server, httpx.Client(base_url=server.url) as client:
        sid = new_session(client)
        run_id = turn(client, sid, " ".join(["z"] * 100)).json()["run_id"]
        status = client.get(f"/v1/sessions/{sid}/status").json()
        assert status["busy"] is True and status["active_run_id"] == run_id
        async with (
            httpx.AsyncClient(base_url=server.url, timeout=10) as ac,
            ac.stream("GET", f"/v1/sessions/{sid}/events") as resp,
        ):
            frame = await anext(sse_frames(resp))
        assert frame.event == "turn_started" and frame.data["data"]["run_id"] == run_id
        assert frame.data["data"]["replayed"] is True
        client.post(f"/v1/runs/{run_id}/cancel?wait=true")


async def test_fifty_concurrent_starts_admit_exactly_one(
    make_settings: Callable[..., Settings],
) -> None:
    settings = run_settings(make_settings, llm_script=SLOW_SCRIPT)
    with run_server(settings) as server, httpx.Client(base_url=server.url) as client:
        sid = new_session(client)
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as ac:
            responses = await asyncio.gather(
                *(
                    ac.post(f"/v1/sessions/{sid}/turns", json={"content": f"go {i} a b c"})
                    for i in range(50)
                )
            )
        codes = sorted(r.status_code for r in responses)
        assert codes.count(202) == 1 and codes.count(409) == 49, codes
        winner = next(r for r in responses if r.status_code == 202).json()["run_id"]
        for r in responses:
            if r.status_code == 409:
                assert r.json()["busy_run_id"] == winner
                assert int(r.headers["retry-after"]) >= 1
        runs = server.app.state.services.run_store.list_runs(session_id=sid)
        assert len(runs) == 1


async def test_cancel_semantics_over_http(make_settings: Callable[..., Settings]) -> None:
    settings = run_settings(make_settings, llm_script=SLOW_SCRIPT)
    with run_server(settings) as server, httpx.Client(base_url=server.url) as client:
        sid = new_session(client)
        first = turn(client, sid, " ".join(["a"] * 200)).json()["run_id"]
        queued = turn(client, sid, "later", "enqueue").json()
        assert queued["run"]["phase"] == "queued"
        # queued -> cancelled, never starts
        r = client.post(f"/v1/runs/{queued['run_id']}/cancel").json()
        assert r["phase"] == "cancelled" and r["started_at"] is None
        wait_for(lambda: client.get(f"/v1/runs/{first}").json()["last_seq"] > 4)
        r = client.post(f"/v1/runs/{first}/cancel?wait=true").json()
        assert r["phase"] == "cancelled" and r["finished_at"] is not None
        again = client.post(f"/v1/runs/{first}/cancel").json()
        assert again == r  # terminal: unchanged
        assert client.get(f"/v1/runs/{queued['run_id']}").json()["started_at"] is None
        assert client.get(f"/v1/sessions/{sid}/status").json()["busy"] is False
        messages = client.get(f"/v1/sessions/{sid}").json()["messages"]
        assert messages[-1]["status"] == "cancelled" and messages[-1]["content"].startswith("a")
        # interrupt: cancels the busy run, starts after it stops
        busy = turn(client, sid, " ".join(["b"] * 200)).json()["run_id"]
        nxt = turn(client, sid, "x y", "interrupt").json()["run_id"]
        wait_for(lambda: run_phase(client, nxt) == "completed")
        a, b = client.get(f"/v1/runs/{busy}").json(), client.get(f"/v1/runs/{nxt}").json()
        assert a["phase"] == "cancelled" and b["started_at"] >= a["finished_at"]
        # a turn on a deleted session is 404
        assert client.delete(f"/v1/sessions/{sid}").status_code == 200
        assert turn(client, sid, "hi").status_code == 404


async def test_wakeups_deferred_while_busy_and_delivered_once(
    make_settings: Callable[..., Settings],
) -> None:
    spawn = {"name": "start_task", "arguments": {"action": "wait", "seconds": 0.1}}
    script = {
        "replies": [
            {"tool_calls": [spawn, spawn, spawn]},
            {"text": " ".join(["w"] * 30), "token_delay": 0.05},
        ]
    }
    settings = run_settings(make_settings, llm_script=json.dumps(script))
    with run_server(settings) as server, httpx.Client(base_url=server.url) as client:
        store = server.app.state.services.run_store
        sid = new_session(client)
        busy = turn(client, sid, "spawn three tasks").json()["run_id"]

        def tasks() -> list[Any]:
            return [r for r in store.list_runs(session_id=sid) if r.kind == "task"]

        wait_for(lambda: len(tasks()) == 3 and all(t.phase == "completed" for t in tasks()))
        # the session is still busy with the user turn: nothing delivered yet
        assert run_phase(client, busy) == "running"
        assert client.get(f"/v1/sessions/{sid}/status").json()["pending_wakeups"] == 3

        def wakeups() -> list[Any]:
            return [r for r in store.list_runs(session_id=sid) if r.source == "wakeup"]

        assert wakeups() == []
        wait_for(lambda: run_phase(client, busy) == "completed")
        wait_for(lambda: [r for r in wakeups() if r.phase == "completed"])
        time.sleep(1.0)  # several reaper passes: nothing is delivered twice
        assert len(wakeups()) == 1
        assert wakeups()[0].summary["wakeups"] == 3
        assert client.get(f"/v1/sessions/{sid}/status").json()["pending_wakeups"] == 0
        messages = client.get(f"/v1/sessions/{sid}").json()["messages"]
        assert [m["source"] for m in messages if m["role"] == "user"] == ["user", "wakeup"]


async def test_wakeup_delivered_when_stale_cancelling_run_is_reclaimed(
    make_settings: Callable[..., Settings],
) -> None:
    settings = run_settings(make_settings, run_unwind_window=1.0)
    with run_server(settings) as server, httpx.Client(base_url=server.url) as client:
        services = server.app.state.services
        sid = new_session(client)
        run_id = turn(client, sid, "hi").json()["run_id"]
        wait_for(lambda: run_phase(client, run_id) == "completed")
        # The row a dead worker leaves: cancelling, no live lease; plus a pending wakeup.
        now = time.time()
        with services.run_store.db.write() as conn:
            conn.execute(
                "UPDATE runs SET phase='cancelling', cancelled_at=?, lease_expires_at=NULL,"
                " worker_id='gone:1:x', finished_at=NULL WHERE id=?",
                (now, run_id),
            )
        from heed.sessions.store import Wakeup

        services.session_store.add_wakeup(
            Wakeup("wk_test", sid, "run_task_x", {"phase": "completed"}, now)
        )
        status = client.get(f"/v1/sessions/{sid}/status").json()
        assert status["busy"] is True and status["active_run_id"] is None
        wait_for(lambda: run_phase(client, run_id) == "cancelled", seconds=10)
        wait_for(
            lambda: [
                r for r in services.run_store.list_runs(session_id=sid) if r.source == "wakeup"
            ],
            seconds=5,
        )
        time.sleep(0.6)
        assert (
            len([r for r in services.run_store.list_runs(session_id=sid) if r.source == "wakeup"])
            == 1
        )
