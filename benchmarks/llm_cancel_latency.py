"""LLM cancel latency: how long after a cancel does a streamed generation stop?

Two targets, each cancelled at random points of a streamed generation
(uniformly between 0 and --max-delay seconds after the stream starts, so some
cancels land while connecting or evaluating the prompt, most mid-generation):

- ``upstream``: the ``openai`` provider against the fake OpenAI-compatible
  server of the test suite (uvicorn on 127.0.0.1 in its own thread, one token
  every 20 ms). "Last token produced" is the last chunk the upstream sent;
  "stopped" is when the upstream saw its connection close.
- ``local``: the ``local`` provider (SmolLM2-135M-Instruct, llama-cpp-python).
  "Last token produced" is the last token the model computed; "stopped" is
  when the generation thread finished.

For each: p50 / p99 of cancel -> last token produced (0 when no token came
after the cancel), of cancel -> stopped, and of cancel -> the stream's consumer
got ``OperationCancelled``. Target: p99 <= 50 ms. The token is cancelled from
the event loop (as the HTTP middleware does on ``http.disconnect``).

Writes benchmarks/results/llm_cancel_latency.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for tests.llm.fake_upstream

from _server import RESULTS, percentile  # noqa: E402
from heed.llm import ChatMessage, ChatProvider, TextDelta  # noqa: E402
from heed.runtime import OperationCancelled, RequestContext, use_context  # noqa: E402

STOP_KEYS = {
    "upstream": "cancel_to_upstream_connection_closed_ms",
    "local": "cancel_to_generation_thread_stopped_ms",
}


def summary(values_s: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values_s]
    return {
        "p50": round(percentile(ms, 50), 2),
        "p99": round(percentile(ms, 99), 2),
        "max": round(max(ms), 2),
        "mean": round(statistics.fmean(ms), 2),
    }


@dataclass
class Samples:
    """What the cancelled trials of one target measured (seconds after each cancel)."""

    last_token: list[float] = field(default_factory=list)
    stopped: list[float] = field(default_factory=list)
    released: list[float] = field(default_factory=list)
    before_first: int = 0

    def add(self, outcome: dict[str, Any], last_token_at: float, stopped_at: float) -> None:
        cancelled_at = outcome["cancelled_at"]
        self.last_token.append(max(0.0, last_token_at - cancelled_at))
        self.stopped.append(max(0.0, stopped_at - cancelled_at))
        self.released.append(outcome["released_s"])
        self.before_first += outcome["tokens_before_cancel"] == 0

    def report(self, target: str) -> dict[str, Any]:
        return {
            "cancelled_before_first_token": self.before_first,
            "cancel_to_last_token_produced_ms": summary(self.last_token),
            STOP_KEYS[target]: summary(self.stopped),
            "cancel_to_consumer_released_ms": summary(self.released),
        }


async def one_trial(
    provider: ChatProvider, messages: list[ChatMessage], delay: float, max_tokens: int
) -> dict[str, Any]:
    """Stream, cancel after *delay*, and report what happened (monotonic instants)."""
    ctx = RequestContext()
    tokens_seen = 0
    finished = False

    async def consume() -> None:
        nonlocal tokens_seen, finished
        with use_context(ctx):
            async for event in provider.stream(messages, max_tokens=max_tokens):
                if isinstance(event, TextDelta):
                    tokens_seen += 1
        finished = True

    task = asyncio.create_task(consume())
    await asyncio.sleep(delay)
    ctx.token.cancel("benchmark cancel")
    cancelled_at = ctx.token.cancelled_at
    assert cancelled_at is not None
    with contextlib.suppress(OperationCancelled):
        await task
    released_at = time.monotonic()
    return {
        "cancelled_at": cancelled_at,
        "released_s": released_at - cancelled_at,
        "tokens_before_cancel": tokens_seen,
        "finished_before_cancel": finished,
    }


async def bench_upstream(trials: int, max_delay: float, interval: float) -> dict[str, Any]:
    from tests.llm.fake_upstream import Behaviour, serve_fake_upstream, text_chunks

    from heed.llm.openai import OpenAIProvider

    samples = Samples()
    with serve_fake_upstream() as upstream:
        provider = OpenAIProvider(model="fake", base_url=upstream.base_url, timeout=10, retries=0)
        words = [f"w{i} " for i in range(int(max_delay / interval) + 100)]
        messages = [ChatMessage.user("Tell me a long story.")]
        try:
            for _ in range(trials):
                upstream.app.reset()
                upstream.app.plan(Behaviour(chunks=text_chunks(words), interval=interval))
                outcome = await one_trial(
                    provider, messages, random.uniform(0, max_delay), len(words)
                )
                record = upstream.app.records[0]
                if not await asyncio.to_thread(record.wait_disconnected, 5.0):
                    raise SystemExit("the upstream connection was never closed")
                last_sent = record.sent_at[-1] if record.sent_at else record.started_at
                samples.add(outcome, last_sent, record.disconnected_at)
        finally:
            await provider.aclose()
    return {
        "trials": trials,
        "token_interval_ms": interval * 1000,
        **samples.report("upstream"),
    }


async def bench_local(trials: int, max_delay: float, threads: int) -> dict[str, Any]:
    from heed.llm.local import LocalProvider, default_threads, llama_available

    if not llama_available():
        return {"skipped": "llama-cpp-python is not installed (run scripts/install.sh)"}
    provider = LocalProvider(threads=threads)
    await provider.load()
    samples = Samples()
    completed = 0
    topics = ["a dragon", "a lighthouse", "two robots", "a lost cat", "the sea", "a comet"]
    for i in range(trials):
        # a different opening each time, so the prompt is evaluated again (cancels in prefill too)
        prompt = f"Story {i}: write a long story about {random.choice(topics)} and a friend."
        outcome = await one_trial(
            provider, [ChatMessage.user(prompt)], random.uniform(0, max_delay), 1000
        )
        if outcome["finished_before_cancel"]:
            completed += 1
            continue
        samples.add(
            outcome,
            provider.last_token_at or 0.0,
            provider.last_stop_at or outcome["cancelled_at"],
        )
    return {
        "trials": trials,
        "model": provider.model,
        "threads": threads or default_threads(),
        "finished_before_cancel_excluded": completed,
        **samples.report("local"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream-trials", type=int, default=200)
    parser.add_argument("--local-trials", type=int, default=100)
    parser.add_argument("--max-delay", type=float, default=1.5, help="seconds (default 1.5)")
    parser.add_argument(
        "--interval", type=float, default=0.02, help="fake upstream seconds per token"
    )
    parser.add_argument("--threads", type=int, default=0, help="local model threads (0: all)")
    parser.add_argument("--skip-local", action="store_true", help="only the fake upstream")
    parser.add_argument("--seed", type=int, default=4)
    parser.add_argument(
        "--output", type=Path, default=RESULTS / "llm_cancel_latency.json", help="JSON path"
    )
    args = parser.parse_args()
    random.seed(args.seed)
    load_at_start = [round(x, 2) for x in os.getloadavg()]

    async def run() -> dict[str, Any]:
        results: dict[str, Any] = {
            "upstream": await bench_upstream(args.upstream_trials, args.max_delay, args.interval)
        }
        if not args.skip_local:
            results["local"] = await bench_local(args.local_trials, args.max_delay, args.threads)
        return results

    results = asyncio.run(run())
    report = {
        "benchmark": "llm_cancel_latency",
        **results,
        "target": {"cancel_to_last_token_p99_ms": 50},
        "max_delay_s": args.max_delay,
        "seed": args.seed,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_at_start": load_at_start,
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        },
        "measured_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    for target in ("upstream", "local"):
        part = results.get(target)
        if not part or "skipped" in part:
            print(f"{target}: {part.get('skipped') if part else 'not run'}")
            continue
        token = part["cancel_to_last_token_produced_ms"]
        stop_key = STOP_KEYS[target]
        stop = part[stop_key]
        print(
            f"{target}: cancel -> last token produced p50 {token['p50']} ms, p99 {token['p99']} ms;"
            f" {stop_key.removeprefix('cancel_to_').removesuffix('_ms')} p50 {stop['p50']} ms,"
            f" p99 {stop['p99']} ms"
        )
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
