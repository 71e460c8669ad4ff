"""Unit tests of the engine's parts: dates, entities, units, query terms, fusion, vectors."""

from __future__ import annotations

from datetime import UTC, date, datetime

import numpy as np
import pytest

from heed.memory.dates import find_dates, parse_timestamp
from heed.memory.entities import canonical, extract_entities, query_entity_names
from heed.memory.models import RetainItem
from heed.memory.recall.fusion import reciprocal_rank_fusion
from heed.memory.recall.query import analyze_query, keyword_terms
from heed.memory.recall.vectors import VectorIndex
from heed.memory.retain.prepare import plan_documents, prepare_documents
from heed.memory.retain.units import neighbour_gains, split_units
from heed.runtime import CancellationToken, OperationCancelled, RequestContext, use_context

ANCHOR = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)  # a Monday


@pytest.mark.parametrize(
    ("text", "start", "end"),
    [
        ("I went there yesterday", date(2023, 5, 7), date(2023, 5, 7)),
        ("We met on 7 May, 2023.", date(2023, 5, 7), date(2023, 5, 7)),
        ("back in May 2022", date(2022, 5, 1), date(2022, 5, 31)),
        ("last week I painted", date(2023, 5, 1), date(2023, 5, 7)),
        ("two weeks ago", date(2023, 4, 24), date(2023, 4, 30)),
        ("next month", date(2023, 6, 1), date(2023, 6, 30)),
        ("last Saturday was fun", date(2023, 5, 6), date(2023, 5, 6)),
        ("on 2023-01-02", date(2023, 1, 2), date(2023, 1, 2)),
        ("in 2022 we moved", date(2022, 1, 1), date(2022, 12, 31)),
    ],
)
def test_dates_resolve_against_the_anchor(text: str, start: date, end: date) -> None:
    (found,) = find_dates(text, ANCHOR)
    assert (found.start.date(), found.end.date()) == (start, end)


def test_relative_dates_need_an_anchor_and_verbs_are_not_dates() -> None:
    assert find_dates("yesterday", None) == []
    assert find_dates("you may 5 go", ANCHOR) == []


def test_parse_timestamp() -> None:
    assert parse_timestamp("2024-01-15T10:30:00Z") == datetime(2024, 1, 15, 10, 30, tzinfo=UTC)
    assert parse_timestamp("2024-01-15").tzinfo is not None
    with pytest.raises(ValueError, match="invalid timestamp"):
        parse_timestamp("the day after")


def test_entities_without_an_llm() -> None:
    names = [e.name for e in extract_entities(
        "Hey Mel! Melanie and I visited New York City last week.", speaker="Caroline"
    )]  # fmt: skip
    assert names == ["Caroline", "Mel", "Melanie", "New York City"]
    assert query_entity_names("When did Caroline go to the LGBTQ support group?") == [
        "caroline",
        "lgbtq",
    ]
    assert canonical("  New   York ") == "new york"


def test_units_per_turn_and_sentence_groups() -> None:
    turns = split_units("Ann: Hi!\nBen: Hello there.")
    assert [(u.speaker, u.text) for u in turns] == [
        ("Ann", "Ann: Hi!"),
        ("Ben", "Ben: Hello there."),
    ]
    groups = split_units("One sentence here. " * 100, max_chars=200)
    assert len(groups) > 5 and all(len(g.text) <= 200 for g in groups)


def test_query_terms_and_window() -> None:
    assert keyword_terms("What did Melanie paint in the summer?") == ["melanie", "paint", "summer"]
    analysis = analyze_query("What happened last month?", ANCHOR)
    assert analysis.window is not None and analysis.window[0].date() == date(2023, 4, 1)


def test_rrf_weights_and_order() -> None:
    fused = reciprocal_rank_fusion(
        {"a": [(1, 0.9), (2, 0.5)], "b": [(2, 3.0), (3, 1.0)]}, {"a": 1.0, "b": 1.0}
    )
    assert [seq for seq, _ in fused] == [2, 1, 3]
    only_a = reciprocal_rank_fusion({"a": [(1, 0.9)], "b": [(3, 1.0)]}, {"a": 1.0, "b": 0.0})
    assert [seq for seq, _ in only_a] == [1]


def _unit(v: list[float]) -> np.ndarray:
    a = np.asarray(v, dtype=np.float32)
    return a / np.linalg.norm(a)


def test_vector_index_search_remove_compact_and_types() -> None:
    index = VectorIndex(dim=3, capacity=2)
    index.add([10, 11, 12], np.stack([_unit([1, 0, 0]), _unit([0, 1, 0]), _unit([1, 1, 0])]),
              ["world", "experience", "world"])  # fmt: skip
    hits = index.search(_unit([1, 0.1, 0]), 2)
    assert [seq for seq, _ in hits] == [10, 12]
    assert [seq for seq, _ in index.search(_unit([1, 0, 0]), 3, ["experience"])] == [11]
    index.remove([10, 12])  # more than a quarter dead: compacts
    assert len(index) == 1 and [s for s, _ in index.search(_unit([1, 0, 0]), 3)] == [11]
    assert set(index.vectors_for([11, 99])) == {11}


