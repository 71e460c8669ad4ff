"""Stream fan-out: many concurrent subscribers to live runs on one server.

Starts ``heed serve`` (scripted echo provider, ``--token-delay`` s per token),
creates ``--runs`` sessions each with a turn of ``--tokens`` words queued
behind a gate turn, attaches ``--subscribers`` SSE clients spread evenly over
the queued runs, then cancels the gates so every measured turn starts with all
its subscribers listening. Every token event carries the server's wall-clock
``ts`` taken when it was appended to the journal; delivery latency is the
client's receive time minus that ``ts`` (same machine, same clock), so it
includes the durable write, the fan-out and the socket.

Prints p50 / p99 / max delivery latency of token events (target p99 <= 100 ms)
and checks every subscriber received every event exactly once, in order.
Writes ``benchmarks/results/stream_fanout.json``.

With ``--cluster``: two instances on PostgreSQL and Redis (see ``_cluster.py``); the turns
run on the first, the subscribers alternate between the two, so half of them read a run
whose worker is in the other process (target p99 <= 150 ms; results in
``stream_fanout_cluster.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlparse

import httpx

from _cluster import cluster, postgres
from _server import percentile, scripted_env, serve, write_result
from _sse import raw_sse


async def attach(host: str, port: int, path: str) -> AsyncIterator[tuple[Any, ...]]:
    """:func:`raw_sse`, retried (as a browser would) while the server answers 503: many
    subscribers attaching at once can exceed a tenant's in-flight requests."""
    for _ in range(100):
        try:
            async for frame in raw_sse(host, port, path):
                yield frame
            return
        except RuntimeError as exc:
            if " 503 " not in str(exc):
                raise
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{path}: still 503 after 100 tries")


async def subscriber(
    host: str, port: int, run_id: str, latencies: list[float], ready: asyncio.Event
) -> list[int]:
    seqs: list[int] = []
    attached: float | None = None
    async for event_id, event, data in attach(host, port, f"/v1/runs/{run_id}/stream"):
        received = time.time()
        if attached is None:
            attached = received  # the stream's first frame: from here on events are live
            ready.set()
        if event_id is None:
            continue
        seqs.append(int(event_id))
        if event == "text_delta":
            ts = json.loads(data)["ts"]
            if ts >= attached:  # replayed events (appended before we attached) do not count
                latencies.append(received - ts)
        if event in ("completed", "cancelled", "failed", "interrupted"):
            break
    return seqs


async def one_round(args: argparse.Namespace, bases: list[str]) -> dict[str, object]:
    base = bases[0]  # where the turns are started (and run)
    endpoints = [(urlparse(b).hostname or "127.0.0.1", int(urlparse(b).port or 80)) for b in bases]
    words = " ".join(f"t{i}" for i in range(args.tokens))
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        sessions = []
        for i in range(args.runs):
            r = await client.post("/v1/sessions", json={"title": f"fanout {i}"})
            sessions.append(r.json()["id"])
        # Each session first runs a long "gate" turn; the measured turn is enqueued behind it
        # (queued runs are attachable), every subscriber attaches, then the gates are
        # cancelled: the measured turns start with all 500 subscribers already listening.
        latencies: list[float] = []
        gates = (
            []
            if args.storm
            else [
                (
                    await client.post(f"/v1/sessions/{sid}/turns", json={"content": "gate " * 5000})
                ).json()["run_id"]
                for sid in sessions
            ]
        )
        run_ids = [
            (
                await client.post(
                    f"/v1/sessions/{sid}/turns",
                    json={"content": words, "multitask_strategy": "enqueue"},
                )
            ).json()["run_id"]
            for sid in sessions
        ]
        attached = [asyncio.Event() for _ in range(args.subscribers)]
        tasks = [
            asyncio.create_task(
                subscriber(
                    *endpoints[i % len(endpoints)], run_ids[i % args.runs], latencies, attached[i]
                )
            )
            for i in range(args.subscribers)
        ]
        if not args.storm:
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in attached)), 60)
        subscribed_at = time.time()
        await asyncio.gather(*(client.post(f"/v1/runs/{g}/cancel") for g in gates))
        results = await asyncio.gather(*tasks)
        elapsed = time.time() - subscribed_at
        runs = [(await client.get(f"/v1/runs/{rid}")).json() for rid in run_ids]
    complete = all(seqs == list(range(1, len(seqs) + 1)) for seqs in results)
    expected = {r["id"]: r["last_seq"] for r in runs}
    full = all(len(seqs) == expected[run_ids[i % args.runs]] for i, seqs in enumerate(results))
    ms = [x * 1000 for x in latencies]
    return {
        "latencies_ms": ms,
        "elapsed_s": elapsed,
        "complete": complete and full,
        "p99_ms": round(percentile(ms, 99), 2),
    }


