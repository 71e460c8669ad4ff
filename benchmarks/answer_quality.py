"""Answer quality: reflect on the LoCoMo development split, scored against the gold answers.

Retains each conversation of ../shared/data/locomo (CC BY-NC 4.0, never copied here) into
its own bank of a ``heed serve`` subprocess, reflects on its questions of categories 1-4
(``budget: low``), and scores each answer against the gold one:

- **token F1** as in the LoCoMo paper: answer and gold lower-cased, punctuation and the
  articles a/an/the removed, split on white space; for multi-hop questions (category 1)
  the gold is split at commas and the F1 of each part averaged; for open-domain ones
  (category 3) only the gold before a ";" counts. (The paper also stems with Porter; this
  does not, so its figures are a little lower than a stemmed score would be.)
- **key-token recall**: the share of the gold's key tokens (its tokens minus stop words)
  found in the answer, and the share of questions where all of them are.

Per category and overall, with the provider and model named, seconds per reflect, and how
often the answer says it found nothing. The server's LLM is what the environment says
(no setting: the embedded SmolLM2-135M); ``--scripted`` runs the scripted provider's echo
as a floor. An OpenAI-compatible server is measured with its settings in the
environment, e.g. ``HEED_LLM_PROVIDER=openai HEED_LLM_BASE_URL=http://127.0.0.1:11434/v1
HEED_LLM_MODEL=qwen2.5:7b .venv/bin/python benchmarks/answer_quality.py``.

Writes ``benchmarks/results/answer_quality_<provider>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import string
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx

from _locomo import DEFAULT_DATA, load_conversations, retain_conversation
from _server import percentile, serve, write_result
from heed.llm.grounding import is_a_refusal

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
STOP_WORDS = frozenset(
    (  # noqa: SIM905 - a word list reads best as words
        "a an the and or of to in on at for by with from is are was were be been it its this "
        "that he she they them his her their i you we my your our as not no do does did has "
        "have had what when where who which how why"
    ).split()
)


def normalize(text: str) -> list[str]:
    """LoCoMo's normalisation: lower case, no punctuation, no articles, split on spaces."""
    text = str(text).lower().replace(",", " ")
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return text.split()


def f1(prediction: str, gold: str) -> float:
    predicted, expected = normalize(prediction), normalize(gold)
    common = Counter(predicted) & Counter(expected)
    same = sum(common.values())
    if not predicted or not expected or same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(expected)
    return 2 * precision * recall / (precision + recall)


def locomo_f1(prediction: str, gold: str, category: int) -> float:
    if category == 3:
        gold = gold.split(";")[0]
    if category == 1:
        parts = [p for p in gold.split(",") if p.strip()] or [gold]
        return statistics.fmean(f1(prediction, part) for part in parts)
    return f1(prediction, gold)


def key_token_recall(prediction: str, gold: str) -> float:
    keys = {t for t in normalize(gold) if t not in STOP_WORDS}
    if not keys:
        return 1.0
    return len(keys & set(normalize(prediction))) / len(keys)


async def measure(args: argparse.Namespace, url: str) -> dict[str, Any]:
    conversations = load_conversations(args.data)
    scores: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    seconds: list[float] = []
    examples: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        started = time.perf_counter()
        for conv in conversations:
            await retain_conversation(http, conv.sample_id, conv)
        retain_seconds = time.perf_counter() - started
        info = (await http.get("/version")).json()
        taken: Counter[int] = Counter()
        for conv in conversations:
            for qa in conv.questions:
                category = qa["category"]
                if category not in CATEGORIES or "answer" not in qa:
                    continue
                if args.limit and taken[category] >= args.limit:
                    continue
                taken[category] += 1
                t0 = time.perf_counter()
                response = await http.post(
                    f"/v1/default/banks/{conv.sample_id}/reflect",
                    json={"query": qa["question"], "budget": "low"},
                )
                seconds.append(time.perf_counter() - t0)
                response.raise_for_status()
                answer, gold = str(response.json()["text"]), str(qa["answer"])
                keys = key_token_recall(answer, gold)
                by = scores[category]
                by["f1"].append(locomo_f1(answer, gold, category))
                by["key_recall"].append(keys)
                by["all_keys"].append(1.0 if keys == 1.0 else 0.0)
                by["not_found"].append(1.0 if is_a_refusal(answer) else 0.0)
                if len(examples) < 12 and taken[category] <= 3:
                    examples.append({"q": qa["question"], "gold": gold, "answer": answer})
                done = sum(taken.values())
                if done % 25 == 0:
                    print(f"  {done} questions, {statistics.fmean(seconds):.1f} s each")
    per_category = {
        CATEGORIES[c]: {
            "questions": len(v["f1"]),
            **{k: round(statistics.fmean(x), 4) for k, x in v.items()},
        }
        for c, v in sorted(scores.items())
    }
    every = {
        k: [x for v in scores.values() for x in v[k]]
        for k in ("f1", "key_recall", "all_keys", "not_found")
    }
    return {
        "provider": os.environ.get("HEED_LLM_PROVIDER", "local")
        if not args.scripted
        else "scripted",
        "model": os.environ.get("HEED_LLM_MODEL")
        or ("scripted echo" if args.scripted else "smollm2-135m-instruct"),
        "server_version": info.get("version"),
        "questions": len(every["f1"]),
        "limit_per_category": args.limit or None,
        "retain_seconds": round(retain_seconds, 1),
        "seconds_per_reflect": {
            "p50": round(percentile(seconds, 50), 2),
            "p95": round(percentile(seconds, 95), 2),
        },
        "overall": {k: round(statistics.fmean(x), 4) for k, x in every.items()},
        "per_category": per_category,
        "examples": examples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo JSON")
    parser.add_argument("--scripted", action="store_true", help="the scripted echo (a floor)")
    parser.add_argument(
        "--limit", type=int, default=0, help="questions per category (default 0: all of them)"
    )
    args = parser.parse_args()
    env = {"HEED_LLM_PROVIDER": "scripted", "HEED_LLM_SCRIPT": ""} if args.scripted else {}
    with tempfile.TemporaryDirectory() as data_dir, serve(data_dir, env) as server:
        result = asyncio.run(measure(args, server.url))
    overall = result["overall"]
    print(
        f"{result['provider']} / {result['model']}: {result['questions']} questions, "
        f"F1 {overall['f1']:.3f}, key-token recall {overall['key_recall']:.3f}, "
        f"all key tokens {overall['all_keys']:.3f}, 'not found' {overall['not_found']:.3f}"
    )
    for name, values in result["per_category"].items():
        print(f"  {name:>12} (n={values['questions']}): F1 {values['f1']:.3f}")
    path = write_result(f"answer_quality_{result['provider']}", result)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
