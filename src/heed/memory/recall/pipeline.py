"""The recall pipeline: one function per stage, a checkpoint before each.

    admission -> query embedding -> arms (semantic | keyword | graph | temporal)
    -> fusion (RRF) -> rerank -> boosts -> enrichment -> token budget

How the candidates are ranked (the query embedded without its entity names, the blend
of cosine and BM25, the speaker and date-window boosts, and the bank settings that weigh
them) is :mod:`heed.memory.recall.ranking`'s.

Cancellation, stage by stage:

- admission: ``lane.slot()``; a request cancelled while queued leaves the
  queue and never starts (not even its embedding).
- every later stage starts with ``raise_if_cancelled()``; CPU-bound stages run
  in the offload (:func:`heed.runtime.run_in_thread`) and check the token
  inside their loops (per embedding batch, per vector block, per rerank
  batch, per enrichment fetch), so a cancel stops work within one step.
- the lane slot is held across all stages and released only when the
  ``async with`` exits, which cannot happen while an offloaded thread runs.

A recall passes through the event loop as few times as it can: the bank's
loaded index is taken on the loop, the two retrieval branches run side by side
in two worker threads, and everything after them (fusion to enrichment) in one.
Every hop back to the loop waits behind whatever else the loop is doing, which
under a storm of requests is most of the time.

``hooks`` (tests only) is called in the worker thread with the stage name at
the start of each offloaded stage and between batches; a hook can block to
hold a stage open while a test cancels the request.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import numpy as np

from heed.memory.bank_config.view import BankSettings
from heed.memory.embeddings import Embedder, TokenCounter
from heed.memory.entities import canonical
from heed.memory.models import Bank, RecallHit, RecallOutcome, RecallQuery, StoredUnit
from heed.memory.recall.budget import BUDGET_SIZES, RecallSize, recall_size
from heed.memory.recall.fusion import reciprocal_rank_fusion
from heed.memory.recall.query import QueryAnalysis, analyze_query
from heed.memory.recall.ranking import RankingWeights, ranking_weights, speaks
from heed.memory.recall.rerank import Candidate, Reranker
from heed.memory.recall.vectors import VectorSearch
from heed.memory.retain.units import speaker_of
from heed.memory.spans import annotate, stage_span
from heed.memory.store import MemoryStore
from heed.memory.tags import tags_pass
from heed.runtime import Lane, OperationCancelled, raise_if_cancelled, run_in_thread

__all__ = ["BUDGET_SIZES", "RecallDeps", "StageHook", "Tracer", "run_recall", "slot_terms"]

T = TypeVar("T")
StageHook = Callable[[str], None]

#: How many of each arm's units ``trace: true`` lists.
TRACE_ARM_TOP = 20
#: A stage span's attribute: how many candidates the stage produced (an arm) or took (rerank).
#: Spans are made for the stages worth a span's cost (about 20-40 us each): the query's
#: embedding, each arm and the rerank; ``trace: true`` times every stage.
CANDIDATES = "heed.recall.candidates"


@dataclass
class RecallDeps:
    """What the pipeline needs; the engine builds one per server."""

    store: MemoryStore
    embedder: Embedder
    reranker: Reranker
    tokens: TokenCounter
    lane: Lane
    index_for: Callable[[Bank], Awaitable[VectorSearch]]
    arm_weights: dict[str, float] = field(
        default_factory=lambda: {"semantic": 1.0, "keyword": 1.0, "graph": 0.5, "temporal": 0.5}
    )
    recency_weight: float = 0.0
    #: 0: units are indexed with their neighbours (heed.memory.retain.units), which served
    #: LoCoMo better than this boost on top (recall@10 0.786 against 0.780 with 0.3).
    neighbor_weight: float = 0.0
    neighbor_expand: int = 20
    hooks: StageHook | None = None


class Tracer:
    """Per-stage wall times (ms) and candidate counts, returned with ``trace: true``."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.stages: list[dict[str, Any]] = []
        self.extra: dict[str, Any] = {}

    async def stage(
        self, name: str, work: Awaitable[T], count: Callable[[T], int] | None = None
    ) -> T:
        """Checkpoint, run *work*, record its duration and (optionally) its output count.

        Cancelled at the checkpoint, *work* is closed unstarted (never "never awaited")."""
        try:
            raise_if_cancelled()
        except OperationCancelled:
            if inspect.iscoroutine(work):
                work.close()
            raise
        start = time.perf_counter()
        result = await work
        entry: dict[str, Any] = {
            "stage": name,
            "ms": round((time.perf_counter() - start) * 1000, 3),
        }
        if count is not None:
            entry["candidates"] = count(result)
        self.stages.append(entry)
        return result

    def run(
        self,
        name: str,
        fn: Callable[..., T],
        /,
        *args: Any,
        count: Callable[[T], int] | None = None,
    ) -> T:
        """The blocking twin of :meth:`stage`, for stages run in a worker thread."""
        raise_if_cancelled()
        start = time.perf_counter()
        result = fn(*args)
        if count is None:
            self.record(name, start)
        else:
            self.record(name, start, candidates=count(result))
        return result

    def record(self, name: str, start: float, **extra: Any) -> None:
        self.stages.append(
            {"stage": name, "ms": round((time.perf_counter() - start) * 1000, 3), **extra}
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "total_ms": round((time.perf_counter() - self.started) * 1000, 3),
            "stages": self.stages,
            **self.extra,
        }


