"""Shared LoCoMo helpers for the benchmarks: load turns and questions, build retain items.

The data stays in ../shared/data/locomo/ (CC BY-NC 4.0, never committed here).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

DEFAULT_DATA = (
    Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo" / "locomo-dev.json"
)

__all__ = [
    "DEFAULT_DATA",
    "Conversation",
    "Turn",
    "load_conversations",
    "retain_conversation",
    "session_date",
]


@dataclass(frozen=True, slots=True)
class Turn:
    dia_id: str
    session: int
    speaker: str
    text: str
    timestamp: datetime

    def content(self) -> str:
        """The retained text of a turn: speaker and text (and an image caption)."""
        return f"{self.speaker}: {self.text}"


@dataclass(frozen=True, slots=True)
class Conversation:
    sample_id: str
    turns: list[Turn]
    questions: list[dict[str, Any]]


def session_date(raw: str) -> datetime:
    """'1:56 pm on 8 May, 2023' -> an aware datetime."""
    m = re.match(r"\s*(\d+):(\d+)\s*(am|pm)\s+on\s+(\d+)\s+(\w+),?\s+(\d{4})", raw, re.I)
    if not m:
        raise ValueError(f"unparsed LoCoMo date {raw!r}")
    hour, minute, ampm, day, month, year = m.groups()
    hour_i = int(hour) % 12 + (12 if ampm.lower() == "pm" else 0)
    parsed = datetime.strptime(f"{day} {month} {year}", "%d %B %Y")
    return parsed.replace(hour=hour_i, minute=int(minute), tzinfo=UTC)


def load_conversations(path: Path = DEFAULT_DATA) -> list[Conversation]:
    """Every conversation of the file with its turns (in order) and questions."""
    data = json.loads(Path(path).read_text())
    out: list[Conversation] = []
    for sample in data:
        conv = sample["conversation"]
        turns: list[Turn] = []
        n = 1
        while f"session_{n}" in conv:
            when = session_date(conv[f"session_{n}_date_time"])
            for turn in conv[f"session_{n}"]:
                text = turn["text"]
                if turn.get("blip_caption"):
                    text = f"{text} [shares a photo: {turn['blip_caption']}]"
                turns.append(Turn(turn["dia_id"], n, turn["speaker"], text, when))
            n += 1
        out.append(Conversation(sample["sample_id"], turns, sample["qa"]))
    return out


async def retain_conversation(
    http: httpx.AsyncClient, bank: str, conversation: Conversation
) -> int:
    """Create *bank* and retain the conversation into it over the HTTP API: one document per
    session, one item per turn, the session date as timestamp and the turn's ``dia_id`` in
    metadata. Returns the number of turns."""
    await http.put(f"/v1/default/banks/{bank}", json={"name": bank})
    sessions: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for turn in conversation.turns:
        sessions[turn.session].append(
            {
                "content": turn.content(),
                "timestamp": turn.timestamp.isoformat(),
                "metadata": {"dia_id": turn.dia_id},
                "document_id": f"session-{turn.session}",
            }
        )
    for items in sessions.values():
        response = await http.post(f"/v1/default/banks/{bank}/memories", json={"items": items})
        response.raise_for_status()
    return len(conversation.turns)
