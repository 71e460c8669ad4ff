"""Compare reranker options on LoCoMo, in-process (how the default reranker was chosen).

Retains each conversation of --data into its own bank of an in-process engine
(as locomo_recall.py does over HTTP), then for each option re-runs every
question of categories 1-4 and prints turn-level evidence recall@5/10/20.
Writes benchmarks/results/reranker_options.json.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path
from typing import Any

from _locomo import DEFAULT_DATA, load_conversations
from _server import write_result
from heed.memory import build_memory_engine
from heed.memory.models import RecallQuery, RetainItem
from heed.memory.recall.rerank import build_reranker
from heed.runtime import RequestContext, use_context
from heed.services import build_lanes
from heed.settings import Settings
from heed.storage import SqliteDatabase
from heed.storage.memory import SqlMemoryStore

SEMANTIC_ONLY = {"semantic": 1.0, "keyword": 0.0, "graph": 0.0, "temporal": 0.0}
KEYWORD_ONLY = {"semantic": 0.0, "keyword": 1.0, "graph": 0.0, "temporal": 0.0}
NO_GRAPH = {"semantic": 1.0, "keyword": 1.0, "graph": 0.0, "temporal": 0.0}
OPTIONS: list[tuple[str, str, dict[str, Any], dict[str, float] | None, float, int]] = [
    # (label, reranker, reranker kwargs, arm weights, neighbor boost, neighbor expansion)
    ("none (RRF order of the four arms)", "none", {}, None, 0.0, 0),
    (
        "overlap (RRF + 0.5 x share of query terms in the text)",
        "overlap",
        {"weight": 0.5},
        None,
        0.0,
        0,
    ),
    ("keyword arm alone", "blend", {"alpha": 0.0}, KEYWORD_ONLY, 0.0, 0),
    ("semantic arm alone", "blend", {"alpha": 1.0}, SEMANTIC_ONLY, 0.0, 0),
    *[(f"blend alpha {a}", "blend", {"alpha": a}, None, 0.0, 0) for a in (0.3, 0.4, 0.5, 0.6, 0.7)],
    ("blend alpha 0.5 + 0.2 x RRF", "blend", {"alpha": 0.5, "rrf_weight": 0.2}, None, 0.0, 0),
    ("blend alpha 0.5, semantic + keyword arms only", "blend", {"alpha": 0.5}, NO_GRAPH, 0.0, 0),
    *[
        (f"blend alpha 0.5 + neighbor boost {b}", "blend", {"alpha": 0.5}, None, b, 0)
        for b in (0.1, 0.2, 0.3, 0.5)
    ],
    *[
        (f"blend alpha {a} + neighbor boost 0.3", "blend", {"alpha": a}, None, 0.3, 0)
        for a in (0.4, 0.6)
    ],
    *[
        (
            f"{'DEFAULT: ' if x == 20 else ''}blend alpha 0.5 + neighbor boost 0.3"
            f" + neighbor expansion {x}",
            "blend",
            {"alpha": 0.5},
            None,
            0.3,
            x,
        )
        for x in (10, 20, 40)
    ],
]


async def run(data: Path) -> list[dict[str, Any]]:
    directory = Path(tempfile.mkdtemp(prefix="heed-rerank-"))
    settings = Settings(data_dir=directory)
    store = SqlMemoryStore(SqliteDatabase(directory / "heed.db"))
    store.migrate()
    engine = build_memory_engine(settings, store, build_lanes(settings))
    conversations = load_conversations(data)
    deps = engine.recall_deps
    default_weights = dict(deps.arm_weights)
    results = []
    with use_context(RequestContext()):
        banks = {}
        for conv in conversations:
            bank = await engine.put_bank(conv.sample_id, {})
            items = [
                RetainItem(
                    content=t.content(),
                    timestamp=t.timestamp,
                    metadata={"dia_id": t.dia_id},
                    document_id=f"session-{t.session}",
                )
                for t in conv.turns
            ]
            await engine.retain(bank, items)
            banks[conv.sample_id] = bank
        for label, name, kwargs, weights, boost, expand in OPTIONS:
            deps.reranker = build_reranker(name, **kwargs)
            deps.arm_weights = weights or default_weights
            deps.neighbor_weight, deps.neighbor_expand = boost, expand
            scores: dict[int, list[float]] = {5: [], 10: [], 20: []}
            for conv in conversations:
                for qa in conv.questions:
                    if qa["category"] > 4 or not qa.get("evidence"):
                        continue
                    out = await engine.recall(
                        banks[conv.sample_id], RecallQuery(query=qa["question"], max_tokens=100_000)
                    )
                    ranked = [h.unit.metadata.get("dia_id") for h in out.hits]
                    evidence = set(qa["evidence"])
                    for k, values in scores.items():
                        values.append(len(evidence & set(ranked[:k])) / len(evidence))
            row = {
                "option": label,
                **{f"recall@{k}": round(sum(v) / len(v), 3) for k, v in scores.items()},
            }
            print(row, flush=True)
            results.append(row)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data", type=Path, default=DEFAULT_DATA, help="LoCoMo JSON (default: %(default)s)"
    )
    parser.add_argument("--name", default="reranker_options", help="results file name")
    args = parser.parse_args()
    options = asyncio.run(run(args.data))
    print("wrote", write_result(args.name, {"data": str(args.data), "options": options}))


if __name__ == "__main__":
    main()
