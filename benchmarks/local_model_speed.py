"""Local model speed: first token and generation rate of the embedded model on this machine.

Loads the ``local`` provider (SmolLM2-135M-Instruct through llama-cpp-python from its F16
copy, the threads heed gives it; ``--model`` names another GGUF file to evaluate, run as
given) and streams replies to two prompts, each --runs times: a short question, and
a grounded question as heed sends it (eight dated memories before the question, the shape
of a reflect's or a bank-bound turn's prompt). Each run's prompt starts differently, so
llama.cpp cannot reuse the previous run's evaluated prompt. Prints and records, per prompt,
the time to the first token (prompt evaluation included) and the generation rate after
it, against the targets of a default model here: first token within 1 s, at least 15
tokens/s.

Writes ``benchmarks/results/local_model_speed.json`` (``local_model_speed_<file stem>.json``
with ``--model``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

from _server import percentile, write_result
from heed.llm import ChatMessage, TextDelta, Usage
from heed.llm.grounding import ANSWER_FROM_MEMORIES, grounded_question
from heed.llm.local import LocalProvider, default_threads, prefill_threads

NAMES = ["Mel", "Jon", "Gina", "Tim", "Ana", "Raj", "Lee", "Sam"]
MEMORIES = [
    f"- Caroline went to the LGBTQ support group on {day} May 2023 and met {name} there. "
    f"(2023-05-{day:02d})"
    for day, name in enumerate(NAMES, 1)
]
PROMPTS = {
    "short": [ChatMessage.user("What is the capital of France?")],
    "grounded": [
        ChatMessage.system(ANSWER_FROM_MEMORIES),
        ChatMessage.user(grounded_question(MEMORIES, "When did Caroline meet Gina?")),
    ],
}


def _unique(messages: list[ChatMessage], run: int) -> list[ChatMessage]:
    first = messages[0]
    marked = ChatMessage(role=first.role, content=f"[{run}] {first.content}")
    return [marked, *messages[1:]]


async def one(provider: LocalProvider, messages: list[ChatMessage], tokens: int) -> dict[str, Any]:
    started = time.perf_counter()
    first: float | None = None
    usage = Usage()
    text: list[str] = []
    async for event in provider.stream(messages, max_tokens=tokens, temperature=0.0):
        if isinstance(event, TextDelta):
            first = first or time.perf_counter()
            text.append(event.text)
        elif isinstance(event, Usage):
            usage = event
    ended = time.perf_counter()
    first = first or ended
    generated = max(0, usage.completion_tokens - 1)
    return {
        "first_token_s": first - started,
        "tokens_per_s": generated / (ended - first) if ended > first and generated else 0.0,
        "prompt_tokens": float(usage.prompt_tokens),
        "completion_tokens": float(usage.completion_tokens),
        "reply": "".join(text).strip(),
    }


async def measure(
    runs: int, tokens: int, model: str | None, prefill: int, cache_dir: Path | None
) -> dict[str, Any]:
    provider = LocalProvider(model=model, prefill_threads=prefill, cache_dir=cache_dir)
    loaded_at = time.perf_counter()
    await provider.load()
    load_s = time.perf_counter() - loaded_at
    threads = default_threads()
    report: dict[str, Any] = {
        "model": provider.model,
        "weights": provider.weights_path.name,
        "threads": threads,
        "prefill_threads": prefill or prefill_threads(threads),
        "prefill_threads_rule": "fixed" if prefill else "auto (load average)",
        "load_s": round(load_s, 2),
    }
    for name, messages in PROMPTS.items():
        await one(provider, _unique(messages, -1), 8)  # warm up (threads, allocations)
        # each run's prompt differs from its first token: llama.cpp reuses the evaluated
        # prefix of the previous prompt, which would hide the prompt's evaluation time
        samples = [await one(provider, _unique(messages, i), tokens) for i in range(runs)]
        firsts = [s["first_token_s"] for s in samples]
        rates = [s["tokens_per_s"] for s in samples]
        report[name] = {
            "prompt_tokens": int(samples[0]["prompt_tokens"]),
            "first_token_s": {
                "p50": round(percentile(firsts, 50), 3),
                "max": round(max(firsts), 3),
            },
            "tokens_per_s": {
                "mean": round(statistics.fmean(rates), 1),
                "min": round(min(rates), 1),
            },
            "sample_reply": samples[0]["reply"][:200],
        }
        print(
            f"{name:>8} ({samples[0]['prompt_tokens']:.0f} prompt tokens): first token "
            f"p50 {percentile(firsts, 50):.2f} s, {statistics.fmean(rates):.1f} tokens/s"
        )
    await provider.aclose()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="replies per prompt (default 5)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per reply (default 64)")
    parser.add_argument(
        "--model", help="a .gguf file to evaluate instead of the packaged SmolLM2 (run as given)"
    )
    parser.add_argument(
        "--prefill-threads",
        type=int,
        default=0,
        help="threads for prompt evaluation (default 0: heed's rule, from the load average)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        help="model cache for the F16 copy (default: heed's, ~/.cache/heed/models)",
    )
    args = parser.parse_args()
    report = asyncio.run(
        measure(args.runs, args.tokens, args.model, args.prefill_threads, args.cache_dir)
    )
    grounded = report["grounded"]
    report["targets"] = {"first_token_s": 1.0, "tokens_per_s": 15}
    report["meets_targets"] = (
        grounded["first_token_s"]["p50"] <= 1.0 and grounded["tokens_per_s"]["mean"] >= 15
    )
    name = "local_model_speed" if not args.model else f"local_model_speed_{Path(args.model).stem}"
    path = write_result(name, report)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
