"""LoCoMo turn-level evidence recall through the HTTP API.

Retains each conversation into its own bank (one document per session, one
item per turn, the session date as timestamp and the turn's ``dia_id`` in
metadata), asks every question of categories 1-4 with ``trace: true``, and
scores turn-level evidence recall@5/10/20 per category for the final ranking
and, from the same run's trace, for the keyword (BM25) arm alone and the
semantic (vector) arm alone. Target: recall@10 >= 0.70 (BM25 alone: 0.59).

The data is read from ../shared (CC BY-NC 4.0); it is never copied here.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from _locomo import DEFAULT_DATA, load_conversations, retain_conversation
from _server import percentile, serve, write_result

KS = (5, 10, 20)
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}


def _recall_at(ranked: list[str | None], evidence: set[str], k: int) -> float:
    return len(evidence & {r for r in ranked[:k] if r}) / len(evidence)


async def _dia_ids(http: httpx.AsyncClient, bank: str) -> dict[str, str]:
    out: dict[str, str] = {}
    offset = 0
    while True:
        page = (
            await http.get(
                f"/v1/default/banks/{bank}/memories/list", params={"limit": 1000, "offset": offset}
            )
        ).json()
        for item in page["items"]:
            out[item["id"]] = (item.get("metadata") or {}).get("dia_id")
        offset += len(page["items"])
        if not page["items"] or offset >= page["total"]:
            return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    conversations = load_conversations(args.data)
    data_dir = Path(tempfile.mkdtemp(prefix="heed-locomo-"))
    env = {"HEED_RERANKER": args.reranker} if args.reranker else {}
    scores: dict[str, dict[int, dict[int, list[float]]]] = {
        ranking: {c: {k: [] for k in KS} for c in CATEGORIES}
        for ranking in ("final", "keyword", "semantic")
    }
    latencies: list[float] = []
    with serve(data_dir, env) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
            started = time.perf_counter()
            units = 0
            for conv in conversations:
                units += await retain_conversation(http, conv.sample_id, conv)
            retain_seconds = time.perf_counter() - started
            for conv in conversations:
                dia = await _dia_ids(http, conv.sample_id)
                for qa in conv.questions:
                    if qa["category"] not in CATEGORIES or not qa.get("evidence"):
                        continue
                    evidence = set(qa["evidence"])
                    t0 = time.perf_counter()
                    response = await http.post(
                        f"/v1/default/banks/{conv.sample_id}/memories/recall",
                        json={"query": qa["question"], "max_tokens": 100_000, "trace": True},
                    )
                    latencies.append(time.perf_counter() - t0)
                    response.raise_for_status()
                    body = response.json()
                    rankings = {
                        "final": [(r.get("metadata") or {}).get("dia_id") for r in body["results"]],
                        "keyword": [dia.get(i) for i in body["trace"]["arms"].get("keyword", [])],
                        "semantic": [dia.get(i) for i in body["trace"]["arms"].get("semantic", [])],
                    }
                    for ranking, ranked in rankings.items():
                        for k in KS:
                            scores[ranking][qa["category"]][k].append(
                                _recall_at(ranked, evidence, k)
                            )
    summary: dict[str, Any] = {}
    for ranking, by_cat in scores.items():
        overall = {
            f"recall@{k}": round(
                sum(sum(v[k]) for v in by_cat.values()) / sum(len(v[k]) for v in by_cat.values()), 4
            )
            for k in KS
        }
        per_category = {
            CATEGORIES[c]: {
                "questions": len(v[KS[0]]),
                **{f"recall@{k}": round(sum(v[k]) / max(1, len(v[k])), 4) for k in KS},
            }
            for c, v in by_cat.items()
        }
        summary[ranking] = {"overall": overall, "per_category": per_category}
    return {
        "data": str(args.data),
        "reranker": args.reranker or "default",
        "conversations": len(conversations),
        "units": units,
        "questions": len(latencies),
        "retain_seconds": round(retain_seconds, 2),
        "recall_latency_ms": {
            "p50": round(percentile(latencies, 50) * 1000, 2),
            "p95": round(percentile(latencies, 95) * 1000, 2),
        },
        "target": {"final recall@10": 0.70, "reference bm25 recall@10": 0.588},
        **summary,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data", type=Path, default=DEFAULT_DATA, help="LoCoMo JSON (default: %(default)s)"
    )
    parser.add_argument(
        "--reranker", default=None, help="HEED_RERANKER for the server (default: its default)"
    )
    parser.add_argument("--name", default="locomo_recall", help="results file name (without .json)")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    for ranking in ("final", "keyword", "semantic"):
        overall = result[ranking]["overall"]
        print(f"{ranking:>8}: " + "  ".join(f"{k} {v:.3f}" for k, v in overall.items()))
    for category, values in result["final"]["per_category"].items():
        print(
            f"  final {category:>12} (n={values['questions']}): recall@10 {values['recall@10']:.3f}"
        )
    latency = result["recall_latency_ms"]
    print(f"recall latency p50 {latency['p50']} ms, p95 {latency['p95']} ms")
    print("wrote", write_result(args.name, result))


if __name__ == "__main__":
    main()
