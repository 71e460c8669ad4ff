"""Cancel latency: how long after a client's socket closes does the server's work stop?

Starts ``heed serve`` with diagnostics enabled in a subprocess, then N times:
sends ``POST /v1/_diag/burn`` over a raw socket (CPU work in an offloaded
thread inside a recall slot), closes the socket at a random point of the work,
and reads back when the worker thread stopped and the slot was released. Both
sides use CLOCK_MONOTONIC, which Linux shares across processes.

Prints p50 / p99 of socket close -> worker stopped (target p99 <= 50 ms) and
writes ``benchmarks/results/cancel_latency.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from _server import RESULTS, percentile, serve


def one_disconnect(client: httpx.Client, port: int, max_delay: float) -> dict[str, float]:
    burn_id = uuid.uuid4().hex
    body = json.dumps({"id": burn_id, "seconds": 30}).encode()
    request = (
        "POST /v1/_diag/burn HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    sock = socket.create_connection(("127.0.0.1", port))
    sent_at = time.monotonic()
    sock.sendall(request)
    time.sleep(random.uniform(0, max_delay))
    closed_at = time.monotonic()
    sock.close()
    while True:
        r = client.get(f"/v1/_diag/burn/{burn_id}")
        if r.status_code == 200 and r.json()["slot_released_at"]:
            record = r.json()
            break
        if r.status_code == 404 and time.monotonic() - closed_at > 1:
            # Closed before the server read the request: nothing ever started.
            return {"started": 0.0, "close_to_stop_ms": 0.0, "close_to_release_ms": 0.0}
        time.sleep(0.002)
    return {
        "started": 1.0 if record["started_at"] else 0.0,
        "sent_to_close_ms": (closed_at - sent_at) * 1000,
        "close_to_stop_ms": max(0.0, record["stopped_at"] - closed_at) * 1000
        if record["stopped_at"]
        else 0.0,
        "close_to_release_ms": max(0.0, record["slot_released_at"] - closed_at) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200, help="disconnects to measure")
    parser.add_argument(
        "--max-delay", type=float, default=0.3, help="close the socket within this many seconds"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=RESULTS / "cancel_latency.json")
    args = parser.parse_args()
    random.seed(args.seed)

    with (
        tempfile.TemporaryDirectory() as data_dir,
        serve(data_dir, {"HEED_ENABLE_DIAGNOSTICS": "1"}) as server,
    ):
        port = server.port
        assert port is not None
        samples = []
        with httpx.Client(base_url=server.url, timeout=10) as client:
            for _ in range(args.count):
                samples.append(one_disconnect(client, port, args.max_delay))
            metrics = client.get("/metrics").text

    started = [s for s in samples if s["started"]]
    stop = [s["close_to_stop_ms"] for s in started]
    release = [s["close_to_release_ms"] for s in started]
    result = {
        "benchmark": "cancel_latency",
        "disconnects": args.count,
        "work_started_before_close": len(started),
        "close_to_worker_stopped_ms": {
            "p50": round(percentile(stop, 50), 2),
            "p99": round(percentile(stop, 99), 2),
            "max": round(max(stop), 2),
            "mean": round(statistics.mean(stop), 2),
        },
        "close_to_slot_released_ms": {
            "p50": round(percentile(release, 50), 2),
            "p99": round(percentile(release, 99), 2),
        },
        "target": {"close_to_worker_stopped_p99_ms": 50},
        "cancellations_counted": [
            line for line in metrics.splitlines() if line.startswith("heed_cancellations_total")
        ],
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "load_average_1m": os.getloadavg()[0],
        },
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
