"""Rerankers: re-score the fused top candidates, in a worker thread, batch by batch.

Every reranker's :meth:`Reranker.score` is blocking, runs in the offload and
checks the active token before each batch of ``batch_size`` candidates, so a
cancelled recall stops after at most one batch. ``before_batch`` is a test
seam: called in the worker thread before each batch.

Options (``HEED_RERANKER``), measured on LoCoMo (see benchmarks/results/):

- ``none``: keep the fused (RRF) order.
- ``blend`` (the default): ``alpha * cosine + (1 - alpha) * bm25 / max_bm25``
  over the candidates; the cosine is recomputed for every candidate, including
  those only the keyword, graph or temporal arm found. ``alpha`` is the bank's
  ``recall_semantic_weight`` (:mod:`heed.memory.recall.ranking`).
- ``overlap``: fused score plus the share of query terms present in the text.
- ``cross-encoder``: an ONNX cross-encoder from ``HEED_RERANKER_MODEL_DIR``
  (``model.onnx`` + ``tokenizer.json``), used when configured.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from heed.memory.recall.query import keyword_terms
from heed.runtime import raise_if_cancelled

__all__ = [
    "BlendReranker",
    "Candidate",
    "CrossEncoderReranker",
    "FusedOrderReranker",
    "OverlapReranker",
    "Reranker",
    "build_reranker",
]

BatchHook = Callable[[int], None]


@dataclass(slots=True)
class Candidate:
    """One fused candidate handed to a reranker."""

    seq: int
    text: str
    fused: float
    semantic: float | None = None
    keyword: float | None = None
    vector: np.ndarray | None = None


class Reranker(Protocol):
    """Scores candidates for a query; higher is better. Blocking; checks the token per batch.

    *semantic_weight* is the bank's share of the cosine in a blend
    (:mod:`heed.memory.recall.ranking`); ``None`` keeps the reranker's own. Rerankers
    that blend nothing ignore it."""

    name: str

    def score(
        self,
        query: str,
        query_vector: np.ndarray,
        candidates: Sequence[Candidate],
        *,
        semantic_weight: float | None = None,
    ) -> list[float]: ...


#: What a reranker's :meth:`_Batched._scorer` returns: the scores of one batch.
BatchScorer = Callable[[Sequence[Candidate]], Iterable[float]]


@dataclass(frozen=True, slots=True)
class _Call:
    """One :meth:`Reranker.score` call's arguments."""

    query: str
    query_vector: np.ndarray
    candidates: Sequence[Candidate]
    semantic_weight: float | None


def _top_fused(candidates: Sequence[Candidate]) -> float:
    """The highest fused score (1.0 when none is above zero): what scales it to [0, 1]."""
    return max((c.fused for c in candidates), default=1.0) or 1.0


class _Batched:
    """A reranker scoring its candidates batch by batch: the token is checked (and
    *before_batch* called) before each batch; a subclass says how a batch scores."""

    name = "base"

    def __init__(self, batch_size: int = 32, before_batch: BatchHook | None = None) -> None:
        self.batch_size = batch_size
        self.before_batch = before_batch

    def _batches(self, candidates: Sequence[Candidate]) -> Any:
        for start in range(0, len(candidates), self.batch_size):
            raise_if_cancelled()
            if self.before_batch is not None:
                self.before_batch(start)
                raise_if_cancelled()
            yield candidates[start : start + self.batch_size]

    def score(
        self,
        query: str,
        query_vector: np.ndarray,
        candidates: Sequence[Candidate],
        *,
        semantic_weight: float | None = None,
    ) -> list[float]:
        """See :class:`Reranker`: the candidates' scores, in their order."""
        scorer = self._scorer(_Call(query, query_vector, candidates, semantic_weight))
        out: list[float] = []
        for batch in self._batches(candidates):
            out.extend(scorer(batch))
        return out

    def _scorer(self, call: _Call) -> BatchScorer:
        """How a batch of *call*'s candidates scores (what it needs of them all, such as
        their top score, is worked out here, once)."""
        raise NotImplementedError


