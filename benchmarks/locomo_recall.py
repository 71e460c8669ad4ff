"""LoCoMo turn-level evidence recall through the HTTP API, all dev and leave-one-out.

Retains each conversation into its own bank (one document per session, one item per turn,
the session date as timestamp and the turn's ``dia_id`` in metadata), then asks every
question of categories 1-4 (``max_tokens`` 100,000, ``query_timestamp`` the conversation's
last session: a question is asked after the conversation) once per point of a grid of the
ranking's weights, set through each bank's settings (``PATCH .../config``:
``recall_semantic_weight``, ``recall_speaker_weight``, ``recall_temporal_weight``;
:mod:`heed.memory.recall.ranking`). Reported:

- ``all_dev``: every question at the server's shipped defaults (no bank setting), with
  the keyword (BM25) arm and the semantic (vector) arm alone from the same run's trace,
  and recall latency;
- ``cross_validated`` (the figure that counts): for each conversation, the grid point with
  the best recall@10 over the other four conversations' questions, measured on the held-out
  one; the five folds' figures averaged (``overall`` and ``per_category``; ``pooled`` is the
  same held-out answers averaged over questions instead of folds);
- ``all_dev_choice``: the grid point best on all five conversations, which the shipped
  defaults are meant to be (``defaults_match``);
- per ranking: turn-level evidence recall@5/10/20 (|evidence & dia_ids of the top k| /
  |evidence|, averaged over questions), overall and per category, and session-level Hit@1
  and NDCG@5: the sessions of the ranked turns in order of first appearance, relevant when
  they hold an evidence turn (binary gain; comparable with arXiv 2606.04194's session
  retrieval, whose systems rank sessions directly);
- ``failure_causes``: every evidence turn missing from the top 10 at the defaults, counted by
  its first cause in this order: ranked 11-20; spoken by someone other than the one speaker
  the question names; sharing a query word only through its image caption; an open-domain
  question sharing no word with it; sharing no query word (vocabulary); a list question (4+
  evidence turns); ranked past 20 though sharing words. Words are compared by their first
  five letters, stop words and the question's entity names left out.

The data is read from ../shared (CC BY-NC 4.0); it is never copied here.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from _locomo import DEFAULT_DATA, Conversation, Turn, load_conversations, retain_conversation
from _server import percentile, serve, write_result
from heed.memory.recall.query import keyword_terms
from heed.memory.recall.ranking import DEFAULT_WEIGHTS, WEIGHT_SETTINGS

KS = (5, 10, 20)
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
#: The grid of ranking weights each fold chooses from (the shipped defaults among them).
GRID: dict[str, tuple[float, ...]] = {
    "recall_semantic_weight": (0.5, 0.6, 0.7),
    "recall_speaker_weight": (0.1, 0.2, 0.3, 0.5),
    "recall_temporal_weight": (0.1, 0.2),
}
TARGETS = {
    "recall@10": 0.90,
    "multi-hop recall@10": 0.65,
    "open-domain recall@10": 0.65,
    "temporal recall@10": 0.90,
    "single-hop recall@10": 0.90,
    "session hit@1": 0.80,
}


def _session(dia_id: str) -> str:
    return dia_id.split(":", 1)[0]


def score_question(ranked: list[str | None], evidence: set[str]) -> dict[str, float]:
    """Turn recall@k and session Hit@1 / NDCG@5 of one ranking (dia_ids, best first)."""
    out = {f"recall@{k}": len(evidence & {r for r in ranked[:k] if r}) / len(evidence) for k in KS}
    sessions = list(dict.fromkeys(_session(r) for r in ranked if r))
    relevant = {_session(e) for e in evidence}
    out["hit@1"] = float(bool(sessions) and sessions[0] in relevant)
    dcg = sum(1 / math.log2(i + 2) for i, s in enumerate(sessions[:5]) if s in relevant)
    ideal = sum(1 / math.log2(i + 2) for i in range(min(5, len(relevant))))
    out["ndcg@5"] = dcg / ideal
    return out


def aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Means of the rows' scores: overall, per category, session level."""

    def mean(rs: list[dict[str, Any]], key: str) -> float:
        return round(sum(r[key] for r in rs) / len(rs), 4) if rs else float("nan")

    return {
        "questions": len(rows),
        "overall": {f"recall@{k}": mean(rows, f"recall@{k}") for k in KS},
        "per_category": {
            name: {
                "questions": len(rs),
                **{f"recall@{k}": mean(rs, f"recall@{k}") for k in KS},
            }
            for c, name in CATEGORIES.items()
            for rs in [[r for r in rows if r["category"] == c]]
        },
        "session": {"hit@1": mean(rows, "hit@1"), "ndcg@5": mean(rows, "ndcg@5")},
    }


