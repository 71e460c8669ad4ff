"""What OpenTelemetry tracing costs a recall: off (the default) against on.

Three servers on one data dir (a bank of realistic conversational English, built through
bulk retain as benchmarks/recall_latency.py builds it): two with tracing off (``off`` and
``off_again``: how far two identical servers differ is the noise) and one with
``HEED_TRACING=on`` whose spans go to an in-memory exporter (benchmarks/_traced_serve.py:
the cost of making every span, without a collector's network; behind the
``BatchSpanProcessor`` heed gives every configured exporter, unless ``--processor simple``).
All three are served by the same script. The recalls go in interleaved rounds (each round
measures every server with the same queries, in a rotating order), so a change in the
machine's load falls on all three alike: first one client, then 8 concurrent clients.
Besides each server's p50 / p95 over all its recalls, ``round_p50_ratio`` is the median over
rounds of a server's p50 over ``off``'s (robust to a machine whose load drifts).

``--baseline-src DIR`` adds a fourth server, ``baseline``: heed from another checkout's
``src`` (one from before tracing), served by ``heed serve``, so ``off`` can be compared with
the code that had no tracing at all. ``--before-src DIR`` adds ``on_before``: tracing on
with heed from another checkout's ``src`` (an earlier version of the tracing code), behind
the ``--before-processor`` span processor, in the same rounds as ``on``: a before/after
comparison that a change in the machine's load cannot skew.

Target (issue 41): tracing off, recall p50 unchanged within noise; on, at most +5%.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from _banks import bank_units, build_bank
from _corpus import queries
from _server import Server, percentile, serve, write_result

DEFAULT_DIR = Path("/tmp/heed-bench-tracing")
CONFIGS = ("off", "on", "off_again")
TRACED_SERVE = [sys.executable, str(Path(__file__).resolve().parent / "_traced_serve.py")]


async def _recalls(
    http: httpx.AsyncClient, bank: str, todo: list[str], clients: int
) -> tuple[list[float], float]:
    """Latencies (s) of the recalls of *todo* from *clients* concurrent clients, and the wall
    time they took."""
    latencies: list[float] = []
    pending = list(todo)

    async def client() -> None:
        while pending:
            query = pending.pop()
            t0 = time.perf_counter()
            response = await http.post(
                f"/v1/default/banks/{bank}/memories/recall", json={"query": query}
            )
            latencies.append(time.perf_counter() - t0)
            response.raise_for_status()

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return latencies, time.perf_counter() - started


def _figures(latencies: list[float], cpu_seconds: float, wall: float) -> dict[str, Any]:
    return {
        "requests": len(latencies),
        "p50_ms": round(percentile(latencies, 50) * 1000, 2),
        "p95_ms": round(percentile(latencies, 95) * 1000, 2),
        "p99_ms": round(percentile(latencies, 99) * 1000, 2),
        "server_cpu_ms_per_recall": round(cpu_seconds * 1000 / len(latencies), 2),
        "throughput_rps": round(len(latencies) / wall, 1),
    }


async def _interleaved(
    servers: dict[str, Server],
    clients: dict[str, httpx.AsyncClient],
    bank: str,
    cycle: Iterator[str],
    total: int,
    rounds: int,
    n_clients: int,
) -> dict[str, Any]:
    """*total* recalls per server from *n_clients* clients, in *rounds* interleaved rounds
    (every server gets the same queries, in a rotating order). Besides each server's figures,
    ``round_p50_ratio``: the median over rounds of each server's p50 over ``off``'s."""
    per_round = total // rounds
    names = tuple(servers)
    latencies: dict[str, list[float]] = {name: [] for name in names}
    cpu = dict.fromkeys(names, 0.0)
    wall = dict.fromkeys(names, 0.0)
    ratios: dict[str, list[float]] = {name: [] for name in names if name != "off"}
    for r in range(rounds):
        todo = [next(cycle) for _ in range(per_round)]
        order = names[r % len(names) :] + names[: r % len(names)]
        p50: dict[str, float] = {}
        for name in order:
            cpu0 = servers[name].cpu_seconds()
            measured, took = await _recalls(clients[name], bank, todo, n_clients)
            cpu[name] += servers[name].cpu_seconds() - cpu0
            wall[name] += took
            latencies[name] += measured
            p50[name] = percentile(measured, 50)
        for name in ratios:
            ratios[name].append(p50[name] / p50["off"])
    out: dict[str, Any] = {
        name: {"clients": n_clients, **_figures(latencies[name], cpu[name], wall[name])}
        for name in names
    }
    out["round_p50_ratio"] = {
        name: round(statistics.median(values), 3) for name, values in ratios.items()
    }
    return out


def _change(value: float, base: float) -> float:
    return round((value / base - 1) * 100, 1)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    qs = queries()
    bank = f"bench-{args.size}"
    configs = CONFIGS if args.before_src is None else (*CONFIGS, "on_before")
    counts = {name: Path(tempfile.mkstemp(prefix=f"spans-{name}-")[1]) for name in configs}
    with ExitStack() as stack:
        servers: dict[str, Server] = {}
        for name in configs:
            env = {
                "HEED_TRACING": "on" if name.startswith("on") else "off",
                "BENCH_SPAN_COUNT_FILE": str(counts[name]),
                "BENCH_SPAN_PROCESSOR": args.processor,
            }
            if name == "on_before":
                env["PYTHONPATH"] = str(args.before_src)
                env["BENCH_SPAN_PROCESSOR"] = args.before_processor
            servers[name] = stack.enter_context(serve(args.data_dir, env, TRACED_SERVE))
        if args.baseline_src is not None:  # heed before tracing, served by `heed serve`
            env = {"PYTHONPATH": str(args.baseline_src)}
            servers["baseline"] = stack.enter_context(serve(args.data_dir, env))
        limits = httpx.Limits(max_connections=64)
        clients = {
            name: httpx.AsyncClient(base_url=server.url, timeout=300, limits=limits)
            for name, server in servers.items()
        }
        try:
            if await bank_units(clients["off"], bank) != args.size or args.rebuild:
                print(f"building {bank} ({args.size} units)")
                await build_bank(clients["off"], bank, args.size)
            for http in clients.values():  # warm-up: each loads the bank's vector index
                await _recalls(http, bank, qs[:20], 1)

            cycle = itertools.cycle(qs)
            out: dict[str, Any] = {
                "bank_units": args.size,
                "rounds": args.rounds,
                "span_processor": args.processor,
                **(
                    {}
                    if args.before_src is None
                    else {
                        "on_before_src": str(args.before_src),
                        "on_before_span_processor": args.before_processor,
                    }
                ),
                "load_average_1m_at_start": round(os.getloadavg()[0], 2),
            }
            for mode, total, n_clients in (
                ("single", args.requests, 1),
                ("concurrent", args.concurrent_requests, args.clients),
            ):
                out[mode] = await _interleaved(
                    servers, clients, bank, cycle, total, args.rounds, n_clients
                )
        finally:
            for http in clients.values():
                await http.aclose()
    spans = {name: int(counts[name].read_text() or 0) for name in configs}
    for path in counts.values():
        path.unlink(missing_ok=True)
    recalls = (args.requests + args.concurrent_requests) // args.rounds * args.rounds + 20
    out["spans_kept"] = spans
    out["spans_per_recall_on"] = round(spans["on"] / recalls, 1)
    if "on_before" in spans:
        out["spans_per_recall_on_before"] = round(spans["on_before"] / recalls, 1)

    base = out["single"]["off"]
    out["change_percent"] = {
        mode: {
            name: {
                "p50": _change(out[mode][name]["p50_ms"], out[mode]["off"]["p50_ms"]),
                "p95": _change(out[mode][name]["p95_ms"], out[mode]["off"]["p95_ms"]),
                "cpu_per_recall": _change(
                    out[mode][name]["server_cpu_ms_per_recall"],
                    out[mode]["off"]["server_cpu_ms_per_recall"],
                ),
            }
            for name in out["single"]
            if name not in ("off", "round_p50_ratio")
        }
        for mode in ("single", "concurrent")
    }
    out["target"] = {"on_p50_change_percent_max": 5, "off": "within the off/off_again noise"}
    for mode in ("single", "concurrent"):
        for name in (n for n in out[mode] if n != "round_p50_ratio"):
            f = out[mode][name]
            print(
                f"{mode:>10} {name:>9}: p50 {f['p50_ms']} ms p95 {f['p95_ms']} ms "
                f"cpu/recall {f['server_cpu_ms_per_recall']} ms"
            )
    print("change vs off (%):", out["change_percent"])
    print(
        "median over rounds of p50 / off's p50:",
        {m: out[m]["round_p50_ratio"] for m in ("single", "concurrent")},
    )
    print(f"spans per recall with tracing on: {out['spans_per_recall_on']}; base {base}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=11_600, help="bank size in units")
    parser.add_argument("--requests", type=int, default=1200, help="single-client recalls each")
    parser.add_argument("--rounds", type=int, default=20, help="interleaved rounds")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients")
    parser.add_argument("--concurrent-requests", type=int, default=400)
    parser.add_argument(
        "--data-dir", type=Path, default=DEFAULT_DIR, help="servers' data dir (the bank is reused)"
    )
    parser.add_argument("--rebuild", action="store_true", help="rebuild the bank even if present")
    parser.add_argument(
        "--baseline-src",
        type=Path,
        help="also serve heed from this src dir (a checkout without tracing) as 'baseline'",
    )
    parser.add_argument(
        "--processor",
        choices=("batch", "simple"),
        default="batch",
        help="the span processor in front of the in-memory exporter (batch: what a deployment "
        "runs; simple: what the tests use, export on the span's thread)",
    )
    parser.add_argument(
        "--before-src",
        type=Path,
        help="also serve heed with tracing on from this src dir (an earlier tracing) as "
        "'on_before'",
    )
    parser.add_argument(
        "--before-processor",
        choices=("batch", "simple"),
        default="simple",
        help="on_before's span processor (simple: what the earlier runs measured)",
    )
    parser.add_argument(
        "--name", default="tracing_overhead", help="results file: benchmarks/results/NAME.json"
    )
    args = parser.parse_args()
    os.environ.pop("OTEL_SDK_DISABLED", None)
    print("wrote", write_result(args.name, asyncio.run(run(args))))


if __name__ == "__main__":
    main()
