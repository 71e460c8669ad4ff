"""How fast a mental model's refresh stops when it is cancelled while processing.

A real ``heed serve`` (SQLite, or PostgreSQL with ``--postgres``) whose reflect provider is
the scripted one, each model call taking ``--llm-latency`` seconds before its first token,
so a refresh is caught mid-LLM-call. A bank with a few memories and one mental model; then
``--trials`` times: ``POST .../refresh``, wait until the run is ``running`` and a little
more (random, within the LLM call), ``POST /v1/runs/{id}/cancel``, and measure the run's
``finished_at`` minus the wall time the cancel was sent (as
``consolidation_contention.py``'s ``_cancel_trials``): the worker has stopped, its reflect
slot freed, when ``finished_at`` is stamped. The same for ``--delete-trials`` bank deletes
during a refresh (the delete's answer and the run's stop). Target (issue 31): cancel p99
<= 50 ms. Writes ``benchmarks/results/mental_model_cancel.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from _cluster import postgres
from _runs import finished_at as _finished_at
from _runs import get_run as _run
from _runs import latency_summary as _summary
from _runs import until as _until
from _server import serve, write_result

FACTS = [
    "Alice has two cats named Tom and Jerry.",
    "Alice works as a nurse at St. Mary's hospital.",
    "Alice's cats sleep on the sofa all afternoon.",
]


async def _bank_with_model(http: httpx.AsyncClient, bank: str) -> str:
    (await http.put(f"/v1/default/banks/{bank}", json={})).raise_for_status()
    items = [{"content": fact} for fact in FACTS]
    (
        await http.post(f"/v1/default/banks/{bank}/memories", json={"items": items})
    ).raise_for_status()
    created = await http.post(
        f"/v1/default/banks/{bank}/mental-models",
        json={"name": "Alice", "source_query": "What do we know about Alice?"},
    )
    created.raise_for_status()
    body = created.json()
    await http.post(f"/v1/runs/{body['operation_id']}/cancel")  # the creation's refresh
    await _finished_at(http, body["operation_id"])
    return str(body["mental_model_id"])


async def _processing_refresh(
    http: httpx.AsyncClient, bank: str, model_id: str, latency: float
) -> str:
    """Start a refresh and return once it is inside its LLM call."""
    response = await http.post(f"/v1/default/banks/{bank}/mental-models/{model_id}/refresh")
    response.raise_for_status()
    run_id = str(response.json()["operation_id"])

    async def running() -> bool:
        return (await _run(http, run_id))["phase"] == "running"

    await _until(running, 30, 0.005)
    await asyncio.sleep(random.uniform(0.05, latency * 0.8))
    return run_id


async def _cancel_trials(http: httpx.AsyncClient, trials: int, latency: float) -> dict[str, Any]:
    bank = "refreshing"
    model_id = await _bank_with_model(http, bank)
    stops: list[float] = []
    for _ in range(trials):
        run_id = await _processing_refresh(http, bank, model_id, latency)
        sent = time.time()
        (await http.post(f"/v1/runs/{run_id}/cancel")).raise_for_status()
        stops.append(await _finished_at(http, run_id) - sent)
        assert (await _run(http, run_id))["phase"] == "cancelled", run_id
    content = (await http.get(f"/v1/default/banks/{bank}/mental-models/{model_id}")).json()
    return {"trials": trials, "content_after": content["content"], **_summary(stops)}


async def _delete_trials(http: httpx.AsyncClient, trials: int, latency: float) -> dict[str, Any]:
    responses: list[float] = []
    stops: list[float] = []
    leftovers = 0
    for trial in range(trials):
        bank = f"doomed-{trial}"
        model_id = await _bank_with_model(http, bank)
        run_id = await _processing_refresh(http, bank, model_id, latency)
        sent = time.time()
        t0 = time.perf_counter()
        (await http.delete(f"/v1/default/banks/{bank}")).raise_for_status()
        responses.append(time.perf_counter() - t0)
        stops.append(await _finished_at(http, run_id) - sent)
        (await http.put(f"/v1/default/banks/{bank}", json={})).raise_for_status()
        listed = (await http.get(f"/v1/default/banks/{bank}/mental-models")).json()
        leftovers += int(listed["total"])
    return {
        "trials": trials,
        "delete_response": _summary(responses),
        "run_stopped": _summary(stops),
        "mental_models_left_in_recreated_banks": leftovers,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    script = {"replies": [{"text": "Alice is a nurse with two cats.", "latency": args.llm_latency}]}
    out: dict[str, Any] = {
        "database": "postgresql" if args.postgres else "sqlite",
        "llm_latency_seconds": args.llm_latency,
    }
    with ExitStack() as stack:
        data_dir = Path(tempfile.mkdtemp(prefix="heed-mm-cancel-"))
        env = {
            "HEED_LLM_PROVIDER": "scripted",
            "HEED_REFLECT_LLM_SCRIPT": json.dumps(script),
        }
        if args.postgres:
            env["HEED_DATABASE_URL"] = stack.enter_context(postgres())
        server = stack.enter_context(serve(data_dir, env))
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            out["cancel_while_processing"] = await _cancel_trials(
                http, args.trials, args.llm_latency
            )
            out["bank_delete_while_processing"] = await _delete_trials(
                http, args.delete_trials, args.llm_latency
            )
    cancel = out["cancel_while_processing"]
    out["targets"] = {
        "cancel_p99_ms": cancel["p99_ms"],
        "cancel_p99_target_ms": 50,
        "cancel_p99_met": cancel["p99_ms"] <= 50,
        "bank_delete_run_stopped_p99_ms": out["bank_delete_while_processing"]["run_stopped"][
            "p99_ms"
        ],
        "nothing_left_after_bank_delete": out["bank_delete_while_processing"][
            "mental_models_left_in_recreated_banks"
        ]
        == 0,
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=100, help="cancels while processing")
    parser.add_argument("--delete-trials", type=int, default=20, help="bank deletes")
    parser.add_argument("--llm-latency", type=float, default=1.0, help="seconds per LLM call")
    parser.add_argument("--postgres", action="store_true", help="store in PostgreSQL (pgvector)")
    parser.add_argument("--name", default=None, help="results file name")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    name = args.name or "mental_model_cancel" + ("_postgres" if args.postgres else "")
    path = write_result(name, result)
    print(json.dumps(result["targets"], indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
