"""Answering from memories: the prompts, and the one routine reflect and chat turns share.

Both agents that answer from a memory bank use this module: a chat turn of a bank-bound
session (:mod:`heed.sessions.turn`) puts the memories it recalled next to the user's
question, and reflect (:mod:`heed.reflect.agent`) falls back to answering from its
memories when its model could not use the tools. Small models (the embedded
SmolLM2-135M) answer far more often when the memories sit right before the question than
when they are in the system prompt. Both offer the model the same ``recall`` tool
(:data:`RECALL_TOOL`).

**The grounded answer** (:class:`GroundedAnswer`) is how either answers without tools (a
model that cannot use them, or reflect's loop that failed): the message is split into its
questions (:func:`split_question`), every part is recalled on its own, then each part is
answered in one generation over its own memories. Decided once, for both:

- the parts are recalled first, all of them, then answered in order, one space between
  two answers; the answer is the answers joined;
- a part's prompt is :data:`ANSWER_FROM_MEMORIES` and its memories, one line each (clipped
  to :data:`MEMORY_CHARS`), best last, right before the question
  (:func:`grounded_question`);
- a part whose recall found nothing (or failed) is answered with the caller's
  *nothing_found* text (reflect: "I could not find an answer in the memories."), or, when
  the caller has none (a chat turn), by the model over the bare question;
- **a refused part** (no answer, a refusal such as "I could not find...", or a tool call
  written as text) keeps what the model said and is followed by its best memories,
  quoted: ``From the memories: ...`` (the best :data:`QUOTED_ALONE` for a one-part
  question, the best one of each part of several). So an answer never ends at "not found"
  when its memories hold more, and the quote is streamed like the model's words: what a
  client saw streaming is the answer, word for word, in reflect and in a chat turn alike.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from heed.llm.base import ChatMessage, ToolSpec
from heed.runtime import raise_if_cancelled

__all__ = [
    "ANSWER_FROM_MEMORIES",
    "MAX_PARTS",
    "MEMORIES_HEADING",
    "MEMORY_CHARS",
    "QUOTED_ALONE",
    "QUOTE_HEADING",
    "RECALL_TOOL",
    "Generate",
    "GroundedAnswer",
    "Memory",
    "RecallPart",
    "Say",
    "clip",
    "grounded_question",
    "is_a_refusal",
    "is_unanswered",
    "looks_like_a_tool_call",
    "memory_line",
    "split_question",
]

#: The system prompt of a generation that must answer from the memories it is given.
ANSWER_FROM_MEMORIES: Final = "Answer the question in one short sentence, using only the memories."
#: The line that introduces the memories in the question (tests and scripts match on it).
MEMORIES_HEADING: Final = "Memories that may help, with their dates:"
#: What follows a refused part: its best memories, quoted.
QUOTE_HEADING: Final = "From the memories:"
#: Memories quoted after a refused part of a one-part question (one per part of several).
QUOTED_ALONE: Final = 3
#: Characters of a memory in a grounded answer's prompt, and in a quote.
MEMORY_CHARS: Final = 400

#: The ``recall`` tool: one spec, offered by reflect and by chat turns alike.
RECALL_TOOL: Final = ToolSpec(
    name="recall",
    description="Search the memory bank for memories relevant to a query. Returns the "
    "memories found, one per line, with their dates.",
    parameters={
        "type": "object",
        "properties": {"query": {"type": "string", "description": "What to look for."}},
        "required": ["query"],
    },
)


class Memory(Protocol):
    """What a prompt shows of a memory (:class:`heed.memory.models.StoredUnit` is one)."""

    @property
    def text(self) -> str: ...

    @property
    def occurred_start(self) -> str | None: ...

    @property
    def mentioned_at(self) -> str | None: ...


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


def looks_like_a_tool_call(text: str) -> bool:
    """Is *text* a tool call written as text (a small model's JSON) rather than an answer?"""
    stripped = text.strip()
    return stripped.startswith("{") and ('"tool"' in stripped or '"name"' in stripped)


def is_unanswered(text: str) -> bool:
    """No answer, a refusal, or a tool call written as text."""
    return not text.strip() or is_a_refusal(text) or looks_like_a_tool_call(text)


def clip(text: str, limit: int) -> str:
    """*text* on one line (whitespace collapsed), cut to *limit* characters with "…"."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def memory_line(memory: Memory, *, ref: str | None = None, limit: int | None = None) -> str:
    """One memory for a prompt: ``- text (YYYY-MM-DD)``, or ``[ref] text (...)`` for a tool
    whose caller refers to memories by id; the date is when it happened, else when it was
    said. *limit* clips the text (:func:`clip`)."""
    when = memory.occurred_start or memory.mentioned_at
    suffix = f" ({when[:10]})" if when else ""
    body = clip(memory.text, limit) if limit is not None else memory.text
    return f"{f'[{ref}]' if ref else '-'} {body}{suffix}"


RecallPart = Callable[[str, int], Awaitable[Sequence[Memory] | None]]
"""``recall(part, index)``: the part's memories, best first (``None``: the recall failed)."""
Generate = Callable[[list[ChatMessage]], Awaitable[str]]
"""One generation without tools, its text streamed by the caller; returns that text."""
Say = Callable[[str], Awaitable[None]]
"""Streams text the routine adds itself: the space between answers, a quote, *nothing_found*."""


@dataclass
class GroundedAnswer:
    """A message answered part by part from memories (see the module docstring).

    ``GroundedAnswer.of(question)``, then :meth:`recall` (one recall per part), then
    :meth:`answer`. The caller does its own work between the two (a chat turn retains the
    message after its recall, so the message is not its own memory) and chooses whether to
    answer this way at all (:attr:`recalled`). Cancellation: a checkpoint before each part's
    recall and answer; the callbacks' own calls check the token too.
    """

    parts: list[str]
    memories: list[Sequence[Memory] | None] = field(default_factory=list)

    @classmethod
    def of(cls, question: str, *, split: bool = True) -> GroundedAnswer:
        """The parts of *question* (:func:`split_question`), or *question* whole."""
        return cls(split_question(question) if split else [question.strip()])

    async def recall(self, recall: RecallPart) -> None:
        """Recall every part, in order, with *recall*."""
        self.memories = []
        for index, part in enumerate(self.parts):
            raise_if_cancelled()
            self.memories.append(await recall(part, index))

    @property
    def recalled(self) -> bool:
        """True when a part's recall ran and did not fail."""
        return any(found is not None for found in self.memories)

    async def answer(
        self,
        generate: Generate,
        say: Say,
        *,
        context: str | None = None,
        nothing_found: str | None = None,
        rules: str = "",
    ) -> str:
        """Answer each part over its memories (*context* joins each question; *rules*, the
        bank's directives as :func:`heed.memory.directives.rules.rules_text` says them, join the
        system prompt); returns the answers joined by a space, which is exactly what was
        streamed."""
        answers: list[str] = []
        for index, part in enumerate(self.parts):
            raise_if_cancelled()
            if index:
                await say(" ")
            found = self.memories[index] if index < len(self.memories) else None
            answers.append(
                await self._answer_part(
                    part, found or (), generate, say, context, nothing_found, rules
                )
            )
        return " ".join(answers)

    async def _answer_part(
        self,
        question: str,
        memories: Sequence[Memory],
        generate: Generate,
        say: Say,
        context: str | None,
        nothing_found: str | None,
        rules: str = "",
    ) -> str:
        if not memories and nothing_found is not None:
            await say(nothing_found)
            return nothing_found
        if context:
            question = f"{question}\n\nContext: {context}"
        if memories:
            question = grounded_question(
                [memory_line(m, limit=MEMORY_CHARS) for m in memories], question
            )
        system = f"{ANSWER_FROM_MEMORIES}\n{rules}" if rules else ANSWER_FROM_MEMORIES
        messages = [ChatMessage.system(system), ChatMessage.user(question)]
        answer = (await generate(messages)).strip()
        if not memories or not is_unanswered(answer):
            return answer
        best = memories[: QUOTED_ALONE if len(self.parts) == 1 else 1]
        quote = " ".join([QUOTE_HEADING, *(clip(m.text, MEMORY_CHARS) for m in best)])
        await say(f" {quote}" if answer else quote)
        return f"{answer} {quote}" if answer else quote
