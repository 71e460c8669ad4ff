"""The grounding helpers: splitting a question into its parts, spotting a refusal, and the
grounded answer reflect and chat turns share (tested through both in
tests/reflect/test_reflect_http.py and tests/runs/test_grounded_turns.py)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from heed.llm.base import ChatMessage
from heed.llm.grounding import (
    ANSWER_FROM_MEMORIES,
    MAX_PARTS,
    MEMORIES_HEADING,
    GroundedAnswer,
    Memory,
    RecallPart,
    grounded_question,
    is_a_refusal,
    split_question,
)


@pytest.mark.parametrize(
    ("question", "parts"),
    [
        (
            "What is the name of Alice's cat and where does she work?",
            ["What is the name of Alice's cat?", "Where does she work?"],
        ),
        ("Who is Bob? Where does he live?", ["Who is Bob?", "Where does he live?"]),
        (
            "What did Tom and Luna eat, and when did they sleep?",
            ["What did Tom and Luna eat?", "When did they sleep?"],
        ),
        # one question, whatever "and" it holds
        ("Did Alice and Bob meet in Paris?", ["Did Alice and Bob meet in Paris?"]),
        ("Tell me about cats and dogs", ["Tell me about cats and dogs"]),
        ("hello", ["hello"]),
    ],
)
def test_a_question_splits_into_its_parts(question: str, parts: list[str]) -> None:
    assert split_question(question) == parts


def test_too_many_parts_are_one_question() -> None:
    many = " and ".join(f"what is fact {i}" for i in range(MAX_PARTS + 1)) + "?"
    assert split_question(many) == [many]
    assert len(split_question(" and ".join(["what is x"] * MAX_PARTS))) == MAX_PARTS


def test_the_longest_message_splits_in_linear_time() -> None:
    # A regular expression over the message once took 15 s for 2,000 spaces (backtracking).
    started = time.perf_counter()
    split_question("a" + " " * 200_000 + "b")
    split_question(" and what" * 20_000)
    assert time.perf_counter() - started < 2.0  # generous: this takes ~25 ms


def test_refusals_are_told_from_answers() -> None:
    for refusal in ("I could not find an answer in the memories.", "That is not mentioned."):
        assert is_a_refusal(refusal), refusal
    for answer in ("Pixel.", "She found a job at St. Mary's hospital."):
        assert not is_a_refusal(answer), answer


def test_the_best_memory_is_nearest_the_question() -> None:
    prompt = grounded_question(["- best", "- second"], "Why?")
    assert prompt.index("- second") < prompt.index("- best") < prompt.index("Question: Why?")


@dataclass(frozen=True)
class Note:
    text: str
    occurred_start: str | None = None
    mentioned_at: str | None = None


class Caller:
    """What a caller of the grounded answer gives it: a model that answers by question,
    and a stream that records every word streamed."""

    def __init__(self, replies: dict[str, str]) -> None:
        self.replies = replies
        self.asked: list[list[ChatMessage]] = []
        self.streamed: list[str] = []

    async def generate(self, messages: list[ChatMessage]) -> str:
        self.asked.append(messages)
        question = messages[-1].content.rsplit("Question: ", 1)[-1]
        reply = next(text for key, text in self.replies.items() if key in question)
        self.streamed.append(reply)
        return reply

    async def say(self, text: str) -> None:
        self.streamed.append(text)


def recall_from(memories: dict[str, list[Note] | None]) -> tuple[list[str], RecallPart]:
    parts: list[str] = []

    async def recall(part: str, index: int) -> Sequence[Memory] | None:
        assert index == len(parts)
        parts.append(part)
        return next(found for key, found in memories.items() if key in part)

    return parts, recall


async def test_each_part_is_recalled_then_answered_over_its_own_memories() -> None:
    grounded = GroundedAnswer.of("What is the name of Alice's cat and where does she work?")
    recalled, recall = recall_from(
        {"cat": [Note("Alice's cat is Pixel.", "2024-03-10T00:00:00")], "work": [Note("A nurse.")]}
    )
    await grounded.recall(recall)
    assert recalled == ["What is the name of Alice's cat?", "Where does she work?"]
    caller = Caller({"cat?": "Pixel.", "work?": "She is a nurse."})
    answer = await grounded.answer(caller.generate, caller.say)
    assert answer == "Pixel. She is a nurse." == "".join(caller.streamed)
    system, user = caller.asked[0]
    assert system.content == ANSWER_FROM_MEMORIES
    assert "- Alice's cat is Pixel. (2024-03-10)" in user.content
    assert "nurse" not in user.content, "a part sees only its own memories"


async def test_a_refused_part_keeps_its_words_and_quotes_its_best_memories() -> None:
    notes = [Note(f"Memory {i}.") for i in range(5)]
    grounded = GroundedAnswer(["Who?"], [notes])
    caller = Caller({"Who?": "I could not find that."})
    answer = await grounded.answer(caller.generate, caller.say)
    assert answer == "I could not find that. From the memories: Memory 0. Memory 1. Memory 2."
    assert answer == "".join(caller.streamed), "the quote is streamed like the answer"

    several = GroundedAnswer(["Who?", "Where?"], [notes, notes[3:]])
    caller = Caller({"Who?": "Bob.", "Where?": ""})
    answer = await several.answer(caller.generate, caller.say)
    assert answer == "Bob. From the memories: Memory 3." == "".join(caller.streamed)


async def test_a_part_without_memories() -> None:
    reflect = GroundedAnswer(["Who?", "Where?"], [[], None])
    caller = Caller({})
    answer = await reflect.answer(caller.generate, caller.say, nothing_found="Not found.")
    assert answer == "Not found. Not found." == "".join(caller.streamed)
    assert caller.asked == [] and reflect.recalled, "no generation for a part without memories"

    turn = GroundedAnswer(["Hello?"], [None])
    caller = Caller({"Hello?": "Hi!"})
    assert await turn.answer(caller.generate, caller.say) == "Hi!"
    assert MEMORIES_HEADING not in caller.asked[0][1].content, "asked bare"
    assert not turn.recalled, "a failed recall is no recall"
