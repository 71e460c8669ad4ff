"""The recall ranking's stages (:mod:`heed.memory.recall.ranking`): the query embedded
without its entity names, the speaker boost, the date-window boost on a memory's event or
mention time (relative dates resolved against the query's reference time), and the bank
settings that weigh them; pure rules first, then through the engine on both databases."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from heed.memory import MemoryEngine, build_memory_engine
from heed.memory.bank_config.settings import validate
from heed.memory.bank_config.view import settings_of_config
from heed.memory.models import Bank, InvalidInput, RecallQuery, RetainItem
from heed.memory.recall.query import analyze_query, semantic_text
from heed.memory.recall.ranking import DEFAULT_WEIGHTS, RankingWeights, ranking_weights, speaks
from heed.memory.retain.units import speaker_of
from heed.runtime import RequestContext, use_context
from heed.services import build_lanes
from heed.settings import Settings
from heed.storage import SqlDatabase
from heed.storage.memory import SqlMemoryStore

# -- pure rules -------------------------------------------------------------------------


def test_the_query_is_embedded_without_its_entity_names() -> None:
    assert semantic_text("What books has John read?", ["john"]) == "What books has read?"
    assert semantic_text("What are MELANIE's kids like?", ["melanie"]) == "What are kids like?"
    assert semantic_text("What did Ann  Lee cook with Bob?", ["ann lee", "bob"]) == (
        "What did cook with ?"
    )
    # a name inside another word is not a name
    assert semantic_text("What did Johnny say?", ["john"]) == "What did Johnny say?"
    # nothing but stop words would be left: the query itself
    assert semantic_text("Tell me about Rome", ["rome"]) == "Tell me about Rome"
    assert semantic_text("Caroline?", ["caroline"]) == "Caroline?"
    assert semantic_text("what is new", []) == "what is new"


def test_the_analysis_carries_the_text_to_embed() -> None:
    analysis = analyze_query("What did Caroline paint?", None)
    assert analysis.entity_names == ["caroline"]
    assert analysis.semantic_query == "What did paint?"
    assert "caroline" in analysis.terms  # BM25 still matches the name


def test_a_relative_date_is_resolved_against_the_reference_time() -> None:
    asked = datetime(2023, 6, 4, 15, 0, tzinfo=UTC)
    start, end = analyze_query("What did Ann do yesterday?", asked).window or (None, None)
    assert (start, end) == (
        datetime(2023, 6, 3, tzinfo=UTC),
        datetime(2023, 6, 3, 23, 59, 59, 999999, tzinfo=UTC),
    )
    start, end = analyze_query("Where did Ann go last month?", asked).window or (None, None)
    assert start == datetime(2023, 5, 1, tzinfo=UTC) and end is not None and end.day == 31
    assert analyze_query("Where did Ann go?", asked).window is None


def test_a_turn_has_a_speaker_and_other_text_none() -> None:
    assert speaker_of("Melanie: I painted a lake.") == "Melanie"
    assert speaker_of("Dr. Lee: Take two.") == "Dr. Lee"
    assert speaker_of("I painted a lake.") is None
    assert speaker_of("Note: one\ntwo") is None  # two lines: not a turn
    assert speaks("Melanie", ["melanie", "caroline"])
    assert not speaks("Melanie", ["caroline"])
    assert not speaks(None, ["caroline"])


def weights(config: dict[str, Any]) -> RankingWeights:
    """The weights of a bank whose ``config`` map is *config*."""
    return ranking_weights(settings_of_config(config))


def test_weights_come_from_the_banks_settings_within_bounds() -> None:
    assert weights({}) == DEFAULT_WEIGHTS
    assert weights(
        {"recall_semantic_weight": 0.25, "recall_speaker_weight": 2, "recall_temporal_weight": 0}
    ) == RankingWeights(semantic=0.25, speaker=2.0, temporal=0.0)
    # out of bounds, not a number, or a bool: the default (a recall never fails on them)
    assert weights({"recall_semantic_weight": 1.5}) == DEFAULT_WEIGHTS
    assert weights({"recall_speaker_weight": "x"}) == DEFAULT_WEIGHTS
    assert weights({"recall_temporal_weight": True}) == DEFAULT_WEIGHTS
    assert weights({"recall_speaker_weight": float("nan")}) == DEFAULT_WEIGHTS


def test_the_settings_are_validated_when_written() -> None:
    assert validate({"recall_speaker_weight": 0.5}) == {"recall_speaker_weight": 0.5}
    with pytest.raises(InvalidInput, match="recall_semantic_weight"):
        validate({"recall_semantic_weight": 1.5})
    with pytest.raises(InvalidInput, match="recall_temporal_weight"):
        validate({"recall_temporal_weight": -1})
    with pytest.raises(InvalidInput, match="recall_speaker_weight"):
        validate({"recall_speaker_weight": "high"})


# -- through the engine, on SQLite and PostgreSQL ----------------------------------------


@pytest.fixture
async def engine(sql_database: SqlDatabase, tmp_path: Path) -> AsyncIterator[MemoryEngine]:
    store = SqlMemoryStore(sql_database)
    store.migrate()
    settings = Settings(data_dir=tmp_path)
    eng = build_memory_engine(settings, store, build_lanes(settings))
    with use_context(RequestContext()):
        yield eng


async def _set(engine: MemoryEngine, bank: Bank, **weights: float) -> Bank:
    def change(b: Bank) -> None:
        b.config.update(validate(weights))

    return await engine.change_bank(bank.bank_id, change)


def _texts(hits: list[object]) -> list[str]:
    return [h.unit.text for h in hits]  # type: ignore[attr-defined]


async def test_the_speaker_boost_lifts_what_the_named_person_said(engine: MemoryEngine) -> None:
    bank = await engine.put_bank("speaker", {})
    ann = "Ann: I love cooking spicy noodles."
    bob = "Bob: Ann, do you like cooking noodles? I like cooking noodles too, like Ann does."
    await engine.retain(bank, [RetainItem(content=f"{ann}\n{bob}", document_id="chat")])
    query = RecallQuery(query="What does Ann like cooking?", trace=True)

    bank = await _set(engine, bank, recall_speaker_weight=0.0)
    plain = await engine.recall(bank, query)
    assert _texts(plain.hits)[0] == bob  # more of the query's words, and its name
    bank = await _set(engine, bank, recall_speaker_weight=1.0)
    boosted = await engine.recall(bank, query)
    assert _texts(boosted.hits)[0] == ann
    assert boosted.trace is not None
    stage = next(s for s in boosted.trace["stages"] if s["stage"] == "boost")
    assert stage["lifted"]["speaker"] == 1
    assert boosted.trace["query"]["semantic_query"] == "What does like cooking?"
    assert boosted.trace["query"]["weights"]["speaker"] == 1.0


async def test_the_window_boost_prefers_memories_of_the_asked_date(engine: MemoryEngine) -> None:
    bank = await engine.put_bank("window", {})
    june = datetime(2023, 6, 3, 10, 0, tzinfo=UTC)
    may = datetime(2023, 5, 1, 10, 0, tzinfo=UTC)
    await engine.retain(
        bank,
        [
            RetainItem(content="Ann: We went hiking by the lake.", timestamp=june),
            RetainItem(content="Ann: We went hiking by the lake!", timestamp=may),
        ],
    )
    asked = datetime(2023, 6, 4, 9, 0, tzinfo=UTC)

    async def first(query: str) -> str:
        out = await engine.recall(bank, RecallQuery(query=query, query_timestamp=asked))
        return out.hits[0].unit.mentioned_at or ""

    # an absolute date, a relative one (resolved against the query's time), both ways
    assert (await first("Where did Ann go hiking on 3 June 2023?")).startswith("2023-06-03")
    assert (await first("Where did Ann go hiking on 1 May 2023?")).startswith("2023-05-01")
    assert (await first("Where did Ann go hiking yesterday?")).startswith("2023-06-03")
    bank = await _set(engine, bank, recall_temporal_weight=0.0)
    out = await engine.recall(
        bank, RecallQuery(query="Where did Ann go hiking on 1 May 2023?", trace=True)
    )
    assert out.trace is not None
    stage = next(s for s in out.trace["stages"] if s["stage"] == "boost")
    assert stage["lifted"]["window"] == 0


async def test_an_event_time_inside_the_window_counts_too(engine: MemoryEngine) -> None:
    bank = await engine.put_bank("event", {})
    said = datetime(2023, 6, 10, 10, 0, tzinfo=UTC)
    await engine.retain(
        bank,
        [
            # said on 10 June about 9 June (its event time), and a twin about nothing dated
            RetainItem(content="Ann: I ran a marathon yesterday.", timestamp=said),
            RetainItem(content="Ann: I ran a marathon, it was great.", timestamp=said),
        ],
    )
    out = await engine.recall(
        bank, RecallQuery(query="What did Ann run on 9 June 2023?", trace=True)
    )
    assert out.hits[0].unit.text == "Ann: I ran a marathon yesterday."
    assert out.trace is not None
    stage = next(s for s in out.trace["stages"] if s["stage"] == "boost")
    assert stage["lifted"]["window"] == 1
