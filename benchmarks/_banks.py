"""Building (or reusing) benchmark banks over HTTP with bulk sync retain."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from _corpus import synthetic_sessions

__all__ = ["bank_units", "build_bank"]


async def bank_units(http: httpx.AsyncClient, bank: str) -> int:
    """The bank's unit count (0 when it does not exist)."""
    response = await http.get(f"/v1/default/banks/{bank}/stats")
    if response.status_code == 404:
        return 0
    response.raise_for_status()
    return int(response.json()["total_nodes"])


async def build_bank(
    http: httpx.AsyncClient,
    bank: str,
    n_units: int,
    *,
    sessions_per_request: int = 10,
    concurrency: int = 2,
    progress: bool = True,
) -> dict[str, Any]:
    """Retain *n_units* synthetic turns into a fresh *bank*; returns throughput figures."""
    await http.delete(f"/v1/default/banks/{bank}")
    (await http.put(f"/v1/default/banks/{bank}", json={"name": bank})).raise_for_status()
    batches: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    for i, session in enumerate(synthetic_sessions(n_units), start=1):
        current.extend(session)
        if i % sessions_per_request == 0:
            batches.append(current)
            current = []
    if current:
        batches.append(current)
    queue: asyncio.Queue[list[dict[str, Any]]] = asyncio.Queue()
    for batch in batches:
        queue.put_nowait(batch)
    done = 0
    started = time.perf_counter()

    async def sender() -> None:
        nonlocal done
        while not queue.empty():
            batch = queue.get_nowait()
            response = await http.post(f"/v1/default/banks/{bank}/memories", json={"items": batch})
            response.raise_for_status()
            done += len(batch)
            if progress:
                rate = done / (time.perf_counter() - started)
                print(f"\r  {bank}: {done}/{n_units} units ({rate:.0f}/s)", end="", flush=True)

    await asyncio.gather(*(sender() for _ in range(concurrency)))
    seconds = time.perf_counter() - started
    if progress:
        print()
    return {
        "units": n_units,
        "seconds": round(seconds, 2),
        "units_per_second": round(n_units / seconds, 1),
        "concurrency": concurrency,
        "items_per_request": sessions_per_request * 20,
    }