def fold_average(folds: list[dict[str, Any]]) -> dict[str, Any]:
    """The folds' aggregates averaged (a category absent from a fold is left out there)."""

    def avg(values: list[float]) -> float:
        kept = [v for v in values if not math.isnan(v)]
        return round(sum(kept) / len(kept), 4) if kept else float("nan")

    return {
        "overall": {f"recall@{k}": avg([f["overall"][f"recall@{k}"] for f in folds]) for k in KS},
        "per_category": {
            name: {
                f"recall@{k}": avg([f["per_category"][name][f"recall@{k}"] for f in folds])
                for k in KS
            }
            for name in CATEGORIES.values()
        },
        "session": {key: avg([f["session"][key] for f in folds]) for key in ("hit@1", "ndcg@5")},
    }


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
            out[item["id"]] = str((item.get("metadata") or {}).get("dia_id"))
        offset += len(page["items"])
        if not page["items"] or offset >= page["total"]:
            return out


async def ask_all(
    http: httpx.AsyncClient,
    conversations: list[Conversation],
    settings: dict[str, float] | None,
    *,
    trace: bool = False,
) -> tuple[dict[str, list[dict[str, Any]]], list[float]]:
    """Every scored question of every conversation, on banks set to *settings* (``None``:
    reset to the server's defaults). Returns per ranking (``final``, and with *trace* the
    ``keyword`` and ``semantic`` arms) one scored row per question, and the latencies."""
    rows: dict[str, list[dict[str, Any]]] = {"final": [], "keyword": [], "semantic": []}
    latencies: list[float] = []
    causes: list[tuple[str, int]] = []
    for conv in conversations:
        turns = {t.dia_id: t for t in conv.turns}
        speakers = list(dict.fromkeys(t.speaker for t in conv.turns))
        bank = conv.sample_id
        if settings is None:
            response = await http.delete(f"/v1/default/banks/{bank}/config")
        else:
            response = await http.patch(
                f"/v1/default/banks/{bank}/config", json={"updates": settings}
            )
        response.raise_for_status()
        dia = await _dia_ids(http, bank) if trace else {}
        asked_at = max(t.timestamp for t in conv.turns).isoformat()
        for qa in conv.questions:
            if qa["category"] not in CATEGORIES or not qa.get("evidence"):
                continue
            evidence = set(qa["evidence"])
            t0 = time.perf_counter()
            response = await http.post(
                f"/v1/default/banks/{bank}/memories/recall",
                json={
                    "query": qa["question"],
                    "max_tokens": 100_000,
                    "query_timestamp": asked_at,
                    "trace": trace,
                },
            )
            latencies.append(time.perf_counter() - t0)
            response.raise_for_status()
            body = response.json()
            rankings = {"final": [(r.get("metadata") or {}).get("dia_id") for r in body["results"]]}
            if trace:
                weights = body["trace"]["query"]["weights"]
                if settings is not None:
                    for name, value in settings.items():
                        assert weights[WEIGHT_SETTINGS[name][0]] == value, (weights, settings)
                arms = body["trace"]["arms"]
                rankings["keyword"] = [dia.get(i) for i in arms.get("keyword", [])]
                rankings["semantic"] = [dia.get(i) for i in arms.get("semantic", [])]
                final = rankings["final"]
                for dia_id in evidence - set(final[:10]):
                    rank = final.index(dia_id) + 1 if dia_id in final else None
                    cause = failure_cause(
                        turns.get(dia_id),
                        rank,
                        qa["category"],
                        len(evidence),
                        body["trace"]["query"]["terms"],
                        body["trace"]["query"]["entities"],
                        speakers,
                    )
                    causes.append((cause, qa["category"]))
            for ranking, ranked in rankings.items():
                rows[ranking].append(
                    {
                        "conversation": bank,
                        "category": qa["category"],
                        **score_question(ranked, evidence),
                    }
                )
    out = {k: v for k, v in rows.items() if v}
    if trace:
        out["causes"] = [{"cause": c, "category": cat} for c, cat in causes]
    return out, latencies


_CAPTION = re.compile(r"\[shares a photo: (.*)\]")
CAUSES = (
    "ranked 11-20",
    "spoken by another than the person asked about",
    "query words only in its image caption",
    "open-domain inference, no shared word",
    "no query word in the turn (vocabulary)",
    "list question, 4+ evidence turns",
    "ranked past 20, shares query words",
    "evidence turn not in the data",
)


def _stems(text: str) -> set[str]:
    return {w[:5] for w in keyword_terms(text, limit=512)}


def failure_cause(
    turn: Turn | None,
    rank: int | None,
    category: int,
    evidence: int,
    terms: list[str],
    entities: list[str],
    speakers: list[str],
) -> str:
    """The first cause (:data:`CAUSES`, in order) of an evidence turn outside the top 10."""
    if turn is None:
        return CAUSES[7]
    if rank is not None and rank <= 20:
        return CAUSES[0]
    named = [s for s in speakers if s.lower() in entities]
    if len(named) == 1 and turn.speaker != named[0]:
        return CAUSES[1]
    asked = {t[:5] for t in terms if t not in entities}
    caption = _CAPTION.search(turn.text)
    own = _stems(_CAPTION.sub(" ", turn.text))
    if not asked & own:
        if caption is not None and asked & _stems(caption.group(1)):
            return CAUSES[2]
        return CAUSES[3] if category == 3 else CAUSES[4]
    return CAUSES[5] if evidence >= 4 else CAUSES[6]


