"""Splitting an item into memory units and building the text each unit is indexed by.

- A dialogue turn ("Name: text", one line) is one unit whose speaker is Name.
- A transcript (several "Name: text" lines) gives one unit per turn.
- Other text gives one unit per group of sentences of at most ``max_chars``.

One unit per turn keeps evidence exact: a recalled unit points at the turn it
came from. The BM25 index text adds the speaker, the context and the date
(month names, year) so that "What did Caroline say in May?" can match, and the
text of the units within :data:`NEIGHBOUR_WINDOW` of it in its document
(:func:`neighbour_texts`): in a dialogue the answer often lacks the question's
words ("What's your favourite dish from the show?" / "Coconut milk ice cream is
at the top of my list"), so the answer turn is indexed with the question before
it, and the question with the answer after it.

Measured on LoCoMo (``benchmarks/locomo_recall.py``, turn-level recall@10; the
window was chosen on conversations 1-3 and checked on 4-5, and the recall
pipeline's neighbour boost, which this replaces, set to 0 the same way): 0.712
without neighbours; one on each side 0.760; two 0.786 (0.805 / 0.767 on the two
halves); three 0.775; four 0.775. Neighbours at half weight (a separate FTS
column) did worse than at full weight. Embeddings keep the unit's own text: with
its neighbours embedded too, recall fell to 0.74-0.75.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

__all__ = [
    "INDEX_CONTEXT_CHARS",
    "NEIGHBOUR_WINDOW",
    "UnitText",
    "index_text",
    "neighbour_gains",
    "neighbour_texts",
    "speaker_of",
    "split_units",
    "with_neighbours",
]

#: How many units on each side of a unit, in its document, join its BM25 text.
NEIGHBOUR_WINDOW: Final = 2
#: How much of an item's context joins each of its units' BM25 text (see :func:`index_text`).
INDEX_CONTEXT_CHARS: Final = 500

_SPEAKER = re.compile(r"^\s*(?P<speaker>[A-Z][\w .'-]{0,40}?)\s*:\s+(?P<text>\S.*)$")
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'“])")


@dataclass(frozen=True, slots=True)
class UnitText:
    """The text of one unit and the speaker it is attributed to, if any."""

    text: str
    speaker: str | None


def _turns(content: str) -> list[UnitText] | None:
    lines = [line for line in content.splitlines() if line.strip()]
    if not lines:
        return None
    matches = [_SPEAKER.match(line) for line in lines]
    if not all(matches):
        return None
    return [
        UnitText(
            f"{m.group('speaker').strip()}: {m.group('text').strip()}", m.group("speaker").strip()
        )
        for m in matches
        if m is not None
    ]


def _sentence_groups(content: str, max_chars: int) -> list[str]:
    groups: list[str] = []
    current = ""
    for paragraph in re.split(r"\n\s*\n", content):
        for sentence in _SENTENCE.split(" ".join(paragraph.split())):
            if not sentence:
                continue
            while len(sentence) > max_chars:  # one huge sentence: hard-wrap on spaces
                cut = sentence.rfind(" ", 0, max_chars)
                cut = cut if cut > max_chars // 2 else max_chars
                if current:
                    groups.append(current)
                    current = ""
                groups.append(sentence[:cut].strip())
                sentence = sentence[cut:].strip()
            if current and len(current) + 1 + len(sentence) > max_chars:
                groups.append(current)
                current = sentence
            else:
                current = f"{current} {sentence}".strip()
        if current:
            groups.append(current)
            current = ""
    return [g for g in groups if g]


def speaker_of(text: str) -> str | None:
    """The speaker of a unit's *text* when it is a dialogue turn ("Name: text"), else
    ``None``: the label :func:`split_units` attributes a turn to, read back from the text."""
    m = _SPEAKER.match(text)
    return m.group("speaker").strip() if m else None


def split_units(content: str, max_chars: int = 800) -> list[UnitText]:
    """The units of one item's content (never empty for non-blank content)."""
    turns = _turns(content)
    if turns is not None:
        return turns
    return [UnitText(text, None) for text in _sentence_groups(content, max_chars)]


def index_text(text: str, context: str | None, when: datetime | None) -> str:
    """What BM25 indexes for a unit: its text, its context and its date in words.

    The context is the item's, the same for each of its units, so at most its first
    :data:`INDEX_CONTEXT_CHARS` characters (cut at a space) join each: an item of 2,800
    turns with a 100 KB context indexed 280 MB of copies. A context is a short description
    ("trip to Japan"); what a longer one says past that stays in the unit's ``context``.
    """
    parts = [text]
    if context:
        if len(context) > INDEX_CONTEXT_CHARS:
            cut = context.rfind(" ", 0, INDEX_CONTEXT_CHARS + 1)
            context = context[: cut if cut > 0 else INDEX_CONTEXT_CHARS]
        parts.append(context)
    if when is not None:
        parts.append(when.strftime("%d %B %Y %A"))
    return "\n".join(parts)


def neighbour_texts(texts: Sequence[str], position: int) -> list[str]:
    """The texts within :data:`NEIGHBOUR_WINDOW` of ``texts[position]`` (a document's units,
    in order), nearest first, the unit's own text excluded."""
    out: list[str] = []
    for distance in range(1, NEIGHBOUR_WINDOW + 1):
        if position - distance >= 0:
            out.append(texts[position - distance])
        if position + distance < len(texts):
            out.append(texts[position + distance])
    return out


def neighbour_gains(
    stored: Sequence[str], added: Sequence[str]
) -> tuple[list[list[str]], list[list[str]]]:
    """What an append's units and the document's stored last units gain from each other.

    *stored* are the texts of the document's last stored units, in order; *added* the
    append's, in order. Returns, for each of *stored* and then for each of *added*, the
    texts of the other side that are within :data:`NEIGHBOUR_WINDOW` of it, so an append
    indexes as if the document had been retained whole.
    """
    n = len(stored)

    def near(i: int, j: int) -> bool:  # stored[i] and added[j] are (n - i) + j units apart
        return (n - i) + j <= NEIGHBOUR_WINDOW

    return (
        [[added[j] for j in range(len(added)) if near(i, j)] for i in range(n)],
        [[stored[i] for i in range(n) if near(i, j)] for j in range(len(added))],
    )


def with_neighbours(index: str, texts: Sequence[str]) -> str:
    """*index* (a unit's BM25 text) with its neighbours' *texts* added."""
    return "\n".join([index, *texts])
