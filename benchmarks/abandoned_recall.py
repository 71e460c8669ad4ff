"""Abandoned recalls: server CPU spent after each client disconnect (target <= 20 ms).

On the 11.6K-unit bank built by recall_latency.py (built here if missing), a
client sends a recall over a raw socket and closes the socket at a random
point while the server works on it (2-15 ms after sending). After each
disconnect the benchmark waits until the server is idle again and records the
server process's CPU time (all threads, ns resolution from schedstat) spent
between the disconnect and then, minus the idle baseline. Recalls are sent one
at a time so each disconnect's CPU is attributable; completed recalls give
the reference CPU of a full recall.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
from pathlib import Path
from typing import Any

import httpx

from _banks import bank_units, build_bank
from _corpus import queries
from _server import Server, percentile, serve, write_result

DEFAULT_DIR = Path("/tmp/heed-bench-banks")
BANK = "bench-11600"
SETTLE = 0.15  # seconds to wait after a disconnect for the server to go idle


def _request(port: int, query: str) -> bytes:
    body = json.dumps({"query": query}).encode()
    head = (
        f"POST /v1/default/banks/{BANK}/memories/recall HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


async def _abandon(server: Server, query: str, delay: float) -> dict[str, float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(_request(server.port, query))
    await writer.drain()
    await asyncio.sleep(delay)
    answered = bool(reader._buffer)  # type: ignore[attr-defined]
    cpu_at_close = server.cpu_seconds()
    writer.transport.abort()
    await asyncio.sleep(SETTLE)
    return {
        "cpu_after_ms": (server.cpu_seconds() - cpu_at_close) * 1000,
        "answered": float(answered),
    }


async def _complete(server: Server, http: httpx.AsyncClient, query: str) -> float:
    cpu0 = server.cpu_seconds()
    (
        await http.post(f"/v1/default/banks/{BANK}/memories/recall", json={"query": query})
    ).raise_for_status()
    return (server.cpu_seconds() - cpu0) * 1000


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(5)
    qs = queries()
    with serve(args.data_dir) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=300) as http:
            if await bank_units(http, BANK) != 11_600:
                print("building", BANK)
                await build_bank(http, BANK, 11_600)
            for q in qs[:20]:  # warm-up: loads the index
                await _complete(server, http, q)
            idle = []
            for _ in range(20):
                cpu0 = server.cpu_seconds()
                await asyncio.sleep(SETTLE)
                idle.append((server.cpu_seconds() - cpu0) * 1000)
            baseline = sorted(idle)[len(idle) // 2]
            full = [await _complete(server, http, rng.choice(qs)) for _ in range(50)]
            samples = []
            for _ in range(args.requests):
                samples.append(
                    await _abandon(server, rng.choice(qs), rng.uniform(0.002, args.max_delay))
                )
            metrics = (await http.get("/metrics")).text
    after = [max(0.0, s["cpu_after_ms"] - baseline) for s in samples if not s["answered"]]
    cancelled = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("heed_cancellations_total") and "client disconnected" in line
    )
    return {
        "bank_units": 11_600,
        "abandoned_requests": len(samples),
        "answered_before_close": int(sum(s["answered"] for s in samples)),
        "cancellations_counted_by_server": cancelled,
        "idle_baseline_cpu_ms_per_window": round(baseline, 3),
        "cpu_ms_after_disconnect": {
            "p50": round(percentile(after, 50), 3),
            "p95": round(percentile(after, 95), 3),
            "max": round(max(after, default=0.0), 3),
            "mean": round(sum(after) / max(1, len(after)), 3),
        },
        "full_recall_cpu_ms": {
            "p50": round(percentile(full, 50), 2),
            "p95": round(percentile(full, 95), 2),
        },
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "target_cpu_ms_after_disconnect": 20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--requests", type=int, default=200, help="abandoned recalls (default: %(default)s)"
    )
    parser.add_argument(
        "--max-delay", type=float, default=0.015, help="latest disconnect after sending, s"
    )
    parser.add_argument(
        "--data-dir", type=Path, default=DEFAULT_DIR, help="server data dir (bank reused)"
    )
    parser.add_argument("--name", default="abandoned_recall", help="results file name")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    cpu = result["cpu_ms_after_disconnect"]
    print(
        f"CPU after disconnect: p50 {cpu['p50']} ms, p95 {cpu['p95']} ms, max {cpu['max']} ms "
        f"(full recall p50 {result['full_recall_cpu_ms']['p50']} ms)"
    )
    print("wrote", write_result(args.name, result))


if __name__ == "__main__":
    main()
