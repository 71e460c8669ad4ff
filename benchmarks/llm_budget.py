"""Budgets hold (issue 41: "a bank with a 50,000-token daily budget and 5,000 pending facts
spends at most the budget plus one call, waits, and resumes in the next window; nothing lost
or failed").

heed is served in this process (a real server on a loopback socket, SQLite), so the clock LLM
calls are timed and budgets count by (``heed.llm.usage.use_wall_clock``) can be moved: a day
passes when the benchmark says so, not in 24 hours. Every model call
goes to the fake OpenAI-compatible upstream of ``tests/llm/fake_upstream.py``, which answers a
consolidation round with one observation after ``--latency`` seconds and reports its usage
(prompt characters / 4, reply characters / 4): the spend is counted where it is billed.

``--facts`` units are retained with extraction off and observations on (each unit a fact
waiting for consolidation) into a bank whose ``llm_budget_tokens_per_day`` is ``--budget``.
Then, window by window: the consolidation runs until it waits (no call for a while, the
run's journal saying ``waiting: llm_budget``); the window's spend at the upstream is
recorded; the budget's clock moves to the next UTC day and the bank's config is written again
(which wakes the waiting run at once, as a budget change does). Until nothing is pending.

Targets: each window's spend <= budget + the largest single call; every fact consolidated,
none failed; the run resumed in each next window. Writes
``benchmarks/results/llm_budget.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for tests.*

from _corpus import synthetic_sessions  # noqa: E402
from _server import write_result  # noqa: E402

BANK = "budgeted"
DAY = 86_400
#: The fake model's one reply to every round, and the completion tokens it reports.
REPLY = json.dumps(
    {"actions": [{"action": "create", "text": "A plan the speakers share.", "facts": [0]}]}
)
REPLY_TOKENS = len(REPLY) // 4


def _user_text(body: dict[str, Any]) -> str:
    return str([m for m in body["messages"] if m["role"] == "user"][-1]["content"])


def _prompt_tokens(body: dict[str, Any]) -> int:
    return sum(len(str(m["content"])) for m in body["messages"]) // 4


def responder(latency: float) -> Any:
    from tests.llm.fake_upstream import Behaviour, text_chunks, usage_chunk

    def respond(body: dict[str, Any]) -> Behaviour | None:
        user = _user_text(body)
        if not user.startswith("New facts:"):
            return None
        usage = usage_chunk(_prompt_tokens(body), REPLY_TOKENS)
        return Behaviour(header_delay=latency, chunks=[*text_chunks([REPLY]), usage])

    return respond


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tests.llm.fake_upstream import serve_fake_upstream
    from tests.support import live_server

    from heed.api.app import create_app
    from heed.llm.usage import use_wall_clock
    from heed.settings import Settings

    logging.getLogger("httpx").setLevel(logging.WARNING)
    data_dir = Path(tempfile.mkdtemp(prefix="heed-budget-"))
    with serve_fake_upstream() as upstream:
        upstream.app.responder = responder(args.latency)
        os.environ.update(
            {
                "HEED_DATA_DIR": str(data_dir),
                "HEED_LLM_PROVIDER": "openai",
                "HEED_LLM_BASE_URL": upstream.base_url,
                "HEED_LLM_MODEL": "fake-model",
                "HEED_LLM_API_KEY": "bench",
                "HEED_CONSOLIDATION_DEBOUNCE_SECONDS": "3600",  # started by this script
            }
        )
        app = create_app(Settings())
        with (
            live_server(app, timeout=120) as server,
            httpx.Client(base_url=server.url, timeout=300) as http,
        ):
            budgets = app.state.services.llm_budgets
            offset = [0.0]
            # Calls are timed, and budgets count, by this clock: a day passes when we say.
            use_wall_clock(lambda: time.time() + offset[0])
            bank_url = f"/v1/default/banks/{BANK}"
            http.put(bank_url, json={"name": BANK}).raise_for_status()
            config = {
                "retain_extraction_mode": "off",
                "enable_observations": True,
                "llm_budget_tokens_per_day": args.budget,
            }
            http.patch(f"{bank_url}/config", json={"updates": config}).raise_for_status()
            started = time.monotonic()
            retained = 0
            for items in synthetic_sessions(args.facts, per_session=50):
                http.post(f"{bank_url}/memories", json={"items": items}).raise_for_status()
                retained += len(items)
            retain_seconds = time.monotonic() - started

            def pending() -> int:
                listed = http.get(
                    f"{bank_url}/memories/list",
                    params={"consolidation_state": "pending", "limit": "1"},
                ).json()
                return int(listed["total"])

            def calls() -> list[dict[str, Any]]:
                out = []
                for record in list(upstream.app.records):
                    if not _user_text(record.body).startswith("New facts:"):
                        continue
                    tokens = _prompt_tokens(record.body) + REPLY_TOKENS  # as the usage says
                    out.append({"tokens": tokens, "at": record.started_at})
                return out

            http.post(f"{bank_url}/consolidate").raise_for_status()
            windows: list[dict[str, Any]] = []
            seen = 0
            while True:
                # Until the run waits (the budget held a call) and its calls in flight have
                # ended, or nothing is pending.
                waits_before = budgets.waits
                deadline = time.monotonic() + args.window_timeout
                while budgets.waits == waits_before and pending() and time.monotonic() < deadline:
                    time.sleep(0.2)
                count, quiet_since = len(calls()), time.monotonic()
                while time.monotonic() - quiet_since < args.quiet:
                    time.sleep(0.1)
                    if len(calls()) != count:
                        count, quiet_since = len(calls()), time.monotonic()
                made = calls()[seen:]
                seen += len(made)
                left = pending()
                windows.append(
                    {
                        "window": len(windows),
                        "calls": len(made),
                        "tokens": sum(c["tokens"] for c in made),
                        "largest_call_tokens": max((c["tokens"] for c in made), default=0),
                        "waited": budgets.waits > waits_before,
                        "pending_after": left,
                    }
                )
                print(json.dumps(windows[-1]))
                if left == 0 or len(windows) >= args.max_windows:
                    break
                offset[0] += DAY  # the next UTC day
                http.patch(f"{bank_url}/config", json={"updates": config}).raise_for_status()
            failed = http.get(
                f"{bank_url}/memories/list", params={"consolidation_state": "failed", "limit": "1"}
            ).json()["total"]
            done = http.get(
                f"{bank_url}/memories/list", params={"consolidation_state": "done", "limit": "1"}
            ).json()["total"]
    largest = max(w["largest_call_tokens"] for w in windows)
    spent_ok = all(w["tokens"] <= args.budget + largest for w in windows)
    return {
        "database": "sqlite",
        "facts": retained,
        "retain_seconds": round(retain_seconds, 1),
        "budget_tokens_per_day": args.budget,
        "llm_latency_seconds": args.latency,
        "windows": windows,
        "facts_done": done,
        "facts_failed": failed,
        "targets": {
            "max_window_tokens": max(w["tokens"] for w in windows),
            "budget_plus_largest_call": args.budget + largest,
            "every_window_within_budget_plus_one_call": spent_ok,
            "every_full_window_waited": all(w["waited"] for w in windows[:-1]),
            "nothing_lost_or_failed": failed == 0 and done == retained,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--facts", type=int, default=5000, help="pending facts")
    parser.add_argument("--budget", type=int, default=50_000, help="tokens per day")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per model call")
    parser.add_argument(
        "--quiet", type=float, default=2.0, help="seconds without a call once it waits"
    )
    parser.add_argument(
        "--window-timeout", type=float, default=900.0, help="the longest one window may take"
    )
    parser.add_argument("--max-windows", type=int, default=20, help="days at the most")
    parser.add_argument("--name", default="llm_budget", help="results file name")
    args = parser.parse_args()
    result = run(args)
    path = write_result(args.name, result)
    print(json.dumps(result["targets"], indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