def test_vector_search_checks_the_token_between_blocks() -> None:
    index = VectorIndex(dim=3)
    index.add([1], _unit([1, 0, 0])[None, :], ["world"])
    token = CancellationToken()
    token.cancel("client disconnected")
    with use_context(RequestContext(token=token)), pytest.raises(OperationCancelled):
        index.search(_unit([1, 0, 0]), 1)


class _FakeStore:
    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.loads: list[str] = []

    def load_vectors(self, bank_ref: str) -> object:
        from heed.memory.store import VectorRows

        self.loads.append(bank_ref)
        matrix = np.tile(_unit([1, 0, 0]), (self.rows, 1))
        return VectorRows(np.arange(self.rows, dtype=np.int64), matrix, ["world"] * self.rows)


def test_bank_indexes_unload_the_least_recently_used() -> None:
    from heed.memory.recall.vectors import BankIndexes

    store = _FakeStore(rows=2000)
    one_index = VectorIndex(dim=3, capacity=2000).nbytes
    indexes = BankIndexes(store, dim=3, max_bytes=2 * one_index)  # type: ignore[arg-type]
    indexes.get("a")
    indexes.get("b")
    indexes.get("a")  # a is now the most recently used
    indexes.get("c")  # over budget: b goes
    assert indexes.loaded() == ["a", "c"]
    indexes.get("b")  # reloads from the store
    assert store.loads == ["a", "b", "c", "b"]
    assert len(indexes.get("b")) == 2000


def test_an_abbreviation_is_part_of_the_name_not_an_entity() -> None:
    names = [
        e.name for e in extract_entities("Alice works as a nurse at St. Mary's hospital in Leeds.")
    ]
    assert names == ["Alice", "St. Mary", "Leeds"]
    assert "st" not in query_entity_names("Where is St. Mary's hospital?")
    # a real sentence end still ends the sentence
    names = [e.name for e in extract_entities("We met Dr. Lee. Then Bob came.")]
    assert names == ["Lee", "Bob"]


def test_a_sentence_opening_word_is_not_an_entity_but_a_name_there_is() -> None:
    cases = {
        "Honestly, I think Caroline is right.": ["Caroline"],
        "Actually Melanie painted it. Sometimes Jon helps.": ["Melanie", "Jon"],
        "Mr Smith met Mrs Brown.": ["Smith", "Brown"],
        "Speaking of trips, Gina went to Paris.": ["Gina", "Paris"],
        # the other direction: a name opening a sentence is kept, titles never are
        "Emily adopted a cat. Caroline, come here!": ["Emily", "Caroline"],
    }
    for text, expected in cases.items():
        assert [e.name for e in extract_entities(text)] == expected, text


class _ZeroEmbedder:
    dim = 4

    def embed(self, texts: list[str]) -> list[np.ndarray]:
        return [np.zeros(4, dtype=np.float32) for _ in texts]


def test_a_unit_is_indexed_with_two_neighbours_each_side_in_its_document_only() -> None:
    talk = [
        "Joanna: What is your favourite dish?",
        "Nate: Coconut milk ice cream.",
        "Nate: I also host a cooking show.",
        "Joanna: Which channel is it on?",
    ]
    items = [RetainItem(content=t, document_id="a") for t in talk]
    items.append(RetainItem(content="Maria: The shelter needs volunteers.", document_id="b"))
    [first, second] = prepare_documents(plan_documents(items, []), _ZeroEmbedder())  # type: ignore[arg-type]
    question, answer, show, channel = first.units
    assert "Coconut" in question.index_text and "cooking" in question.index_text
    assert "channel" not in question.index_text  # three units away
    assert all(w in answer.index_text for w in ("favourite", "cooking", "channel"))
    assert all(w in show.index_text for w in ("favourite", "Coconut", "channel"))
    assert "Coconut" in channel.index_text and "favourite" not in channel.index_text
    [alone] = second.units
    assert not any(w in alone.index_text for w in ("Coconut", "cooking", "favourite"))
    # the text itself, and what is embedded, stay the unit's own
    assert answer.text == "Nate: Coconut milk ice cream."


def test_neighbour_gains_across_an_append() -> None:
    stored, added = ["s1", "s2"], ["a1", "a2", "a3"]
    gains_stored, gains_added = neighbour_gains(stored, added)
    assert gains_stored == [["a1"], ["a1", "a2"]]
    assert gains_added == [["s1", "s2"], ["s2"], []]
