"""Realistic conversational units for benchmark banks: recombined LoCoMo turns.

Each synthetic turn is a speaker name followed by one to three sentences drawn
from real LoCoMo turns (deterministic for a seed), grouped into sessions of 20
turns with a session date. Queries are the LoCoMo questions.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from _locomo import DEFAULT_DATA, load_conversations

__all__ = ["queries", "synthetic_sessions"]

_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_EXTRA_NAMES = [
    "Alex", "Jordan", "Priya", "Mateo", "Yuki", "Amara", "Liam", "Sofia", "Noah", "Chen",
    "Fatima", "Lucas", "Zoe", "Omar", "Hannah", "Ivan", "Leila", "Diego", "Nina", "Kwame",
]  # fmt: skip


def _pools() -> tuple[list[str], list[str]]:
    sentences: list[str] = []
    speakers: set[str] = set(_EXTRA_NAMES)
    for conv in load_conversations(DEFAULT_DATA):
        for turn in conv.turns:
            speakers.add(turn.speaker)
            sentences.extend(s for s in _SENTENCE.split(turn.text) if len(s) > 12)
    return sentences, sorted(speakers)


def synthetic_sessions(
    n_units: int, seed: int = 7, per_session: int = 20
) -> Iterator[list[dict[str, Any]]]:
    """Sessions (lists of retain items) totalling *n_units* turns."""
    rng = random.Random(seed)
    sentences, speakers = _pools()
    start = datetime(2022, 1, 1, tzinfo=UTC)
    made = 0
    session = 0
    while made < n_units:
        session += 1
        pair = rng.sample(speakers, 2)
        when = start + timedelta(days=rng.randrange(0, 900), minutes=rng.randrange(0, 1440))
        items = []
        for i in range(min(per_session, n_units - made)):
            text = " ".join(rng.choice(sentences) for _ in range(rng.choice((1, 1, 2, 2, 3))))
            items.append(
                {
                    "content": f"{pair[i % 2]}: {text}",
                    "timestamp": when.isoformat(),
                    "document_id": f"s{seed}-{session}",
                    "metadata": {"turn": str(made + i)},
                }
            )
        made += len(items)
        yield items


def queries() -> list[str]:
    """The LoCoMo questions of categories 1-4."""
    return [
        qa["question"]
        for conv in load_conversations(DEFAULT_DATA)
        for qa in conv.questions
        if qa["category"] in (1, 2, 3, 4)
    ]
