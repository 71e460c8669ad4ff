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
    "MAX_PARTS",
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


#: Words that open a question: "... and *where* does she work?" starts a second one.
_QUESTION_WORDS = frozenset(
    {"what", "where", "when", "who", "whom", "whose", "which", "why", "how"}
    | {"does", "do", "did", "is", "are", "was", "were", "has", "have", "can"}
)
_JOINERS = frozenset({"and", "also"})
#: More parts than this and the text is taken as one question: each part costs a recall
#: and a generation, and a message must not multiply its own cost.
MAX_PARTS: Final = 4


def split_question(question: str) -> list[str]:
    """The questions inside *question*, each ending in "?": "What is the name of Alice's cat
    and where does she work?" is two. A small model answers one of two parts; asked them one
    by one, it answers both. A question with one part, or more than :data:`MAX_PARTS`,
    comes back unchanged.

    Linear in the text's length (it is the user's, up to 200,000 characters): a scan over
    its words, no regular expression that could backtrack.
    """
    parts: list[list[str]] = [[]]
    words = question.split()
    for index, word in enumerate(words):
        following = words[index + 1].strip("\"'(").lower() if index + 1 < len(words) else ""
        if word.lower() in _JOINERS and parts[-1] and following in _QUESTION_WORDS:
            parts.append([])  # "and" before a question word: a new question starts
            continue
        parts[-1].append(word)
        if word.endswith("?") and index + 1 < len(words):
            parts.append([])
    pieces = [" ".join(p).strip(" ,") for p in parts if p]
    pieces = [p for p in pieces if p]
    if not 1 < len(pieces) <= MAX_PARTS:
        return [question.strip()]
    return [_as_question(p) for p in pieces]


def _as_question(piece: str) -> str:
    piece = piece if piece.endswith("?") else piece.rstrip(".,") + "?"
    return piece[0].upper() + piece[1:]


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
