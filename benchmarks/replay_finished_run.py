"""Replay of a finished run: time to the last event of a 10,000-event journal.

Writes a finished run with ``--events`` journal events (tokens, then a terminal
``completed``) straight into a fresh data dir through the run store, starts
``heed serve`` on it, and ``--repeat`` times opens ``GET /v1/runs/{id}/stream``
from seq 0 over a raw socket, timing request -> terminal event received.
Checks every replay has every seq exactly once, in order.

Prints p50 / p99 / max (target <= 200 ms to the last event). Writes
``benchmarks/results/replay_finished_run.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

from _server import percentile, serve, write_result
from _sse import raw_sse
from heed.runs.model import Phase, Run, new_run_id
from heed.storage import SqliteDatabase
from heed.storage.run_store import SqlRunStore


def prepare(data_dir: str, events: int) -> str:
    store = SqlRunStore(SqliteDatabase(Path(data_dir) / "heed.db"))
    store.migrate()
    now = time.time()
    run = Run(
        id=new_run_id(),
        kind="turn",
        tenant="default",
        phase=Phase.RUNNING,
        created_at=now,
        started_at=now,
    )
    store.create(run)
    batch = 1000
    for start in range(0, events - 1, batch):
        n = min(batch, events - 1 - start)
        store.append_events(
            run.id, [("text_delta", {"text": f"tok{start + i} "}) for i in range(n)]
        )
    store.append_events(run.id, [("completed", {"result": None})])
    store.transition(run.id, Phase.COMPLETED, fields={"finished_at": time.time()})
    store.db.close()
    return run.id


async def replay(host: str, port: int, run_id: str) -> tuple[float, list[int]]:
    started = time.perf_counter()
    seqs: list[int] = []
    async for event_id, event, _data in raw_sse(host, port, f"/v1/runs/{run_id}/stream"):
        if event_id is not None:
            seqs.append(int(event_id))
        if event == "completed":
            break
    return time.perf_counter() - started, seqs


async def main_async(args: argparse.Namespace, base: str, run_id: str) -> dict[str, object]:
    url = urlparse(base)
    host, port = url.hostname or "127.0.0.1", int(url.port or 80)
    await replay(host, port, run_id)  # warm-up (page cache, first connection)
    times: list[float] = []
    complete = True
    for _ in range(args.repeat):
        seconds, seqs = await replay(host, port, run_id)
        times.append(seconds * 1000)
        complete = complete and seqs == list(range(1, args.events + 1))
    return {
        "events": args.events,
        "repeat": args.repeat,
        "p50_ms": round(percentile(times, 50), 1),
        "p99_ms": round(percentile(times, 99), 1),
        "max_ms": round(max(times), 1),
        "every_replay_complete_in_order": complete,
        "target_ms": 200,
        "target_met": complete and percentile(times, 99) <= 200,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data_dir:
        run_id = prepare(data_dir, args.events)
        with serve(data_dir) as server:
            result = asyncio.run(main_async(args, server.url, run_id))
    print(
        f"replay of a finished {result['events']}-event run, {result['repeat']} times: "
        f"p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, max {result['max_ms']} ms "
        "to the last event (target <= 200 ms); "
        f"complete: {result['every_replay_complete_in_order']}"
    )
    print("wrote", write_result("replay_finished_run", result))


if __name__ == "__main__":
    main()