async def main_async(args: argparse.Namespace, bases: list[str]) -> dict[str, object]:
    load_before = os.getloadavg()[0]
    rounds = [await one_round(args, bases) for _ in range(args.rounds)]
    ms = [x for r in rounds for x in r["latencies_ms"]]
    elapsed = sum(float(r["elapsed_s"]) for r in rounds)
    complete = all(r["complete"] for r in rounds)
    full = True
    target = 150 if len(bases) > 1 else 100
    return {
        "rounds": args.rounds,
        "storm": args.storm,
        "round_p99_ms": [r["p99_ms"] for r in rounds],
        "load_average_1m_before": round(load_before, 2),
        "load_average_1m_after": round(os.getloadavg()[0], 2),
        "cores": os.cpu_count(),
        "subscribers": args.subscribers,
        "runs": args.runs,
        "tokens_per_run": args.tokens,
        "token_delay_s": args.token_delay,
        "token_events_delivered": len(ms),
        "deliveries_per_s": round(len(ms) / elapsed, 1),
        "p50_ms": round(percentile(ms, 50), 2),
        "p99_ms": round(percentile(ms, 99), 2),
        "max_ms": round(max(ms), 2) if ms else None,
        "instances": len(bases),
        "every_subscriber_complete_in_order": complete and full,
        "target_p99_ms": target,
        "target_met": bool(ms) and percentile(ms, 99) <= target and complete and full,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscribers", type=int, default=500)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--token-delay", type=float, default=0.05)
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds (fresh runs)")
    parser.add_argument(
        "--storm",
        action="store_true",
        help="no gate: subscribers connect (and replay) while the turns already stream",
    )
    parser.add_argument(
        "--cluster", action="store_true", help="two instances on PostgreSQL and Redis"
    )
    args = parser.parse_args()
    env = {**scripted_env(args.token_delay), "HEED_TURN_CONCURRENCY": str(args.runs)}
    if args.cluster:
        with postgres() as url, cluster(url, 2, env) as servers:
            result = asyncio.run(main_async(args, [s.url for s in servers]))
    else:
        with tempfile.TemporaryDirectory() as data_dir, serve(data_dir, env) as server:
            result = asyncio.run(main_async(args, [server.url]))
    print(
        f"{result['subscribers']} subscribers on {result['runs']} live runs: "
        f"{result['token_events_delivered']} token deliveries "
        f"({result['deliveries_per_s']}/s); latency p50 {result['p50_ms']} ms, "
        f"p99 {result['p99_ms']} ms (per round {result['round_p99_ms']}), max {result['max_ms']} "
        f"ms (target p99 <= {result['target_p99_ms']} ms); "
        f"load average {result['load_average_1m_before']}; "
        f"complete and in order: {result['every_subscriber_complete_in_order']}"
    )
    name = "stream_fanout_cluster" if args.cluster else "stream_fanout"
    print("wrote", write_result(name + ("_storm" if args.storm else ""), result))


if __name__ == "__main__":
    main()
