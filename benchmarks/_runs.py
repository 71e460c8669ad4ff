"""Benchmark support for runs over HTTP: read one, wait for a condition, when it finished,
and latency summaries."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from _server import percentile

__all__ = ["finished_at", "get_run", "latency_summary", "ms", "until"]


def ms(seconds: float) -> float:
    """*seconds* in milliseconds, rounded for a results file."""
    return round(seconds * 1000, 2)


def latency_summary(latencies: list[float]) -> dict[str, float]:
    """p50 / p95 / p99 / max of *latencies* (seconds), in milliseconds."""
    return {
        "p50_ms": ms(percentile(latencies, 50)),
        "p95_ms": ms(percentile(latencies, 95)),
        "p99_ms": ms(percentile(latencies, 99)),
        "max_ms": ms(max(latencies, default=0.0)),
    }


async def until(
    check: Callable[[], Awaitable[Any]], seconds: float = 60.0, step: float = 0.02
) -> Any:
    """Await *check* every *step* seconds until it gives a true value (returned); raises
    ``TimeoutError`` after *seconds*."""
    deadline = time.monotonic() + seconds
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{getattr(check, '__name__', 'condition')} not met in time")
        await asyncio.sleep(step)


async def get_run(http: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    """The run's JSON (``GET /v1/runs/{id}``)."""
    response = await http.get(f"/v1/runs/{run_id}")
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


async def finished_at(http: httpx.AsyncClient, run_id: str, seconds: float = 30.0) -> float:
    """The run's ``finished_at`` (epoch seconds, written when its worker has unwound), once
    it has one."""

    async def finished() -> float | None:
        run = await get_run(http, run_id)
        return float(run["finished_at"]) if run["finished_at"] is not None else None

    value: float = await until(finished, seconds, 0.005)
    return value