def _hook(deps: RecallDeps, stage: str) -> None:
    if deps.hooks is not None:
        deps.hooks(stage)
        raise_if_cancelled()


async def _gather_all(*aws: Awaitable[Any]) -> list[Any]:
    """Await all; only then raise the first failure (no thread is left running)."""
    results = await asyncio.gather(*aws, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return list(results)


# -- stages ----------------------------------------------------------------------------


def _embed_query(deps: RecallDeps, query: str) -> np.ndarray:
    """The embedding of *query* (the analysed query's ``semantic_query``)."""
    _hook(deps, "embedding")
    with stage_span("embeddings") as span:
        if span.is_recording():
            span.set_attributes(
                {
                    "gen_ai.operation.name": "embeddings",
                    "gen_ai.embeddings.dimension.count": deps.embedder.dim,
                }
            )
        vector: np.ndarray = deps.embedder.embed([query])[0]
    return vector


def _semantic_arm(
    deps: RecallDeps, index: VectorSearch, qvec: np.ndarray, k: int, q: RecallQuery
) -> list[tuple[int, float]]:
    _hook(deps, "retrieval")
    hits = index.search(qvec, k, q.types)
    if q.min_semantic is not None:
        hits = [h for h in hits if h[1] >= q.min_semantic]
    return hits


def _keyword_arm(
    deps: RecallDeps, bank: Bank, analysis: QueryAnalysis, k: int, q: RecallQuery
) -> list[tuple[int, float]]:
    _hook(deps, "retrieval")
    hits = deps.store.keyword_search(bank.ref, analysis.terms, k)
    if q.min_keyword is not None:
        hits = [h for h in hits if h[1] >= q.min_keyword]
    return hits


def _graph_arm(
    deps: RecallDeps, bank: Bank, analysis: QueryAnalysis, k: int
) -> list[tuple[int, float]]:
    """Units naming the query's entities, then one hop along entity/temporal links."""
    _hook(deps, "retrieval")
    seeds = deps.store.units_by_entities(bank.ref, analysis.entity_names, k)
    raise_if_cancelled()
    if not seeds:
        return []
    # The rarest combination first: units naming more of the query's entities.
    best = seeds[0][1]
    strong = [s for s in seeds if s[1] >= best][: max(5, k // 4)]
    linked = deps.store.linked_units(bank.ref, [s for s, _ in strong], k)
    merged: dict[int, float] = {s: w + 1.0 for s, w in strong}
    for seq, weight in linked:
        merged.setdefault(seq, weight / 10.0)
    return sorted(merged.items(), key=lambda kv: -kv[1])[:k]


def _temporal_arm(
    deps: RecallDeps, bank: Bank, analysis: QueryAnalysis, k: int
) -> list[tuple[int, float]]:
    _hook(deps, "retrieval")
    if analysis.window is None:
        return []
    start, end = analysis.window
    rows = deps.store.units_in_window(bank.ref, start.isoformat(), end.isoformat(), k)
    return [(seq, 1.0) for seq, _ in rows]


def _embed_and_search(
    deps: RecallDeps, index: VectorSearch, q: RecallQuery, text: str, k: int
) -> tuple[np.ndarray, list[tuple[int, float]], float]:
    """The embedding of *text* (the query without its entity names), then the semantic arm
    (one worker thread; a checkpoint between)."""
    start = time.perf_counter()
    qvec = _embed_query(deps, text)
    embed_ms = (time.perf_counter() - start) * 1000
    raise_if_cancelled()
    with stage_span("recall.arm.semantic") as span:
        hits = _semantic_arm(deps, index, qvec, k, q)
        if span.is_recording():
            span.set_attribute(CANDIDATES, len(hits))
    return qvec, hits, embed_ms


def _lexical_arms(
    deps: RecallDeps,
    bank: Bank,
    analysis: QueryAnalysis,
    q: RecallQuery,
    k: int,
    names: list[str],
) -> dict[str, list[tuple[int, float]]]:
    """The keyword, graph and temporal arms, one after the other, a checkpoint before each."""
    out: dict[str, list[tuple[int, float]]] = {}
    for name in names:
        raise_if_cancelled()
        with stage_span(f"recall.arm.{name}") as span:
            if name == "keyword":
                out[name] = _keyword_arm(deps, bank, analysis, k, q)
            elif name == "graph":
                out[name] = _graph_arm(deps, bank, analysis, k)
            else:
                out[name] = _temporal_arm(deps, bank, analysis, k)
            if span.is_recording():
                span.set_attribute(CANDIDATES, len(out[name]))
    return out


def _arm_ids(
    deps: RecallDeps, bank: Bank, arms: dict[str, list[tuple[int, float]]], top: int
) -> dict[str, list[str]]:
    """Public ids of each arm's top units, in arm order (for ``trace: true``)."""
    _hook(deps, "retrieval")
    seqs = list(dict.fromkeys(seq for hits in arms.values() for seq, _ in hits[:top]))
    units = deps.store.fetch_units(bank.ref, seqs)
    return {
        arm: [units[seq].id for seq, _ in hits[:top] if seq in units] for arm, hits in arms.items()
    }


def _passes(unit: StoredUnit, q: RecallQuery) -> bool:
    """Whether *unit* passes the query's fact-type and tag filters."""
    return (q.types is None or unit.fact_type in q.types) and tags_pass(
        unit.tags, q.tags, q.tags_match
    )


def _candidates(
    deps: RecallDeps,
    bank: Bank,
    index: VectorSearch,
    fused: list[tuple[int, float]],
    arms: dict[str, list[tuple[int, float]]],
    q: RecallQuery,
    limit: int,
) -> tuple[list[Candidate], dict[int, StoredUnit]]:
    """Fetch the fused top units, apply type/tag filters, attach vectors and arm scores."""
    _hook(deps, "retrieval")
    semantic = dict(arms.get("semantic", []))
    keyword = dict(arms.get("keyword", []))
    wanted: list[tuple[int, float]] = []
    units: dict[int, StoredUnit] = {}
    position = 0
    while len(wanted) < limit and position < len(fused):
        raise_if_cancelled()
        window = fused[position : position + limit + 20]
        position += len(window)
        fetched = deps.store.fetch_units(bank.ref, [s for s, _ in window])
        for seq, score in window:
            unit = fetched.get(seq)
            if unit is None or not _passes(unit, q):
                continue
            units[seq] = unit
            wanted.append((seq, score))
            if len(wanted) >= limit:
                break
    if deps.neighbor_expand:
        # Adjacent turns of the strongest candidates join the pool (same document only).
        near = [
            n
            for seq, _ in wanted[: deps.neighbor_expand]
            for n in (seq - 1, seq + 1)
            if n not in units
        ]
        fetched = deps.store.fetch_units(bank.ref, list(dict.fromkeys(near)))
        for seq, unit in fetched.items():
            origin = units.get(seq - 1) or units.get(seq + 1)
            if origin is None or origin.document_id != unit.document_id or seq in units:
                continue
            if not _passes(unit, q):
                continue
            units[seq] = unit
            wanted.append((seq, 0.0))
    vectors = index.vectors_for([s for s, _ in wanted])
    candidates = [
        Candidate(
            seq=seq,
            text=units[seq].text,
            fused=score,
            semantic=semantic.get(seq),
            keyword=keyword.get(seq),
            vector=vectors.get(seq),
        )
        for seq, score in wanted
    ]
    return candidates, units


def _rerank(
    deps: RecallDeps,
    query: str,
    qvec: np.ndarray,
    candidates: Sequence[Candidate],
    weights: RankingWeights,
) -> list[float]:
    _hook(deps, "rerank")
    with stage_span("recall.rerank") as span:
        if span.is_recording():
            span.set_attributes(
                {CANDIDATES: len(candidates), "heed.recall.reranker": deps.reranker.name}
            )
        return deps.reranker.score(query, qvec, candidates, semantic_weight=weights.semantic)


def _parse_iso(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def _boost(
    deps: RecallDeps,
    hits: list[RecallHit],
    analysis: QueryAnalysis,
    anchor: datetime,
    weights: RankingWeights,
    counts: dict[str, int] | None = None,
) -> list[RecallHit]:
    """Neighbor, recency (exponential decay, half-life one year), speaker and date-window
    boosts, then the hits re-sorted; *counts* (when given) gets how many hits each of the
    last two lifted (for ``trace: true``).

    The neighbor boost adds ``neighbor_weight`` times the best score of the adjacent units
    of the same document among the candidates (a question turn lifts the answer turn after
    it). The speaker boost adds ``weights.speaker`` to a unit spoken by one of the query's
    entities; the window boost ``weights.temporal`` to a unit whose event range
    (``occurred_start``..``occurred_end``) overlaps the query's date window or whose
    ``mentioned_at`` is inside it (:mod:`heed.memory.recall.ranking`).
    """
    spoken = window = 0
    if deps.neighbor_weight:
        base = {(h.unit.document_id, h.unit.seq): h.final for h in hits}
        for hit in hits:
            key = hit.unit.document_id
            near = max(
                base.get((key, hit.unit.seq - 1), 0.0), base.get((key, hit.unit.seq + 1), 0.0)
            )
            hit.final += deps.neighbor_weight * near
    names = frozenset(analysis.entity_names)
    for hit in hits:
        mentioned = _parse_iso(hit.unit.mentioned_at)
        when = _parse_iso(hit.unit.occurred_start) or mentioned
        if when is not None and deps.recency_weight:
            age_days = max(0.0, (anchor - when).total_seconds() / 86400)
            hit.final += deps.recency_weight * math.exp(-age_days * math.log(2) / 365)
        if weights.speaker and names and speaks(speaker_of(hit.unit.text), names):
            hit.final += weights.speaker
            spoken += 1
        if weights.temporal and analysis.window is not None and when is not None:
            start, end = analysis.window
            end_when = _parse_iso(hit.unit.occurred_end) or when
            if (when <= end and end_when >= start) or (
                mentioned is not None and start <= mentioned <= end
            ):
                hit.final += weights.temporal
                window += 1
    hits.sort(key=lambda h: -h.final)
    if counts is not None:
        counts["speaker"] = spoken
        counts["window"] = window
    return hits


def _enrich(
    deps: RecallDeps, bank: Bank, hits: list[RecallHit], q: RecallQuery
) -> tuple[dict[str, dict[str, Any]] | None, dict[str, dict[str, Any]] | None]:
    """Chunks and entity states of the hits, within their own token limits."""
    _hook(deps, "enrichment")
    chunks: dict[str, dict[str, Any]] | None = None
    entities: dict[str, dict[str, Any]] | None = None
    if q.include_chunks:
        raise_if_cancelled()
        ids = list(dict.fromkeys(h.unit.chunk_id for h in hits if h.unit.chunk_id))
        fetched = deps.store.fetch_chunks(bank.ref, ids)
        chunks = {}
        remaining = q.max_chunk_tokens
        for chunk_id in ids:
            raise_if_cancelled()
            chunk = fetched.get(chunk_id)
            if chunk is None or remaining <= 0:
                continue
            n = deps.tokens.count(chunk["text"])
            if n > remaining:
                chunk = {
                    **chunk,
                    "text": _truncate(deps, chunk["text"], remaining),
                    "truncated": True,
                }
                n = remaining
            chunks[chunk_id] = chunk
            remaining -= n
    if q.include_entities:
        raise_if_cancelled()
        _hook(deps, "enrichment")
        names = list(dict.fromkeys(canonical(e) for h in hits for e in h.unit.entities))[:50]
        states = deps.store.entity_states(bank.ref, names, per_entity=3)
        entities = {}
        remaining = q.max_entity_tokens
        for name, state in states.items():
            raise_if_cancelled()
            kept = []
            for obs in state["observations"]:
                n = deps.tokens.count(obs["text"])
                if n > remaining:
                    break
                remaining -= n
                kept.append(obs)
            if kept:
                entities[name] = {**state, "observations": kept}
            if remaining <= 0:
                break
    return chunks, entities


def _truncate(deps: RecallDeps, text: str, max_tokens: int) -> str:
    words = text.split()
    lo, hi = 0, len(words)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if deps.tokens.count(" ".join(words[:mid])) <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo])


def _budget(deps: RecallDeps, hits: list[RecallHit], max_tokens: int) -> list[RecallHit]:
    """Keep hits in order while their texts fit in *max_tokens* (counted locally).

    Counts stored at retain are used; a unit without one is counted now.
    """
    missing = [h.unit.text for h in hits if h.unit.token_count is None]
    fresh = iter(deps.tokens.count_many(missing))
    counts = [h.unit.token_count if h.unit.token_count is not None else next(fresh) for h in hits]
    kept: list[RecallHit] = []
    used = 0
    for hit, n in zip(hits, counts, strict=True):
        if used + n > max_tokens:
            break
        used += n
        kept.append(hit)
    return kept


def _rank_and_fill(
    deps: RecallDeps,
    tracer: Tracer,
    bank: Bank,
    index: VectorSearch,
    arms: dict[str, list[tuple[int, float]]],
    qvec: np.ndarray,
    q: RecallQuery,
    analysis: QueryAnalysis,
    anchor: datetime,
    rerank_n: int,
    weights: RankingWeights,
    rerank: bool,
) -> tuple[list[RecallHit], dict[str, dict[str, Any]] | None, dict[str, dict[str, Any]] | None]:
    """Fusion, candidates (the best *rerank_n*), rerank, boosts, token budget and enrichment
    (one worker thread; a checkpoint before each stage, and each stage's time in *tracer*)."""
    if q.trace:
        tracer.extra["arms"] = _arm_ids(deps, bank, arms, TRACE_ARM_TOP)
    fused = tracer.run("fusion", reciprocal_rank_fusion, arms, deps.arm_weights, count=len)
    candidates, units = tracer.run(
        "candidates",
        _candidates,
        deps,
        bank,
        index,
        fused,
        arms,
        q,
        rerank_n,
        count=lambda r: len(r[0]),
    )
    if rerank:
        scores = tracer.run("rerank", _rerank, deps, q.query, qvec, candidates, weights, count=len)
    else:
        top = max((c.fused for c in candidates), default=1.0) or 1.0
        scores = [c.fused / top for c in candidates]
    hits = [
        RecallHit(
            unit=units[c.seq],
            final=score,
            semantic=c.semantic,
            keyword=c.keyword,
            reranker=score,
        )
        for c, score in zip(candidates, scores, strict=True)
    ]

    lifted: dict[str, int] = {}

    def boost(hits: list[RecallHit]) -> list[RecallHit]:
        hits = _boost(deps, hits, analysis, anchor, weights, lifted)
        if q.min_final is not None:
            hits = [h for h in hits if h.final >= q.min_final]
        return hits

    raise_if_cancelled()
    start = time.perf_counter()
    hits = boost(hits)
    tracer.record("boost", start, candidates=len(hits), lifted=lifted)
    hits = tracer.run("budget", _budget, deps, hits, q.max_tokens, count=len)
    chunks, entities = tracer.run("enrichment", _enrich, deps, bank, hits, q)
    return hits, chunks, entities


# -- the pipeline -------------------------------------------------------------------------


def slot_terms(size: RecallSize) -> tuple[float, bool]:
    """How a recall of *size* (:func:`heed.memory.recall.budget.recall_size`: its budget
    as its bank's settings size it) asks for a recall-lane slot: its cost relative to a
    default ``low`` one, in candidates reranked (a bigger recall waits behind cheaper ones
    a little), and whether it is dear work, which leaves a slot free for the others: as
    big as a default ``high`` one or bigger (``mid`` is the default, and holding it to
    one slot of two cut 8 clients' recalls/s by 17%). See :mod:`heed.runtime.slots`."""
    return (
        size.reranked / BUDGET_SIZES["low"][1],
        size.reranked >= BUDGET_SIZES["high"][1],
    )


async def run_recall(
    deps: RecallDeps,
    bank: Bank,
    q: RecallQuery,
    settings: BankSettings,
    *,
    background: bool = False,
) -> RecallOutcome:
    """Run every stage for *q* on *bank*, whose *settings* switch its arms and rerank, size
    it with its budget (:func:`heed.memory.recall.budget.recall_size`) and weigh its ranking;
    raises ``OperationCancelled`` at any
    checkpoint. *background* work waits behind every user's recall for its slot."""
    tracer = Tracer()
    queued_at = time.perf_counter()
    size = recall_size(settings, q.budget, q.max_tokens)
    per_arm = size.per_arm
    cost, dear = slot_terms(size)
    slot = deps.lane.slot(background=True) if background else deps.lane.slot(cost=cost, dear=dear)
    async with slot:
        tracer.record("admission", queued_at)
        annotate("heed.recall.admission_ms", tracer.stages[-1]["ms"])  # the lane's wait
        anchor = q.query_timestamp or datetime.now(UTC)
        analysis = analyze_query(q.query, anchor, q.temporal_window)
        weights = ranking_weights(settings)
        index = await tracer.stage("index", deps.index_for(bank))

        # Two offloaded branches run side by side: the query embedding followed by the
        # semantic arm, and the lexical arms (keyword, graph, temporal), which do not need
        # the embedding. Both are awaited until their threads stopped.
        raise_if_cancelled()
        start = time.perf_counter()
        lexical = [
            name
            for name, wanted in (
                ("keyword", settings.enable_text_search and analysis.terms),
                ("graph", settings.enable_graph_retrieval and analysis.entity_names),
                ("temporal", settings.enable_temporal_retrieval and analysis.window is not None),
            )
            if wanted
        ]
        (qvec, semantic, embed_ms), lexical_hits = await _gather_all(
            run_in_thread(_embed_and_search, deps, index, q, analysis.semantic_query, per_arm),
            run_in_thread(_lexical_arms, deps, bank, analysis, q, per_arm, lexical),
        )
        tracer.stages.append({"stage": "embedding", "ms": round(embed_ms, 3)})
        arms = {"semantic": semantic, **lexical_hits}
        tracer.record("retrieval", start, arms={name: len(hits) for name, hits in arms.items()})

        # Everything after the arms in one worker thread: each hop through the event loop
        # waits behind whatever the loop is doing (under a storm of requests, most of it).
        hits, chunks, entities = await run_in_thread(
            _rank_and_fill,
            deps,
            tracer,
            bank,
            index,
            arms,
            qvec,
            q,
            analysis,
            anchor,
            size.reranked,
            weights,
            settings.enable_reranking,
        )
    tracer.extra["query"] = {
        "terms": analysis.terms,
        "entities": analysis.entity_names,
        "window": [w.isoformat() for w in analysis.window] if analysis.window else None,
        "semantic_query": analysis.semantic_query,
        "weights": {
            "semantic": weights.semantic,
            "speaker": weights.speaker,
            "temporal": weights.temporal,
        },
        "budget": q.budget,
        "budget_function": size.function,
        "candidates_per_arm": size.per_arm,
        "candidates_reranked": size.reranked,
        "reranker": deps.reranker.name,
    }
    return RecallOutcome(
        hits=hits,
        entities=entities,
        chunks=chunks,
        source_facts={} if q.include_source_facts else None,
        trace=tracer.as_dict() if q.trace else None,
    )
