"""Restart recovery with a real server process killed with SIGKILL mid-turn."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from heed.sessions.store import Wakeup
from heed.settings import Settings
from heed.storage import SqliteDatabase
from heed.storage.session_store import SqlSessionStore
from tests.support import free_port, wait_for

from .http_support import (
    SLOW_SCRIPT,
    new_session,
    run_phase,
    run_server,
    run_settings,
    server_process,
)


def test_sigkill_mid_turn_then_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    port = free_port()
    words = " ".join(f"word{i}" for i in range(200))
    with (
        server_process(data, port) as proc,
        httpx.Client(base_url=f"http://127.0.0.1:{port}") as client,
    ):
        sid = new_session(client)
        r = client.post(f"/v1/sessions/{sid}/turns", json={"content": words})
        run_id = r.json()["run_id"]
        queued = client.post(
            f"/v1/sessions/{sid}/turns", json={"content": "after", "multitask_strategy": "enqueue"}
        ).json()["run_id"]
        wait_for(lambda: client.get(f"/v1/runs/{run_id}").json()["last_seq"] >= 10)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)

    port2 = free_port()
    with server_process(data, port2), httpx.Client(base_url=f"http://127.0.0.1:{port2}") as client:
        run = client.get(f"/v1/runs/{run_id}").json()
        assert run["phase"] == "interrupted"
        assert run["finished_at"] is not None
        # the journal ends in a synthetic terminal event, and the stream ends there
        with client.stream("GET", f"/v1/runs/{run_id}/stream", timeout=10) as resp:
            body = resp.read().decode()
        assert body.rstrip().split("event: ")[-1].startswith("interrupted")
        tokens = body.count("event: text_delta")
        assert 0 < tokens < 200
        # the partial output is in the transcript, marked interrupted
        messages = client.get(f"/v1/sessions/{sid}").json()["messages"]
        partial = [m for m in messages if m["run_id"] == run_id and m["role"] == "assistant"]
        assert partial and partial[0]["status"] == "interrupted"
        assert words.startswith(partial[0]["content"].strip()) and partial[0]["content"]
        # the queued turn was not lost: it runs now; then the session is not stuck busy
        wait_for(lambda: run_phase(client, queued) == "completed", seconds=15)
        wait_for(lambda: client.get(f"/v1/sessions/{sid}/status").json()["busy"] is False)
        ok = client.post(f"/v1/sessions/{sid}/turns", json={"content": "hello again"})
        assert ok.status_code == 202
        time.sleep(0.1)


def test_graceful_shutdown_mid_turn_interrupts_and_keeps_partial_output(
    make_settings: Callable[..., Settings],
) -> None:
    settings = run_settings(make_settings, llm_script=SLOW_SCRIPT)
    words = " ".join(f"v{i}" for i in range(200))
    with run_server(settings) as server, httpx.Client(base_url=server.url) as client:
        sid = new_session(client)
        run_id = client.post(f"/v1/sessions/{sid}/turns", json={"content": words}).json()["run_id"]
        wait_for(lambda: client.get(f"/v1/runs/{run_id}").json()["last_seq"] >= 6)
    with run_server(settings) as server, httpx.Client(base_url=server.url) as client:
        run = client.get(f"/v1/runs/{run_id}").json()
        assert run["phase"] == "interrupted"
        messages = client.get(f"/v1/sessions/{sid}").json()["messages"]
        partial = [m for m in messages if m["run_id"] == run_id and m["role"] == "assistant"]
        assert len(partial) == 1 and partial[0]["status"] == "interrupted"
        assert partial[0]["content"] and words.startswith(partial[0]["content"])
        assert client.get(f"/v1/sessions/{sid}/status").json()["busy"] is False


def test_pending_wakeups_are_delivered_on_start(make_settings: Callable[..., Settings]) -> None:
    settings = run_settings(make_settings)
    with run_server(settings) as server, httpx.Client(base_url=server.url) as client:
        sid = new_session(client)
    # A task finished just before the previous process died: its wakeup is pending.
    store = SqlSessionStore(SqliteDatabase(settings.database_path()))
    store.add_wakeup(Wakeup("wk_restart", sid, "run_task_gone", {"phase": "completed"}, 0.0))
    store.db.close()
    with run_server(settings) as server, httpx.Client(base_url=server.url) as client:
        runs = server.app.state.services.run_store

        def wakeup_turns() -> list[object]:
            return [r for r in runs.list_runs(session_id=sid) if r.source == "wakeup"]

        wait_for(lambda: len(wakeup_turns()) == 1)
        wait_for(lambda: client.get(f"/v1/sessions/{sid}/status").json()["busy"] is False)
        assert client.get(f"/v1/sessions/{sid}/status").json()["pending_wakeups"] == 0
        assert len(wakeup_turns()) == 1


def test_graceful_shutdown_records_the_wakeup_of_an_interrupted_task(
    make_settings: Callable[..., Settings],
) -> None:
    """A background task interrupted by shutdown still writes its wakeup (``on_terminal`` in
    the same transaction), so the next process tells the session about it."""
    spawn = {"name": "start_task", "arguments": {"action": "wait", "seconds": 60}}
    script = {"replies": [{"tool_calls": [spawn]}, {"text": "started it"}]}
    settings = run_settings(make_settings, llm_script=json.dumps(script))
    with run_server(settings) as server, httpx.Client(base_url=server.url) as client:
        runs = server.app.state.services.run_store
        sid = new_session(client)
        client.post(f"/v1/sessions/{sid}/turns", json={"content": "start a task"})

        def running_task() -> list[object]:
            return [
                r
                for r in runs.list_runs(session_id=sid)
                if r.kind == "task" and r.phase == "running"
            ]

        wait_for(running_task)
        task_id = running_task()[0].id  # type: ignore[attr-defined]
    store = SqlSessionStore(SqliteDatabase(settings.database_path()))
    try:
        pending = [w for w in store.pending_wakeups() if w.session_id == sid]
    finally:
        store.db.close()
    assert [w.task_run_id for w in pending] == [task_id]
    assert pending[0].summary["phase"] == "interrupted"
