"""What a refresh of an unchanged mental model costs in LLM calls and tokens (issue 41:
"a refresh of an unchanged mental model costs 0 LLM tokens").

A real ``heed serve`` (SQLite, or PostgreSQL with ``--postgres``) whose reflect provider is
``openai`` against the fake OpenAI-compatible upstream of ``tests/llm/fake_upstream.py``,
which answers every call with a short text and reports its usage (3 prompt + 2 completion
tokens). The calls and tokens are counted where they would be billed: at the upstream.

A bank with a few memories tagged ``alice`` and one mental model scoped to that tag. After
its first refresh (at creation): ``--refreshes`` refreshes by hand with nothing changed
(each must be skipped: 0 calls, 0 tokens); then a retain *outside* the model's scope (tag
``bob``) and a refresh (still 0); then a retain *into* the scope and a refresh (the control:
it must ask the upstream again). Each refresh's wall time (the run's ``finished_at`` minus
when it was asked) and the server's ``heed_mental_model_refresh_skipped_total`` are
reported. Writes ``benchmarks/results/mental_model_refresh_skip.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for tests.llm.fake_upstream

from _cluster import postgres  # noqa: E402
from _runs import finished_at as _finished_at  # noqa: E402
from _runs import get_run as _run  # noqa: E402
from _runs import latency_summary as _summary  # noqa: E402
from _server import serve, write_result  # noqa: E402

#: The tokens the fake upstream reports for each call (its default reply's usage).
TOKENS_PER_CALL = 3 + 2
FACTS = [
    "Alice has two cats named Tom and Jerry.",
    "Alice works as a nurse at St. Mary's hospital.",
    "Alice's cats sleep on the sofa all afternoon.",
]


async def _retain(http: httpx.AsyncClient, bank: str, texts: list[str], tag: str) -> None:
    items = [{"content": text, "tags": [tag]} for text in texts]
    response = await http.post(f"/v1/default/banks/{bank}/memories", json={"items": items})
    response.raise_for_status()


async def _refresh(http: httpx.AsyncClient, calls: Any, bank: str, model_id: str) -> dict[str, Any]:
    """One refresh by hand: its upstream calls and tokens, wall time and result."""
    before = calls()
    asked = time.time()
    response = await http.post(f"/v1/default/banks/{bank}/mental-models/{model_id}/refresh")
    response.raise_for_status()
    run_id = str(response.json()["operation_id"])
    ended = await _finished_at(http, run_id)
    run = await _run(http, run_id)
    assert run["phase"] == "completed", run
    made = calls() - before
    return {
        "upstream_calls": made,
        "tokens": made * TOKENS_PER_CALL,
        "seconds": ended - asked,
        "skipped": (run["result"] or {}).get("skipped"),
    }


async def _skipped_total(http: httpx.AsyncClient) -> float:
    text = (await http.get("/metrics")).text
    found = re.findall(r"^heed_mental_model_refresh_skipped_total\{[^}]*\} (\S+)$", text, re.M)
    return sum(float(value) for value in found)


async def _measure(http: httpx.AsyncClient, calls: Any, refreshes: int) -> dict[str, Any]:
    bank = "skip-bench"
    (await http.put(f"/v1/default/banks/{bank}", json={})).raise_for_status()
    await _retain(http, bank, FACTS, "alice")
    created = await http.post(
        f"/v1/default/banks/{bank}/mental-models",
        json={"name": "Alice", "source_query": "What do we know about Alice?", "tags": ["alice"]},
    )
    created.raise_for_status()
    body = created.json()
    await _finished_at(http, body["operation_id"])
    model_id = str(body["mental_model_id"])
    first_calls = calls()

    unchanged = [await _refresh(http, calls, bank, model_id) for _ in range(refreshes)]
    await _retain(http, bank, ["Bob plays the violin."], "bob")
    outside = await _refresh(http, calls, bank, model_id)
    await _retain(http, bank, ["Alice adopted a hamster named Fluff."], "alice")
    into = await _refresh(http, calls, bank, model_id)
    return {
        "first_refresh_upstream_calls": first_calls,
        "unchanged": {
            "refreshes": refreshes,
            "upstream_calls": sum(r["upstream_calls"] for r in unchanged),
            "tokens": sum(r["tokens"] for r in unchanged),
            "skipped": sum(1 for r in unchanged if r["skipped"]),
            "wall": _summary([r["seconds"] for r in unchanged]),
        },
        "after_retain_outside_scope": outside,
        "after_retain_into_scope": into,
        "skipped_total_metric": await _skipped_total(http),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from tests.llm.fake_upstream import serve_fake_upstream

    out: dict[str, Any] = {"database": "postgresql" if args.postgres else "sqlite"}
    with ExitStack() as stack:
        upstream = stack.enter_context(serve_fake_upstream())
        data_dir = Path(tempfile.mkdtemp(prefix="heed-mm-skip-"))
        env = {
            "HEED_LLM_PROVIDER": "scripted",
            "HEED_REFLECT_LLM_PROVIDER": "openai",
            "HEED_REFLECT_LLM_BASE_URL": upstream.base_url,
            "HEED_REFLECT_LLM_MODEL": "fake",
            "HEED_REFLECT_LLM_API_KEY": "bench",
            "HEED_MENTAL_MODEL_MIN_REFRESH_INTERVAL_SECONDS": "0",
        }
        if args.postgres:
            env["HEED_DATABASE_URL"] = stack.enter_context(postgres())
        server = stack.enter_context(serve(data_dir, env))

        def calls() -> int:
            return len(upstream.app.records)

        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            out.update(await _measure(http, calls, args.refreshes))
    unchanged = out["unchanged"]
    out["targets"] = {
        "unchanged_refresh_tokens": unchanged["tokens"],
        "unchanged_refresh_tokens_target": 0,
        "unchanged_refresh_tokens_met": unchanged["tokens"] == 0,
        "retain_outside_scope_tokens": out["after_retain_outside_scope"]["tokens"],
        "retain_into_scope_asks_the_llm": out["after_retain_into_scope"]["upstream_calls"] > 0,
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--refreshes", type=int, default=20, help="refreshes of the unchanged")
    parser.add_argument("--postgres", action="store_true", help="store in PostgreSQL (pgvector)")
    parser.add_argument("--name", default=None, help="results file name")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    name = args.name or "mental_model_refresh_skip" + ("_postgres" if args.postgres else "")
    path = write_result(name, result)
    print(json.dumps(result["targets"], indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
