"""The grounding helpers: splitting a question into its parts, spotting a refusal."""

from __future__ import annotations

import time

import pytest

from heed.llm.grounding import MAX_PARTS, grounded_question, is_a_refusal, split_question


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
