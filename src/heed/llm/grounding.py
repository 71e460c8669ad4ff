"""Prompts that hand a model the memories to answer from, and how to tell it did not.

Both agents that answer from a memory bank use them: a chat turn of a bank-bound session
(:mod:`heed.sessions.turn`) puts the memories it recalled next to the user's question, and
reflect (:mod:`heed.reflect.agent`) falls back to one such generation when its model could
not use the tools. Small models (the embedded SmolLM2-135M) answer far more often when
the memories sit right before the question than when they are in the system prompt.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

__all__ = [
    "ANSWER_FROM_MEMORIES",
    "MEMORIES_HEADING",
    "grounded_question",
    "is_a_refusal",
    "split_question",
]

#: The system prompt of a generation that must answer from the memories it is given.
ANSWER_FROM_MEMORIES: Final = "Answer the question in one short sentence, using only the memories."
#: The line that introduces the memories in the question (tests and scripts match on it).
MEMORIES_HEADING: Final = "Memories that may help, with their dates:"

_REFUSAL = re.compile(
    r"\b(?:could ?n[o']t|can ?n[o']t|cannot|unable to|did ?n[o']t|do ?n[o']t|does ?n[o']t)\s+"
    r"(?:find|know|see|determine|tell|say|mention|contain|have)\b"
    r"|\bno (?:information|answer|mention|memories|record|details)\b"
    r"|\bnot (?:mentioned|provided|available|found|specified|stated|known)\b",
    re.IGNORECASE,
)


#: "..., and where ...", "... and when ...": where a second question starts inside one.
_SECOND_QUESTION = re.compile(
    r"\s*(?:,\s*|\s+)(?:and|also)\s+(?=(?:what|where|when|who|whom|whose|which|why|how|"
    r"does|do|did|is|are|was|were|has|have|can)\b)",
    re.IGNORECASE,
)
_SENTENCE_END = re.compile(r"(?<=\?)\s+")


def split_question(question: str) -> list[str]:
    """The questions inside *question*, each ending in "?": "What is the name of Alice's cat
    and where does she work?" is two. A small model answers one of two parts; asked them one
    by one, it answers both. A question with one part comes back unchanged."""
    parts: list[str] = []
    for sentence in _SENTENCE_END.split(question.strip()):
        for piece in _SECOND_QUESTION.split(sentence):
            piece = piece.strip(" ,")
            if piece:
                parts.append(piece if piece.endswith("?") else piece.rstrip(".") + "?")
    if len(parts) <= 1:
        return [question.strip()]
    return [p[0].upper() + p[1:] for p in parts]


def grounded_question(memories: Sequence[str], question: str) -> str:
    """The user message that hands the model *memories* (prompt lines, best first) and
    *question*. The lines go in reverse, the best last, right before the question: a small
    model leans on the line nearest the question (SmolLM2-135M answered "What is Alice
    allergic to?" with her cat's name when the cat came last)."""
    lines = "\n".join(reversed(memories))
    return f"{MEMORIES_HEADING}\n{lines}\n\nQuestion: {question}"


def is_a_refusal(text: str) -> bool:
    """Does the answer say the memories hold none ("I could not find...", "not mentioned")?"""
    return bool(_REFUSAL.search(text))
