"""How fast heed learns from a remote model, and what it costs users meanwhile (issue 41:
"the learning of 600 LoCoMo turns finishes within 1.3x of its LLM-bound minimum (calls /
allowed concurrency x latency) and in fewer calls than today, while 8 recall clients' p95
stays within 1.2x of idle").

A real ``heed serve`` (SQLite) whose every model call goes to the fake OpenAI-compatible
upstream of ``tests/llm/fake_upstream.py``, which holds each answer ``--latency`` seconds
(1 s: a remote model's structured reply) and answers what a model would: an extraction call
with one fact per two turns that carry information (turns of at least ``--fact-chars``
characters), each citing both; a consolidation call with one new observation per round
and an update of the first related observation, citing the round's facts. The calls are
counted where they would be billed: at the upstream.

The data: the first ``--turns`` turns of the LoCoMo development split (../shared, never
committed), retained as one asynchronous retain of one item per session (the way the
issue's side-by-side measurement retained them), into a bank with extraction and
observations on (the server's defaults with an openai provider).

Measured:

1. **alone**: the learning (extraction, then consolidation) with nothing else running: its
   wall time from the retain's submission until no fact is pending and the consolidation
   run ended, its calls by kind, and the LLM-bound minimum: ``calls / C x latency``, where C
   is the concurrency background work may use (all but one of ``HEED_LLM_CONCURRENCY``);
   and the server's CPU seconds meanwhile (embedding the turns and facts, recalls, writes),
   whose share per core is a second floor: on a small machine the learning is CPU-bound;
2. **idle recall**: 8 recall clients for ``--seconds`` against a second bank holding the
   same turns, with nothing else running; measured again after step 3 (the machine's drift
   over the run), and the target compares with the mean of the two p95s;
3. **contended**: the same learning into a fresh bank while the 8 recall clients run, their
   latency pooled over the learning's duration, and the learning's wall time under that load
   (background recalls and embedding yield the CPU to users' recalls by design).

Writes ``benchmarks/results/learning_throughput.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for tests.llm.fake_upstream

from _locomo import DEFAULT_DATA, Turn, load_conversations  # noqa: E402
from _runs import latency_summary  # noqa: E402
from _server import serve, write_result  # noqa: E402

_UNIT = re.compile(r"^\[(\d+)\] \([^)]*\) (.*)$", re.M)
_FACT = re.compile(r"^F(\d+)(?: \([^)]*\))?: ", re.M)
_OBSERVATION = re.compile(r"^O(\d+): ", re.M)


def _user_text(body: dict[str, Any]) -> str:
    return str([m for m in body["messages"] if m["role"] == "user"][-1]["content"])


def responder(latency: float, fact_chars: int) -> Any:
    """The fake model: extraction states one fact per informative turn; consolidation
    creates one observation per round and updates the first related one."""
    from tests.llm.fake_upstream import Behaviour, text_chunks, usage_chunk

    def reply(value: dict[str, Any], prompt: str) -> Behaviour:
        text = json.dumps(value)
        usage = usage_chunk(len(prompt) // 4, len(text) // 4)
        return Behaviour(header_delay=latency, chunks=[*text_chunks([text]), usage])

    def respond(body: dict[str, Any]) -> Behaviour | None:
        user = _user_text(body)
        if user.startswith("[0] ("):
            told = [(int(n), said) for n, said in _UNIT.findall(user) if len(said) >= fact_chars]
            pairs = [told[i : i + 2] for i in range(0, len(told), 2)]
            facts = [  # one fact per two informative turns, citing both
                {"text": pair[0][1], "fact_type": "experience", "sources": [n for n, _ in pair]}
                for pair in pairs
            ]
            return reply({"facts": facts}, user)
        if user.startswith("New facts:"):
            cited = [int(n) for n in _FACT.findall(user)]
            actions: list[dict[str, Any]] = [
                {
                    "action": "create",
                    "text": "A topic the speakers returned to.",
                    "facts": cited[:3],
                }
            ]
            if _OBSERVATION.search(user):
                actions.append(
                    {
                        "action": "update",
                        "observations": [0],
                        "text": "The speakers keep sharing news about family and plans.",
                        "facts": cited[3:],
                    }
                )
            return reply({"actions": actions}, user)
        return None

    return respond


def sessions_of(turns: list[Turn]) -> list[dict[str, Any]]:
    """One retain item per session: its turns, one per line, dated by the session."""
    by_session: dict[int, list[Turn]] = defaultdict(list)
    for turn in turns:
        by_session[turn.session].append(turn)
    return [
        {
            "content": "\n".join(t.content() for t in session),
            "timestamp": session[0].timestamp.isoformat(),
            "document_id": f"session-{number}",
        }
        for number, session in sorted(by_session.items())
    ]


async def learn(
    http: httpx.AsyncClient, bank: str, items: list[dict[str, Any]], count: Any
) -> dict[str, Any]:
    """Retain *items* asynchronously into a fresh *bank*; wait until it has learned. *count*
    gives the upstream's calls by kind since the call began."""
    await http.put(f"/v1/default/banks/{bank}", json={"name": bank})
    started = time.monotonic()
    response = await http.post(
        f"/v1/default/banks/{bank}/memories", json={"items": items, "async": True}
    )
    response.raise_for_status()
    operation = response.json()["operation_id"]
    retained_at: float | None = None
    while True:
        ops = (await http.get(f"/v1/default/banks/{bank}/operations")).json()["operations"]
        retain = next(o for o in ops if o["id"] == operation)
        consolidations = [o for o in ops if o["operation_type"] == "consolidation"]
        if retain["status"] == "failed":
            raise SystemExit(f"the retain failed: {retain}")
        if retain["status"] == "completed" and retained_at is None:
            retained_at = time.monotonic() - started
        pending = (
            await http.get(
                f"/v1/default/banks/{bank}/memories/list",
                params={"consolidation_state": "pending", "limit": "1"},
            )
        ).json()["items"]
        if (
            retain["status"] == "completed"
            and consolidations
            and all(o["status"] in ("completed", "failed") for o in consolidations)
            and not pending
        ):
            break
        await asyncio.sleep(0.05)
    seconds = time.monotonic() - started
    return {
        "seconds": round(seconds, 2),
        "retain_completed_after_seconds": round(retained_at or seconds, 2),
        **count(),
    }