def _mean_recall10(rows: list[dict[str, Any]]) -> float:
    return float(sum(r["recall@10"] for r in rows)) / len(rows)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    conversations = load_conversations(args.data)
    data_dir = Path(tempfile.mkdtemp(prefix="heed-locomo-"))
    env = {"HEED_RERANKER": args.reranker} if args.reranker else {}
    names = list(GRID)
    grid = [dict(zip(names, values, strict=True)) for values in itertools.product(*GRID.values())]
    if args.quick:
        grid = []
    with serve(data_dir, env) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
            started = time.perf_counter()
            units = 0
            for conv in conversations:
                units += await retain_conversation(http, conv.sample_id, conv)
            retain_seconds = time.perf_counter() - started
            load_before = os.getloadavg()[0]
            default_rows, latencies = await ask_all(http, conversations, None, trace=True)
            load_after = os.getloadavg()[0]
            by_point: list[tuple[dict[str, float], list[dict[str, Any]]]] = []
            for i, point in enumerate(grid, 1):
                point_rows, _ = await ask_all(http, conversations, point)
                by_point.append((point, point_rows["final"]))
                print(
                    f"grid {i}/{len(grid)} {point}: recall@10 "
                    f"{_mean_recall10(point_rows['final']):.4f}",
                    flush=True,
                )
    result: dict[str, Any] = {
        "data": str(args.data),
        "reranker": args.reranker or "default",
        "conversations": len(conversations),
        "units": units,
        "questions": len(default_rows["final"]),
        "retain_seconds": round(retain_seconds, 2),
        "query_timestamp": "each conversation's last session date and time",
        "recall_latency_ms": {
            "p50": round(percentile(latencies, 50) * 1000, 2),
            "p95": round(percentile(latencies, 95) * 1000, 2),
            "load_average_1m": [round(load_before, 2), round(load_after, 2)],
        },
        "shipped_defaults": {
            name: getattr(DEFAULT_WEIGHTS, field) for name, (field, _, _) in WEIGHT_SETTINGS.items()
        },
        "targets": TARGETS,
        "all_dev": {
            ranking: aggregate(rows)
            for ranking, rows in default_rows.items()
            if ranking != "causes"
        },
        "failure_causes": {
            cause: {
                "turns": sum(1 for c in default_rows["causes"] if c["cause"] == cause),
                **{
                    name: sum(
                        1
                        for c in default_rows["causes"]
                        if c["cause"] == cause and c["category"] == cat
                    )
                    for cat, name in CATEGORIES.items()
                },
            }
            for cause in CAUSES
        },
    }
    if by_point:
        folds = []
        held: list[dict[str, Any]] = []
        for held_out in [c.sample_id for c in conversations]:
            point, rows = max(
                by_point,
                key=lambda pr: _mean_recall10([r for r in pr[1] if r["conversation"] != held_out]),
            )
            mine = [r for r in rows if r["conversation"] == held_out]
            held.extend(mine)
            folds.append({"held_out": held_out, "chosen": point, **aggregate(mine)})
        best_point, best_rows = max(by_point, key=lambda pr: _mean_recall10(pr[1]))
        result["cross_validated"] = {
            **fold_average(folds),
            "pooled": aggregate(held),
            "folds": folds,
        }
        result["all_dev_choice"] = {
            "settings": best_point,
            "recall@10": round(_mean_recall10(best_rows), 4),
            "defaults_match": best_point == result["shipped_defaults"],
        }
        result["grid"] = [
            {**point, "recall@10": round(_mean_recall10(rows), 4)} for point, rows in by_point
        ]
    return result


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
    parser.add_argument(
        "--quick", action="store_true", help="the shipped defaults only (no grid, no folds)"
    )
    parser.add_argument("--name", default="locomo_recall", help="results file name (without .json)")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    for ranking, figures in result["all_dev"].items():
        overall = figures["overall"]
        print(f"{ranking:>8}: " + "  ".join(f"{k} {v:.3f}" for k, v in overall.items()))
    for category, values in result["all_dev"]["final"]["per_category"].items():
        print(
            f"  all dev {category:>12} (n={values['questions']}): "
            f"recall@10 {values['recall@10']:.3f}"
        )
    session = result["all_dev"]["final"]["session"]
    print(f"  all dev session hit@1 {session['hit@1']:.3f} ndcg@5 {session['ndcg@5']:.3f}")
    if "cross_validated" in result:
        cv = result["cross_validated"]
        print(
            "cross-validated: "
            + "  ".join(f"{k} {v:.3f}" for k, v in cv["overall"].items())
            + f"  session hit@1 {cv['session']['hit@1']:.3f} ndcg@5 {cv['session']['ndcg@5']:.3f}"
        )
        for category, values in cv["per_category"].items():
            print(f"  cross-validated {category:>12}: recall@10 {values['recall@10']:.3f}")
        print("all-dev choice:", result["all_dev_choice"])
    latency = result["recall_latency_ms"]
    print(f"recall latency p50 {latency['p50']} ms, p95 {latency['p95']} ms")
    print("wrote", write_result(args.name, result))


if __name__ == "__main__":
    main()
