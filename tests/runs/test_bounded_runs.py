"""Issue #28, rows 6, 10 and 11: what runs cost in the background is bounded.

- Row 6: a run's payload (up to the body limit) is read only by the worker that executes
  it: listings, operations, stats, the reaper and admission never load it.
- Row 10: a session holds at most ``max_queued_per_session`` queued turns, and a reaper
  pass reads the runs that hold workers, never the queue.
- Row 11: an idle run stream waits on the broker and reads nothing from the store; at
  most ``HEED_TENANT_MAX_STREAMS`` streams per tenant are open.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from heed.runs.manager import QueueFull
from heed.runs.model import Phase, Run, new_run_id
from heed.runs.reaper import Reaper, reap_once
from heed.settings import Settings
from heed.storage import SqlDatabase, apply_migrations
from heed.storage.run_store import MIGRATIONS, SqlRunStore
from tests.support import free_port, wait_for

from .conftest import build_manager
from .http_support import (
    SLOW_SCRIPT,
    new_session,
    run_phase,
    run_server,
    run_settings,
    server_process,
    sse_frames,
)

BIG = "x" * 1_000_000  # one payload of 1 MB


class _Recorder:
    """A connection that records every statement it executes."""

    def __init__(self, conn: Any, log: list[str]) -> None:
        self._conn = conn
        self._log = log

    def execute(self, sql: str, *args: Any) -> Any:
        self._log.append(sql)
        return self._conn.execute(sql, *args)

    def executemany(self, sql: str, *args: Any) -> Any:
        self._log.append(sql)
        return self._conn.executemany(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class RecordingDatabase:
    """A real :class:`SqlDatabase` whose connections record the SQL they run."""

    def __init__(self, db: SqlDatabase) -> None:
        self.db = db
        self.dialect = db.dialect
        self.for_update = db.for_update
        self.statements: list[str] = []

    @contextlib.contextmanager
    def read(self) -> Iterator[Any]:
        with self.db.read() as conn:
            yield _Recorder(conn, self.statements)

    @contextlib.contextmanager
    def write(self) -> Iterator[Any]:
        with self.db.write() as conn:
            yield _Recorder(conn, self.statements)

    def lock(self, conn: Any, key: str) -> None:
        self.db.lock(conn, key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


def _reads_payloads(statements: list[str]) -> list[str]:
    """The statements other than inserts that name a payload."""
    return [
        s
        for s in statements
        if "payload" in s.lower() and not s.lstrip().upper().startswith("INSERT")
    ]


def _queued(run_id: str, **summary: Any) -> Run:
    return Run(
        id=run_id,
        kind="retain",
        tenant="t",
        phase=Phase.QUEUED,
        created_at=time.time(),
        session_id="bank:b1",
        summary=summary or {"items_count": 1},
    )


# -- row 6: payloads apart ---------------------------------------------------------------


def test_only_the_workers_read_touches_a_payload(sql_database: SqlDatabase) -> None:
    recording = RecordingDatabase(sql_database)
    store = SqlRunStore(recording)  # type: ignore[arg-type]
    store.migrate()
    ids = [new_run_id() for _ in range(3)]
    for run_id in ids:
        store.create(_queued(run_id), payload={"items": [BIG]})
    recording.statements.clear()

    listed = store.list_runs(tenant="t", limit=100)
    assert [r.id for r in listed] == ids
    assert store.list_runs(tenant="t", newest_first=True, offset=1, limit=1)[0].id == ids[1]
    by_id = sorted(ids)
    assert [r.id for r in store.runs_in_phases([Phase.QUEUED], limit=2)] == by_id[:2]
    assert [r.id for r in store.runs_in_phases([Phase.QUEUED], after_id=by_id[1])] == by_id[2:]
    assert store.count_runs(tenant="t", kind="retain") == {"queued": 3}
    admitted, _ = store.admit(
        _queued(new_run_id()), lambda siblings: None, scope_kinds=["retain"], payload={"a": 1}
    )
    assert admitted is not None
    claimed = store.claim(
        ids[0], worker_id="w", lease_seconds=5, may_start=lambda r, s: True, scope_kinds=["retain"]
    )
    assert claimed is not None
    assert store.transition(ids[1], Phase.CANCELLED, event=("cancelled", {})) is not None
    assert store.get(ids[2]) is not None
    assert store.renew_leases("w", [ids[0]], time.time() + 5)
    assert _reads_payloads(recording.statements) == []
    for run in store.list_runs(tenant="t"):
        public = json.dumps(run.to_public())
        assert "payload" not in run.to_public() and len(public) < 2_000, public[:200]
        assert run.summary == {"items_count": 1}

    assert store.payload(ids[2]) == {"items": [BIG]}
    assert store.payload(admitted.id) == {"a": 1}
    assert store.payload("run_unknown") is None


def test_keyed_lookups_match_summaries(sql_database: SqlDatabase) -> None:
    store = SqlRunStore(sql_database)
    store.migrate()
    first, second = new_run_id(), new_run_id()
    store.create(_queued(first, client_operation_id="op-1"))
    store.create(_queued(second, client_operation_id="op-2"))
    found = store.list_runs(summary_equals={"client_operation_id": "op-2"})
    assert [r.id for r in found] == [second]
    assert store.list_runs(summary_equals={"client_operation_id": "op-3"}) == []
    with pytest.raises(ValueError):
        store.list_runs(summary_equals={"x') OR 1=1 --": "op-1"})


def test_an_existing_database_moves_its_payloads_apart(sql_database: SqlDatabase) -> None:
    """Schema 1 kept payloads in the row; migrating keeps each payload and derives the
    summaries that retries (operation keys) and wakeups (task titles) are matched by."""
    apply_migrations(sql_database, MIGRATIONS[:1])
    rows = {
        "run_retain": ("retain", {"items": [BIG], "items_count": 2, "client_operation_id": "op"}),
        "run_task": ("task", {"action": "wait", "title": "nap", "seconds": 1}),
        "run_turn": ("turn", {"content": "hello"}),
    }
    with sql_database.write() as conn:
        for run_id, (kind, payload) in rows.items():
            conn.execute(
                "INSERT INTO runs (id, kind, tenant, session_id, phase, created_at, payload)"
                " VALUES (?, ?, 't', 's', 'queued', ?, ?)",
                (run_id, kind, time.time(), json.dumps(payload)),
            )
    store = SqlRunStore(sql_database)
    store.migrate()
    for run_id, (_kind, payload) in rows.items():
        assert store.payload(run_id) == payload
    runs = {r.id: r for r in store.list_runs(tenant="t")}
    assert runs["run_retain"].summary["items_count"] == 2
    assert runs["run_retain"].summary["client_operation_id"] == "op"
    assert runs["run_task"].summary == {"title": "nap", "action": "wait"}
    assert runs["run_turn"].summary == {}
    assert [r.id for r in store.list_runs(summary_equals={"client_operation_id": "op"})] == [
        "run_retain"
    ]
    with pytest.raises(Exception), sql_database.read() as conn:  # noqa: B017 (either driver)
        conn.execute("SELECT payload FROM runs").fetchall()


async def test_run_listings_and_operations_carry_no_payload(
    make_settings: Callable[..., Settings],
) -> None:
    """The issue's reproduction, smaller: async retains of 1 MB each, cancelled; every
    listing answers in a few KB and names each operation's item count."""
    marker = "payloadmarker "
    content = marker * (190_000 // len(marker))
    with (
        run_server(run_settings(make_settings, retain_concurrency=1)) as server,
        httpx.Client(base_url=server.url, timeout=30) as client,
    ):
        assert client.put("/v1/default/banks/big", json={"name": "big"}).status_code == 200
        operations = []
        for _ in range(4):
            r = client.post(
                "/v1/default/banks/big/memories",
                json={"items": [{"content": content} for _ in range(5)], "async": True},
            )
            assert r.status_code == 200, r.text[:300]
            operations.append(r.json()["operation_id"])
            client.delete(f"/v1/default/banks/big/operations/{operations[-1]}")
        for op in operations:
            wait_for(lambda op=op: run_phase(client, op) == "cancelled", seconds=60)

        listing = client.get("/v1/runs", params={"limit": 100})
        assert listing.status_code == 200
        assert len(listing.content) < 20_000 and marker not in listing.text
        runs = listing.json()["runs"]
        assert [r["id"] for r in runs] == operations
        assert all(r["summary"]["items_count"] == 5 and "payload" not in r for r in runs)

        ops = client.get("/v1/default/banks/big/operations", params={"limit": 2, "offset": 1})
        assert ops.status_code == 200 and marker not in ops.text
        body = ops.json()
        assert body["total"] == 4
        assert [o["id"] for o in body["operations"]] == operations[::-1][1:3]
        assert all(o["items_count"] == 5 for o in body["operations"])
        cancelled = client.get(
            "/v1/default/banks/big/operations", params={"status": "cancelled"}
        ).json()
        assert cancelled["total"] == 4 and len(cancelled["operations"]) == 4
        stats = client.get("/v1/default/banks/big/stats").json()
        assert stats["operations_by_status"] == {"cancelled": 4}
        one = client.get(f"/v1/runs/{operations[0]}")
        assert len(one.content) < 5_000 and marker not in one.text


async def test_a_listing_leaves_results_out(make_settings: Callable[..., Settings]) -> None:
    """A sibling of row 6: a run's result (a retain's 5,000 document ids) is read by the run's
    own GET, never by a listing."""
    with (
        run_server(run_settings(make_settings)) as server,
        httpx.Client(base_url=server.url, timeout=30) as client,
    ):
        store = server.app.state.services.manager.store
        ids = []
        for _ in range(3):
            run = store.create(dataclasses.replace(_queued(new_run_id()), tenant="default"))
            claimed = store.claim(
                run.id,
                worker_id="w",
                lease_seconds=5,
                may_start=lambda r, s: True,
                scope_kinds=["retain"],
            )
            assert claimed is not None
            result = {"document_ids": [f"resultmarker-{i:032d}" for i in range(5_000)]}
            done = store.transition(run.id, Phase.COMPLETED, fields={"result": result})
            assert done is not None
            ids.append(run.id)
        listing = client.get("/v1/runs")
        assert [r["id"] for r in listing.json()["runs"]] == ids
        assert len(listing.content) < 10_000 and "resultmarker" not in listing.text
        assert all("result" not in r for r in listing.json()["runs"])
        one = client.get(f"/v1/runs/{ids[0]}").json()
        assert len(one["result"]["document_ids"]) == 5_000


# -- row 10: a bounded queue, and reaper passes that never read it -----------------------


async def test_a_session_holds_at_most_its_queue_bound(sql_database: SqlDatabase) -> None:
    manager = build_manager(sql_database, max_queued_per_session=3)
    try:
        busy = await manager.submit("turn", tenant="t", session_id="s", payload={"n": 10_000})
        assert busy is not None
        queued = []
        for _ in range(3):
            run = await manager.submit(
                "turn", tenant="t", session_id="s", payload={"n": 1}, strategy="enqueue"
            )
            assert run is not None
            queued.append(run.id)
        with pytest.raises(QueueFull) as refused:
            await manager.submit(
                "turn", tenant="t", session_id="s", payload={"n": 1}, strategy="enqueue"
            )
        assert refused.value.status_code == 429
        assert "HEED_MAX_QUEUED_TURNS_PER_SESSION=3" in refused.value.message
        assert refused.value.headers["Retry-After"]
        runs = await manager.session_runs("s")
        assert sorted(r.id for r in runs if r.phase == "queued") == sorted(queued)  # nothing added
        # another session is not affected; a freed place can be taken again
        assert await manager.submit("turn", tenant="t", session_id="other", strategy="enqueue")
        await manager.cancel(queued[0])
        again = await manager.submit("turn", tenant="t", session_id="s", strategy="enqueue")
        assert again is not None and again.phase == "queued"
    finally:
        await manager.cancel(busy.id)
        await manager.close(grace=2)


async def test_a_reaper_pass_reads_only_the_runs_that_hold_workers(
    sql_database: SqlDatabase,
) -> None:
    manager = build_manager(sql_database, max_queued_per_session=100, reaper_interval=0.02)
    rows_read = {"n": 0}
    store = manager.store
    for name in ("list_runs", "runs_in_phases", "renew_leases", "finished_before"):
        real = getattr(store, name)

        def counted(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            result = _real(*args, **kwargs)
            rows_read["n"] += len(result)
            return result

        setattr(store, name, counted)
    reaper = Reaper(manager)
    try:
        busy = await manager.submit(
            "turn", tenant="t", session_id="s", payload={"n": 10_000, "delay": 0.05}
        )
        assert busy is not None
        for _ in range(60):
            await manager.submit(
                "turn", tenant="t", session_id="s", payload={"blob": BIG}, strategy="enqueue"
            )
        rows_read["n"] = 0
        assert await reap_once(manager, sweep=False) == []
        # the one running run: its lease renewal and the scan of runs holding workers
        assert rows_read["n"] <= 2, rows_read
        rows_read["n"] = 0
        reaper.start()
        await asyncio.sleep(0.5)
        passes = reaper.passes
        assert passes >= 5
        assert rows_read["n"] <= 2 * (passes + 1), (rows_read, passes)
    finally:
        await reaper.stop()
        await manager.close(grace=2)


async def test_the_queue_bound_over_http(make_settings: Callable[..., Settings]) -> None:
    settings = run_settings(make_settings, llm_script=SLOW_SCRIPT, max_queued_turns_per_session=2)
    with (
        run_server(settings) as server,
        httpx.Client(base_url=server.url, timeout=30) as client,
    ):
        sid = new_session(client)
        url = f"/v1/sessions/{sid}/turns"
        busy = client.post(url, json={"content": " ".join(["w"] * 200)})
        assert busy.status_code == 202
        for _ in range(2):
            r = client.post(url, json={"content": "q" * 190_000, "multitask_strategy": "enqueue"})
            assert r.status_code == 202, r.text[:300]
            assert len(r.content) < 5_000  # the answer does not echo the message
        refused = client.post(url, json={"content": "more", "multitask_strategy": "enqueue"})
        assert refused.status_code == 429, refused.text
        assert "HEED_MAX_QUEUED_TURNS_PER_SESSION=2" in refused.json()["detail"]
        assert int(refused.headers["Retry-After"]) >= 1
        assert client.post(url, json={"content": "busy?"}).status_code == 409  # reject: as before
        assert client.get(f"/v1/sessions/{sid}/status").json()["queued"] == 2
        listing = client.get("/v1/runs", params={"session_id": sid})
        assert len(listing.content) < 10_000
        client.post(f"/v1/runs/{busy.json()['run_id']}/cancel")


# -- row 11: idle streams cost nothing, and are bounded per tenant -----------------------


async def test_an_idle_stream_reads_nothing_and_wakes_on_the_broker(
    make_settings: Callable[..., Settings],
) -> None:
    settings = run_settings(
        make_settings,
        llm_script=SLOW_SCRIPT,
        stream_poll_seconds=20.0,  # the default fallback
        stream_heartbeat_seconds=0.3,
    )
    with (
        run_server(settings) as server,
        httpx.Client(base_url=server.url, timeout=30) as client,
    ):
        sid = new_session(client)
        url = f"/v1/sessions/{sid}/turns"
        busy = client.post(url, json={"content": " ".join(["w"] * 400)}).json()["run_id"]
        queued = client.post(url, json={"content": "later", "multitask_strategy": "enqueue"})
        queued_id = queued.json()["run_id"]
        store = server.app.state.services.manager.store
        reads: list[str] = []
        watch_reads = {"n": 0}
        real_last_seqs = store.last_seqs

        def watched(run_ids: list[str]) -> dict[str, int]:
            watch_reads["n"] += 1
            return real_last_seqs(run_ids)

        store.last_seqs = watched
        for name in ("get", "events_after"):
            real = getattr(store, name)

            def counted(run_id: str, *args: Any, _real: Any = real, _name: str = name) -> Any:
                if run_id == queued_id:
                    reads.append(_name)
                return _real(run_id, *args)

            setattr(store, name, counted)

        async with (
            httpx.AsyncClient(base_url=server.url, timeout=30) as ac,
            ac.stream("GET", f"/v1/runs/{queued_id}/stream") as response,
        ):
            assert response.status_code == 200
            frames = sse_frames(response)
            heartbeats = 0
            async for frame in frames:
                if frame.comment:
                    heartbeats += 1
                    if heartbeats == 1:
                        reads.clear()  # what the replay read is done; from here on: idle
                        watch_reads["n"] = 0
                    if heartbeats >= 12:  # about 3.6 s idle
                        break
            assert reads == [], reads
            assert watch_reads["n"] <= 6, watch_reads  # the process's one watch: 1 query/s
            cancelled_at = time.monotonic()
            assert client.post(f"/v1/runs/{queued_id}/cancel").status_code == 200
            events = []
            async for frame in frames:
                if frame.id:
                    events.append(frame.event)
            assert events == ["cancelled"]
            assert time.monotonic() - cancelled_at < 5.0  # woken by the broker, not a poll
        client.post(f"/v1/runs/{busy}/cancel")


async def test_open_streams_are_bounded_per_tenant(make_settings: Callable[..., Settings]) -> None:
    settings = run_settings(
        make_settings, tenant_max_streams=2, api_keys={"key-a": "a", "key-b": "b"}
    )
    a = {"Authorization": "Bearer key-a"}
    b = {"Authorization": "Bearer key-b"}
    with (
        run_server(settings) as server,
        httpx.Client(base_url=server.url, timeout=30, headers=a) as client,
        httpx.Client(base_url=server.url, timeout=30, headers=b) as client_b,
    ):
        sid = new_session(client)
        sid_b = new_session(client_b)
        run_id = client.post(f"/v1/sessions/{sid}/turns", json={"content": "hi"}).json()["run_id"]
        wait_for(lambda: run_phase(client, run_id) == "completed")
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as ac:
            async with contextlib.AsyncExitStack() as held:
                for _ in range(2):
                    r = await held.enter_async_context(
                        ac.stream("GET", f"/v1/sessions/{sid}/events", headers=a)
                    )
                    assert r.status_code == 200
                for path in (f"/v1/sessions/{sid}/events", f"/v1/runs/{run_id}/stream"):
                    async with ac.stream("GET", path, headers=a) as refused:
                        assert refused.status_code == 429
                        detail = json.loads(await refused.aread())["detail"]
                        assert "HEED_TENANT_MAX_STREAMS=2" in detail
                        assert int(refused.headers["Retry-After"]) >= 1
                # another tenant has its own streams
                async with ac.stream("GET", f"/v1/sessions/{sid_b}/events", headers=b) as other:
                    assert other.status_code == 200

            # closed streams give their places back (the server notices the disconnect)
            def released() -> bool:
                return bool(server.app.state.stream_slots.open("a") == 0)

            wait_for(released)
            frames = []
            async with ac.stream("GET", f"/v1/runs/{run_id}/stream", headers=a) as r:
                assert r.status_code == 200
                async for frame in sse_frames(r):
                    frames.append(frame)
            assert frames and frames[-1].event == "completed"
            wait_for(released)  # a stream that ended released its place too


async def test_waiting_for_a_remote_worker_to_stop_backs_off(sql_database: SqlDatabase) -> None:
    """A sibling of row 11: ``cancel?wait=true`` on a run whose worker is in another process
    re-reads the run with a growing interval (at most 1 s), not 20 times a second."""
    manager = build_manager(sql_database)
    try:
        run_id = new_run_id()
        manager.store.create(dataclasses.replace(_queued(run_id), kind="task", session_id=None))
        claimed = manager.store.claim(
            run_id,
            worker_id="elsewhere:1:abc",
            lease_seconds=600,
            may_start=lambda r, s: True,
            scope_kinds=["task"],
        )
        assert claimed is not None
        reads = {"n": 0}
        real = manager.store.get

        def counted(run_id: str) -> Run | None:
            reads["n"] += 1
            return real(run_id)

        manager.store.get = counted  # type: ignore[method-assign]
        started = time.monotonic()
        run = await manager.cancel(run_id, wait=True, wait_timeout=3.0)
        assert run.phase == "cancelling"  # its worker never stopped: the wait ran out
        assert time.monotonic() - started >= 3.0
        assert reads["n"] <= 12, reads
    finally:
        await manager.close(grace=2)


async def test_another_process_streams_a_run_promptly_without_polling_each_stream(
    tmp_path: Path,
) -> None:
    """Two processes on one SQLite file, no Redis, the default 20 s fallback: a stream on B
    of a run A executes still follows it live, woken by B's one journal watch (1 s)."""
    data = tmp_path / "data"
    port_a, port_b = free_port(), free_port()
    slow = {"HEED_STREAM_POLL_SECONDS": "20", "HEED_STREAM_HEARTBEAT_SECONDS": "10"}
    with server_process(data, port_a, **slow), server_process(data, port_b, **slow):
        a, b = f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"
        with httpx.Client(base_url=a, timeout=30) as client:
            sid = new_session(client)
            run_id = client.post(
                f"/v1/sessions/{sid}/turns", json={"content": " ".join(["w"] * 60)}
            ).json()["run_id"]  # 60 words at 50 ms each: 3 s, executed by A
        started = time.monotonic()
        seqs: list[int] = []
        arrivals: list[float] = []
        async with (
            httpx.AsyncClient(timeout=30) as ac,
            ac.stream("GET", f"{b}/v1/runs/{run_id}/stream") as response,
        ):
            async for frame in sse_frames(response):
                if frame.id:
                    seqs.append(int(frame.id))
                    arrivals.append(time.monotonic() - started)
                if frame.event == "completed":
                    break
        assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) > 10
        assert arrivals[-1] < 10.0, arrivals[-1]  # not at the 20 s fallback
        assert arrivals[len(arrivals) // 2] < arrivals[-1] - 0.5  # live, not in one burst