async def recall_clients(
    http: httpx.AsyncClient, bank: str, questions: list[str], clients: int, stop: asyncio.Event
) -> list[float]:
    latencies: list[float] = []
    rng = random.Random(7)

    async def client() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            response = await http.post(
                f"/v1/default/banks/{bank}/memories/recall",
                json={"query": rng.choice(questions), "budget": "mid", "max_tokens": 2048},
            )
            response.raise_for_status()
            latencies.append(time.perf_counter() - started)

    await asyncio.gather(*(client() for _ in range(clients)))
    return latencies


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from tests.llm.fake_upstream import serve_fake_upstream

    conversations = load_conversations(DEFAULT_DATA)
    turns = [t for c in conversations for t in c.turns][: args.turns]
    items = sessions_of(turns)
    questions = [q["question"] for c in conversations for q in c.questions][:200]
    background = args.concurrency - 1 if args.concurrency > 1 else 1
    out: dict[str, Any] = {
        "database": "sqlite",
        "turns": len(turns),
        "items": len(items),
        "llm_latency_seconds": args.latency,
        "llm_concurrency": args.concurrency,
        "background_concurrency": background,
    }
    with ExitStack() as stack:
        upstream = stack.enter_context(serve_fake_upstream())
        upstream.app.responder = responder(args.latency, args.fact_chars)

        def count() -> dict[str, Any]:
            kinds: dict[str, Any] = {
                "extraction_calls": 0,
                "consolidation_calls": 0,
                "other_calls": 0,
            }
            for record in list(upstream.app.records):
                user = _user_text(record.body)
                kind = (
                    "extraction_calls"
                    if user.startswith("[0] (")
                    else "consolidation_calls"
                    if user.startswith("New facts:")
                    else "other_calls"
                )
                kinds[kind] += 1
                kinds.setdefault(kind.replace("_calls", "_starts"), []).append(record.started_at)
            return kinds

        def delta(now: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
            """The calls since *before*, and when each kind's began (seconds after the first)."""
            out = {k: now[k] - before[k] for k in now if k.endswith("_calls")}
            starts = {
                k: sorted(now[k])[len(before.get(k, [])) :] for k in now if k.endswith("_starts")
            }
            first = min((t for ts in starts.values() for t in ts), default=0.0)
            out["timeline"] = {
                k: [round(t - first, 2) for t in ts] for k, ts in starts.items() if ts
            }
            return out

        env = {
            "HEED_LLM_PROVIDER": "openai",
            "HEED_LLM_BASE_URL": upstream.base_url,
            "HEED_LLM_MODEL": "fake-model",
            "HEED_LLM_API_KEY": "bench",
            "HEED_LLM_CONCURRENCY": str(args.concurrency),
            "HEED_CONSOLIDATION_DEBOUNCE_SECONDS": str(args.debounce),
        }
        data_dir = Path(tempfile.mkdtemp(prefix="heed-learning-"))
        server = stack.enter_context(serve(data_dir, env))
        async with httpx.AsyncClient(base_url=server.url, timeout=300) as http:

            def counted() -> Any:
                start = count()
                return lambda: delta(count(), start)

            # 0. warm-up: the embedding and reranking models load on first use
            await http.put("/v1/default/banks/warm-up", json={"name": "warm-up"})
            await http.patch(
                "/v1/default/banks/warm-up/config",
                json={"updates": {"retain_extraction_mode": "off", "enable_observations": False}},
            )
            warm = {"items": [{"content": "A warm-up line about gardens and trips."}]}
            (await http.post("/v1/default/banks/warm-up/memories", json=warm)).raise_for_status()
            recall = {"query": "gardens", "budget": "mid"}
            await http.post("/v1/default/banks/warm-up/memories/recall", json=recall)

            # 1. alone
            cpu = server.cpu_seconds()
            alone = await learn(http, "learn-alone", items, counted())
            alone["server_cpu_seconds"] = round(server.cpu_seconds() - cpu, 2)
            cores = os.cpu_count() or 1
            alone["cpu_bound_minimum_seconds"] = round(alone["server_cpu_seconds"] / cores, 2)
            calls = alone["extraction_calls"] + alone["consolidation_calls"]
            minimum = calls / background * args.latency
            alone["llm_bound_minimum_seconds"] = round(minimum, 2)
            waves = (
                math.ceil(alone["extraction_calls"] / background)
                + math.ceil(alone["consolidation_calls"] / background)
            ) * args.latency
            alone["llm_bound_minimum_in_waves_seconds"] = round(waves, 2)
            alone["ratio_to_minimum"] = round(alone["seconds"] / minimum, 3)
            floor = max(minimum, alone["cpu_bound_minimum_seconds"])
            alone["ratio_to_llm_or_cpu_minimum"] = round(alone["seconds"] / floor, 3)
            out["alone"] = alone

            if args.alone_only:
                return out

            # 2. idle recall, against a bank holding the same turns
            await http.put("/v1/default/banks/recall-target", json={"name": "recall-target"})
            await http.patch(
                "/v1/default/banks/recall-target/config",
                json={"updates": {"retain_extraction_mode": "off", "enable_observations": False}},
            )
            for item in items:
                (
                    await http.post(
                        "/v1/default/banks/recall-target/memories", json={"items": [item]}
                    )
                ).raise_for_status()

            async def idle_recall() -> dict[str, Any]:
                stop = asyncio.Event()
                clients = asyncio.ensure_future(
                    recall_clients(http, "recall-target", questions, args.clients, stop)
                )
                await asyncio.sleep(args.seconds)
                stop.set()
                idle = await clients
                return {"clients": args.clients, "requests": len(idle), **latency_summary(idle)}

            out["idle_recall"] = await idle_recall()

            # 3. contended: the same learning while the recall clients run
            stop = asyncio.Event()
            clients = asyncio.ensure_future(
                recall_clients(http, "recall-target", questions, args.clients, stop)
            )
            await asyncio.sleep(2)  # the clients are running
            contended = await learn(http, "learn-contended", items, counted())
            stop.set()
            during = await clients
            contended["recall"] = {
                "clients": args.clients,
                "requests": len(during),
                **latency_summary(during),
            }
            out["contended"] = contended
            # 4. idle recall again: the machine's drift over the run, a control
            out["idle_recall_after"] = await idle_recall()

    return out


def targets(out: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets, from a full run's figures."""
    idle_p95 = (out["idle_recall"]["p95_ms"] + out["idle_recall_after"]["p95_ms"]) / 2
    return {
        "learning_ratio_to_minimum": out["alone"]["ratio_to_minimum"],
        "learning_ratio_target": 1.3,
        "learning_ratio_met": out["alone"]["ratio_to_minimum"] <= 1.3,
        "calls": out["alone"]["extraction_calls"] + out["alone"]["consolidation_calls"],
        "recall_p95_ratio_during_learning": round(
            out["contended"]["recall"]["p95_ms"] / idle_p95, 3
        ),
        "recall_p95_ratio_target": 1.2,
        "recall_p95_ratio_met": out["contended"]["recall"]["p95_ms"] <= 1.2 * idle_p95,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=600, help="LoCoMo turns retained")
    parser.add_argument("--latency", type=float, default=1.0, help="seconds per model call")
    parser.add_argument("--concurrency", type=int, default=8, help="HEED_LLM_CONCURRENCY")
    parser.add_argument("--clients", type=int, default=8, help="recall clients")
    parser.add_argument("--seconds", type=float, default=20.0, help="idle recall phase")
    parser.add_argument("--fact-chars", type=int, default=60, help="turns this long state a fact")
    parser.add_argument(
        "--debounce", type=float, default=0.5, help="HEED_CONSOLIDATION_DEBOUNCE_SECONDS"
    )
    parser.add_argument("--name", default="learning_throughput", help="results file name")
    parser.add_argument(
        "--alone-only", action="store_true", help="measure the learning alone (a baseline)"
    )
    args = parser.parse_args()
    result = asyncio.run(run(args))
    if "idle_recall" in result:
        result["targets"] = targets(result)
    path = write_result(args.name, result)
    print(json.dumps({k: result[k] for k in ("alone", "targets") if k in result}, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