class FusedOrderReranker(_Batched):
    """Keeps the fused order: the score is the RRF score scaled to [0, 1]."""

    name = "none"

    def _scorer(self, call: _Call) -> BatchScorer:
        top = _top_fused(call.candidates)
        return lambda batch: (c.fused / top for c in batch)


class BlendReranker(_Batched):
    """``alpha * cosine + (1 - alpha) * normalized BM25`` (see the module docstring)."""

    name = "blend"

    def __init__(self, alpha: float = 0.5, rrf_weight: float = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.alpha = alpha
        self.rrf_weight = rrf_weight

    def _scorer(self, call: _Call) -> BatchScorer:
        top_kw = max((c.keyword or 0.0 for c in call.candidates), default=0.0) or 1.0
        top_fused = _top_fused(call.candidates)
        alpha = self.alpha if call.semantic_weight is None else call.semantic_weight
        query_vector = call.query_vector

        def scores(batch: Sequence[Candidate]) -> Iterator[float]:
            for c in batch:
                cosine = (
                    float(c.vector @ query_vector) if c.vector is not None else (c.semantic or 0.0)
                )
                keyword = (c.keyword or 0.0) / top_kw
                value = alpha * cosine + (1 - alpha) * keyword
                yield value + self.rrf_weight * c.fused / top_fused

        return scores


class OverlapReranker(_Batched):
    """Fused score (scaled to [0, 1]) plus ``weight`` times the share of query terms in the text."""

    name = "overlap"

    def __init__(self, weight: float = 0.5, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.weight = weight

    def _scorer(self, call: _Call) -> BatchScorer:
        terms = {t[:5] for t in keyword_terms(call.query)}
        top = _top_fused(call.candidates)

        def scores(batch: Sequence[Candidate]) -> Iterator[float]:
            for c in batch:
                words = {w[:5] for w in keyword_terms(c.text, limit=512)}
                share = len(terms & words) / len(terms) if terms else 0.0
                yield c.fused / top + self.weight * share

        return scores


class CrossEncoderReranker(_Batched):
    """An ONNX cross-encoder (e.g. ms-marco-MiniLM) loaded from a local directory.

    The directory holds ``model.onnx`` and ``tokenizer.json``; the model takes
    ``input_ids``/``attention_mask`` (and ``token_type_ids`` if declared) for
    (query, passage) pairs and returns one logit per pair.
    """

    name = "cross-encoder"

    def __init__(self, model_dir: Path, max_length: int = 256, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        import onnxruntime as ort
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        tokenizer.enable_truncation(max_length=max_length)
        tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        self._tokenizer = tokenizer
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.log_severity_level = 3
        self._session = ort.InferenceSession(
            str(model_dir / "model.onnx"), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._inputs = {i.name for i in self._session.get_inputs()}

    def _scorer(self, call: _Call) -> BatchScorer:
        return lambda batch: self._logits(call.query, batch)

    def _logits(self, query: str, batch: Sequence[Candidate]) -> list[float]:
        """The model's relevance of each (query, passage) pair, squashed to (0, 1)."""
        encodings = self._tokenizer.encode_batch([(query, c.text) for c in batch])
        feeds: dict[str, Any] = {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
        }
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.array([e.type_ids for e in encodings], dtype=np.int64)
        logits = np.asarray(self._session.run(None, feeds)[0]).reshape(len(batch), -1)[:, -1]
        scores: list[float] = (1.0 / (1.0 + np.exp(-logits))).tolist()
        return scores


def build_reranker(name: str, model_dir: Path | None = None, **kwargs: Any) -> Reranker:
    """The reranker named *name*; a configured model directory selects the cross-encoder."""
    if model_dir is not None:
        return CrossEncoderReranker(model_dir, **kwargs)
    if name == "none":
        return FusedOrderReranker(**kwargs)
    if name == "blend":
        return BlendReranker(**kwargs)
    if name == "overlap":
        return OverlapReranker(**kwargs)
    raise ValueError(f"unknown reranker {name!r}: expected none, blend, overlap or a model dir")
