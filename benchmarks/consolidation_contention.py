"""Consolidation contention: background consolidation beside interactive work.

An 11,600-unit bank of conversational English (recombined LoCoMo turns) is retained with
observations on, so every unit waits for consolidation; the consolidation's LLM is the
scripted provider answering each round after ``--llm-latency`` seconds (1 s: a remote
model's structured reply), while its embeddings and its internal recalls (about 16 per
round, of type ``observation``) are real. The server is one ``heed serve`` on SQLite (or
PostgreSQL with ``--postgres``) with default lanes; the debounce is an hour, so
consolidation runs only when this script starts it (``POST .../consolidate``).

Measured, in order:

1. **baseline**: 8 recall clients for ``--seconds``, then a bulk retain of
   ``--retain-units`` into a scratch bank, with no background work;
2. **contended**: the same while the bank's consolidation runs, and how many facts it
   consolidated meanwhile (facts per minute under that load); baseline and contended
   phases alternate ``--rounds`` times and each condition's latencies are pooled, so drift
   in the machine's other load falls on both alike;
3. **progress** with 2 recall clients and with none (background work yields, but with
   spare capacity it runs at full speed);
4. **cancel**: ``--cancel-trials`` times, a processing consolidation (mid-LLM-call or
   mid-round) is cancelled with ``POST /v1/runs/{id}/cancel``; the latency is the run's
   ``finished_at`` (written when its worker has unwound) minus the wall-clock time the
   cancel was sent;
5. **bank delete**: ``--delete-trials`` times, a small bank is deleted while its
   consolidation processes; the latency is the delete's response time (the delete waits for
   the bank's work to stop) and the run's ``finished_at`` minus the send time; the bank is
   re-created at once and must stay empty after the LLM's latency has passed, and no unit
   row of a deleted bank may remain (``--postgres`` checks through the API only);
6. **full consolidation**: the rest of the bank is consolidated with no other load; the
   server's RSS is sampled every second and its growth since the consolidation started is
   reported.

Targets (the issue's): contended recall p95 <= 1.3x baseline; contended retain throughput
>= 0.8x baseline; cancel p99 <= 50 ms; bank delete p99 <= 50 ms with zero rows left; RSS
growth <= 150 MB. Writes ``benchmarks/results/consolidation_contention.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import sqlite3
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from _banks import build_bank
from _cluster import postgres
from _corpus import queries, synthetic_sessions
from _runs import finished_at as _finished_at
from _runs import get_run as _run
from _runs import latency_summary as _summary
from _runs import until as _until
from _server import Server, serve, write_result

BANK = "contended"
OBSERVATION_TEXT = "Speakers in this conversation share plans, hobbies and family news."


def _script(latency: float) -> dict[str, Any]:
    """Every consolidation round: one new observation and an update of the first related
    one (taken as a creation when there is none), after *latency* seconds."""
    actions = [
        {"action": "create", "text": OBSERVATION_TEXT, "facts": [0, 1, 2]},
        {"action": "update", "observations": [0], "text": OBSERVATION_TEXT, "facts": [3, 4]},
    ]
    return {"replies": [{"when": "new facts:", "latency": latency, "json": {"actions": actions}}]}


def _rss_mb(server: Server) -> float:
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _count(http: httpx.AsyncClient, bank: str, **params: str) -> int:
    response = await http.get(
        f"/v1/default/banks/{bank}/memories/list", params={"limit": 1, **params}
    )
    response.raise_for_status()
    return int(response.json()["total"])


async def _recall_clients(
    http: httpx.AsyncClient,
    qs: list[str],
    clients: int,
    seconds: float,
    latencies: list[float] | None = None,
) -> dict[str, Any]:
    """*clients* recall loops on the bank for *seconds*: latency percentiles (each latency
    also appended to *latencies*)."""
    cycle = itertools.cycle(qs)
    latencies = latencies if latencies is not None else []
    start = len(latencies)
    deadline = time.perf_counter() + seconds

    async def client() -> None:
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            response = await http.post(
                f"/v1/default/banks/{BANK}/memories/recall", json={"query": next(cycle)}
            )
            response.raise_for_status()
            latencies.append(time.perf_counter() - t0)

    await asyncio.gather(*(client() for _ in range(clients)))
    mine = latencies[start:]
    return {"clients": clients, "requests": len(mine), **_summary(mine)}


async def _retain_throughput(http: httpx.AsyncClient, units: int, tag: str) -> dict[str, Any]:
    """Bulk retain of *units* into a scratch bank that keeps no observations (2 senders,
    200 items a request): units per second."""
    bank = f"scratch-{tag}"
    await http.delete(f"/v1/default/banks/{bank}")
    (
        await http.put(f"/v1/default/banks/{bank}", json={"enable_observations": False})
    ).raise_for_status()
    items = [item for session in synthetic_sessions(units) for item in session][:units]
    batches = [items[i : i + 200] for i in range(0, len(items), 200)]
    started = time.perf_counter()

    async def sender() -> None:
        while batches:
            batch = batches.pop()
            response = await http.post(f"/v1/default/banks/{bank}/memories", json={"items": batch})
            response.raise_for_status()

    await asyncio.gather(sender(), sender())
    seconds = time.perf_counter() - started
    await http.delete(f"/v1/default/banks/{bank}")
    return {"units": units, "seconds": round(seconds, 2), "units_per_second": units / seconds}


async def _consolidate(http: httpx.AsyncClient, bank: str) -> str:
    response = await http.post(f"/v1/default/banks/{bank}/consolidate")
    response.raise_for_status()
    return str(response.json()["operation_id"])


async def _processing(http: httpx.AsyncClient, run_id: str) -> None:
    async def processing() -> bool:
        return (await _run(http, run_id))["phase"] == "running"

    await _until(processing)


async def _progress(
    http: httpx.AsyncClient, qs: list[str], clients: int, seconds: float
) -> dict[str, Any]:
    """Facts consolidated in *seconds* beside *clients* recall loops."""
    before = await _count(http, BANK, consolidation_state="done")
    started = time.perf_counter()
    recall = None
    if clients:
        recall = await _recall_clients(http, qs, clients, seconds)
    else:
        await asyncio.sleep(seconds)
    minutes = (time.perf_counter() - started) / 60
    done = await _count(http, BANK, consolidation_state="done") - before
    return {
        "clients": clients,
        "facts_consolidated": done,
        "facts_per_minute": round(done / minutes, 1),
        **({"recall": recall} if recall else {}),
    }


async def _cancel_trials(http: httpx.AsyncClient, trials: int, latency: float) -> dict[str, Any]:
    """Cancel a processing consolidation of the big bank *trials* times."""
    stops: list[float] = []
    for _ in range(trials):
        run_id = await _consolidate(http, BANK)
        await _processing(http, run_id)
        await asyncio.sleep(random.uniform(0.05, latency * 1.5))
        sent = time.time()
        (await http.post(f"/v1/runs/{run_id}/cancel")).raise_for_status()
        stops.append(await _finished_at(http, run_id) - sent)
        assert (await _run(http, run_id))["phase"] == "cancelled", run_id
    return {"trials": trials, **_summary(stops)}


def _orphan_units(db_path: Path | None) -> int | None:
    """Unit rows whose bank no longer exists (SQLite only; ``None`` when not checked)."""
    if db_path is None:
        return None
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as conn:
        row = conn.execute(
            "SELECT COUNT(*) FROM memory_units u"
            " WHERE NOT EXISTS (SELECT 1 FROM memory_banks b WHERE b.ref = u.bank_ref)"
        ).fetchone()
    return int(row[0])


async def _delete_trials(
    http: httpx.AsyncClient, trials: int, latency: float, db_path: Path | None
) -> dict[str, Any]:
    """Delete a small bank while its consolidation processes, *trials* times."""
    responses: list[float] = []
    stops: list[float] = []
    leftovers = 0
    items = [item for session in synthetic_sessions(48) for item in session][:48]
    for trial in range(trials):
        bank = f"doomed-{trial}"
        (await http.put(f"/v1/default/banks/{bank}", json={})).raise_for_status()
        (
            await http.post(f"/v1/default/banks/{bank}/memories", json={"items": items})
        ).raise_for_status()
        run_id = await _consolidate(http, bank)
        await _processing(http, run_id)
        await asyncio.sleep(random.uniform(0.05, latency * 1.5))
        sent = time.time()
        t0 = time.perf_counter()
        (await http.delete(f"/v1/default/banks/{bank}")).raise_for_status()
        responses.append(time.perf_counter() - t0)
        stops.append(await _finished_at(http, run_id) - sent)
        (await http.put(f"/v1/default/banks/{bank}", json={})).raise_for_status()
        await asyncio.sleep(latency + 0.2)  # past when the cancelled LLM call would answer
        leftovers += await _count(http, bank)
        (await http.delete(f"/v1/default/banks/{bank}")).raise_for_status()
    return {
        "trials": trials,
        "delete_response": _summary(responses),
        "until_stopped": _summary(stops),
        "units_in_recreated_banks": leftovers,
        "orphan_unit_rows": _orphan_units(db_path),
    }


async def _full_consolidation(
    http: httpx.AsyncClient, server: Server, rss_start: float, limit: float
) -> dict[str, Any]:
    """Consolidate the rest of the bank, sampling RSS every second."""
    run_id = await _consolidate(http, BANK)
    started = time.perf_counter()
    samples = [_rss_mb(server)]
    pending = await _count(http, BANK, consolidation_state="pending")
    while pending and time.perf_counter() - started < limit:
        await asyncio.sleep(1.0)
        samples.append(_rss_mb(server))
        if len(samples) % 15 == 0:
            pending = await _count(http, BANK, consolidation_state="pending")
            print(f"\r  full consolidation: {pending} pending, RSS {samples[-1]:.0f} MB", end="")
    print()
    run = await _run(http, run_id)
    return {
        "seconds": round(time.perf_counter() - started, 1),
        "finished": pending == 0,
        "pending_left": pending,
        "run_phase": run["phase"],
        "rss_at_consolidation_start_mb": round(rss_start, 1),
        "rss_at_full_start_mb": round(samples[0], 1),
        "rss_max_mb": round(max(samples), 1),
        "rss_end_mb": round(samples[-1], 1),
        "rss_growth_mb": round(max(samples) - rss_start, 1),
        "observations": await _count(http, BANK, type="observation"),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    qs = queries()
    out: dict[str, Any] = {
        "database": "postgresql" if args.postgres else "sqlite",
        "bank_units": args.units,
        "llm_latency_seconds": args.llm_latency,
        "seconds_per_phase": args.seconds,
    }
    with ExitStack() as stack:
        data_dir = Path(tempfile.mkdtemp(prefix="heed-contention-"))
        env = {
            "HEED_LLM_PROVIDER": "scripted",
            "HEED_LLM_SCRIPT": json.dumps(_script(args.llm_latency)),
            "HEED_OBSERVATIONS": "on",
            "HEED_RETAIN_EXTRACTION": "off",
            "HEED_CONSOLIDATION_DEBOUNCE_SECONDS": "3600",
        }
        db_path: Path | None = data_dir / "heed.db"
        if args.postgres:
            env["HEED_DATABASE_URL"] = stack.enter_context(postgres())
            db_path = None
        server = stack.enter_context(serve(data_dir, env))
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=server.url, timeout=300, limits=limits) as http:
            print(f"building {BANK} ({args.units} units, all pending)")
            out["build"] = await build_bank(http, BANK, args.units)
            await _recall_clients(http, qs, 1, 3)  # warm-up: loads the vector index

            # Baseline and contended phases alternate (A B A B ...), so a drift in the
            # machine's other load falls on both conditions alike.
            pooled: dict[str, list[float]] = {"baseline": [], "contended": []}
            retained: dict[str, list[float]] = {"baseline": [0, 0], "contended": [0, 0]}
            rounds: list[dict[str, Any]] = []
            rss_start = 0.0
            consolidated, contended_seconds = 0, 0.0
            for number in range(args.rounds):
                for condition in ("baseline", "contended"):
                    run_id = None
                    if condition == "contended":
                        run_id = await _consolidate(http, BANK)
                        await _processing(http, run_id)
                        rss_start = rss_start or _rss_mb(server)
                        done0 = await _count(http, BANK, consolidation_state="done")
                    t0 = time.perf_counter()
                    recall = await _recall_clients(
                        http, qs, args.clients, args.seconds, pooled[condition]
                    )
                    retain = await _retain_throughput(http, args.retain_units, condition)
                    retained[condition][0] += retain["units"]
                    retained[condition][1] += retain["seconds"]
                    phase = {"round": number, "condition": condition, "recall": recall}
                    phase["retain_units_per_second"] = round(retain["units_per_second"], 1)
                    if run_id is not None:
                        consolidated += await _count(http, BANK, consolidation_state="done") - done0
                        contended_seconds += time.perf_counter() - t0
                        (await http.post(f"/v1/runs/{run_id}/cancel?wait=true")).raise_for_status()
                    rounds.append(phase)
                    print(f"  {phase}")
            baseline, contended = (
                {
                    "recall": {
                        "clients": args.clients,
                        "requests": len(pooled[c]),
                        **_summary(pooled[c]),
                    },
                    "retain": {
                        "units": retained[c][0],
                        "seconds": round(retained[c][1], 2),
                        "units_per_second": retained[c][0] / retained[c][1],
                    },
                }
                for c in ("baseline", "contended")
            )
            contended["facts_consolidated"] = consolidated
            contended["facts_per_minute"] = round(consolidated / (contended_seconds / 60), 1)
            out["rounds"] = rounds
            out["baseline"], out["contended"] = baseline, contended
            print(f"  baseline {baseline}\n  contended {contended}")

            print("progress with 2 clients, then none")
            await _processing(http, await _consolidate(http, BANK))
            out["progress"] = [
                await _progress(http, qs, 2, args.seconds),
                await _progress(http, qs, 0, args.seconds),
            ]
            print(f"  {out['progress']}")

            print(f"cancel: {args.cancel_trials} trials")
            out["cancel"] = await _cancel_trials(http, args.cancel_trials, args.llm_latency)
            print(f"  {out['cancel']}")

            print(f"bank delete: {args.delete_trials} trials")
            out["bank_delete"] = await _delete_trials(
                http, args.delete_trials, args.llm_latency, db_path
            )
            print(f"  {out['bank_delete']}")

            print("full consolidation of the rest of the bank")
            out["full"] = await _full_consolidation(http, server, rss_start, args.full_limit)
            print(f"  {out['full']}")
    out["ratios"] = {
        "recall_p95": round(contended["recall"]["p95_ms"] / baseline["recall"]["p95_ms"], 3),
        "retain_throughput": round(
            contended["retain"]["units_per_second"] / baseline["retain"]["units_per_second"], 3
        ),
    }
    delete = out["bank_delete"]
    out["targets"] = {
        "recall_p95_ratio_max": {"target": 1.3, "met": out["ratios"]["recall_p95"] <= 1.3},
        "retain_throughput_ratio_min": {
            "target": 0.8,
            "met": out["ratios"]["retain_throughput"] >= 0.8,
        },
        "cancel_p99_ms": {"target": 50, "met": out["cancel"]["p99_ms"] <= 50},
        "bank_delete_p99_ms": {
            "target": 50,
            "met": delete["until_stopped"]["p99_ms"] <= 50
            and delete["units_in_recreated_banks"] == 0
            and not delete["orphan_unit_rows"],
        },
        "rss_growth_mb": {
            "target": 150,
            "met": out["full"]["finished"] and out["full"]["rss_growth_mb"] <= 150,
        },
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--units", type=int, default=11_600, help="units in the bank")
    parser.add_argument("--clients", type=int, default=8, help="interactive recall clients")
    parser.add_argument("--seconds", type=float, default=30, help="length of each phase")
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternations of baseline and contended phases"
    )
    parser.add_argument("--retain-units", type=int, default=1200, help="units per retain probe")
    parser.add_argument("--llm-latency", type=float, default=1.0, help="seconds per LLM reply")
    parser.add_argument("--cancel-trials", type=int, default=60)
    parser.add_argument("--delete-trials", type=int, default=30)
    parser.add_argument(
        "--full-limit", type=float, default=3600, help="most seconds for the full consolidation"
    )
    parser.add_argument("--postgres", action="store_true", help="store in PostgreSQL (pgvector)")
    parser.add_argument("--name", default=None, help="results file name")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    name = args.name or "consolidation_contention" + ("_postgres" if args.postgres else "")
    path = write_result(name, result)
    print(json.dumps(result["targets"], indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
