"""Benchmark support: a ``heed serve`` subprocess, its CPU time, percentiles, results."""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

RESULTS = Path(__file__).resolve().parent / "results"

__all__ = [
    "RESULTS",
    "Server",
    "free_port",
    "percentile",
    "scripted_env",
    "serve",
    "write_result",
]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    """A running ``heed serve`` process."""

    proc: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cpu_seconds(self) -> float:
        """CPU time of all the server's threads so far (ns resolution, from schedstat)."""
        total = 0
        task_dir = Path(f"/proc/{self.proc.pid}/task")
        for task in task_dir.iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                continue
        return total / 1e9


@contextmanager
def serve(
    data_dir: Path | str,
    env: Mapping[str, str] | None = None,
    command: Sequence[str] | None = None,
) -> Iterator[Server]:
    """Start ``heed serve`` on a free loopback port with *data_dir*; stop it on exit.

    *command* replaces ``python -m heed.cli serve`` (a script that serves heed as it does);
    ``--port N --log-level warning`` is appended either way."""
    port = free_port()
    full_env = dict(os.environ, HEED_DATA_DIR=str(data_dir), **(env or {}))
    base = list(command or [sys.executable, "-m", "heed.cli", "serve"])
    cmd = [*base, "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env=full_env)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("server did not start")
            time.sleep(0.1)
        yield Server(proc, port)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def scripted_env(token_delay: float) -> dict[str, str]:
    """Settings for an echo scripted provider with *token_delay* seconds per word."""
    return {
        "HEED_LLM_PROVIDER": "scripted",
        "HEED_LLM_SCRIPT": json.dumps({"token_delay": token_delay, "replies": []}),
    }


def write_result(name: str, data: dict[str, Any]) -> Path:
    """Write ``benchmarks/results/<name>.json`` with the machine's description and load added."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    data = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_1m": round(os.getloadavg()[0], 2),
        },
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **data,
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
