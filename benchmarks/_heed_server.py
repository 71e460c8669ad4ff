"""Shared helpers for the run/stream benchmarks: a heed server subprocess and raw SSE reading."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx

RESULTS = Path(__file__).resolve().parent / "results"


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def heed_server(data_dir: str, **env: str) -> Iterator[str]:
    """Run ``heed serve`` on a free loopback port; yields its base URL."""
    port = free_port()
    full_env = dict(os.environ, HEED_DATA_DIR=data_dir, **env)
    cmd = [sys.executable, "-m", "heed.cli", "serve", "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env=full_env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("server did not start")
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def scripted_env(token_delay: float) -> dict[str, str]:
    """Settings for an echo scripted provider with *token_delay* seconds per word."""
    return {
        "HEED_LLM_PROVIDER": "scripted",
        "HEED_LLM_SCRIPT": json.dumps({"token_delay": token_delay, "replies": []}),
    }


async def raw_sse(
    host: str, port: int, path: str, headers: dict[str, str] | None = None
) -> AsyncIterator[tuple[str | None, str, str]]:
    """A minimal SSE reader over a raw socket: yields (id, event, data) per frame.

    Cheap on purpose (no HTTP library on the hot path), so the client is not the
    bottleneck when hundreds of streams share one process.
    """
    reader, writer = await asyncio.open_connection(host, port)
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n{extra}\r\n".encode()
    )
    await writer.drain()
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(head.decode(errors="replace").splitlines()[0])
        chunked = b"transfer-encoding: chunked" in head.lower()
        buffer = b""
        while True:
            if chunked:
                size_line = await reader.readuntil(b"\r\n")
                size = int(size_line.strip() or b"0", 16)
                if size == 0:
                    return
                chunk = await reader.readexactly(size + 2)
                buffer += chunk[:-2]
            else:
                chunk = await reader.read(65536)
                if not chunk:
                    return
                buffer += chunk
            if b"\n\n" not in buffer:
                continue
            *complete, buffer = buffer.split(b"\n\n")  # one pass, no quadratic copying
            for raw in complete:
                event_id, event, data = None, "message", ""
                for line in raw.decode().split("\n"):
                    if line.startswith("id: "):
                        event_id = line[4:]
                    elif line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: "):
                        data = line[6:]
                yield event_id, event, data
    finally:
        writer.close()
        with suppress(OSError):
            await writer.wait_closed()


def write_result(name: str, result: dict[str, Any]) -> Path:
    """Write *result* (plus the machine's cores and load) to ``results/<name>.json``."""
    result = {
        **result,
        "machine": {"cores": os.cpu_count(), "load_average_1m": round(os.getloadavg()[0], 2)},
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path
