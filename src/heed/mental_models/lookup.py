"""How a bank's mental models are found for a query: the ranking (:func:`rank_models`) and
:class:`MentalModelLookup`, which reflect consults before anything else (through its port,
:class:`heed.reflect.ports.MentalModelSource`) and which refreshes and the knowledge base use
to search and embed models.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

import numpy as np

from heed.memory.embeddings import Embedder
from heed.memory.models import Bank
from heed.memory.recall.query import keyword_terms
from heed.mental_models.store import MentalModelStore
from heed.mental_models.values import MentalModel
from heed.runtime import raise_if_cancelled, run_in_thread

__all__ = [
    "EMBED_CHARS",
    "MIN_COSINE",
    "RRF_K",
    "MentalModelLookup",
    "embedding_text",
    "rank_models",
]

#: Characters of content an embedding reads (MiniLM reads 256 tokens anyway).
EMBED_CHARS: Final = 2000
#: Reciprocal-rank-fusion constant of :func:`rank_models` (as recall's fusion).
RRF_K: Final = 60
#: Cosine at or above which a model counts as found by meaning alone (MiniLM: unrelated
#: sentences score about 0.0-0.2).
MIN_COSINE: Final = 0.3


def embedding_text(model: MentalModel) -> str:
    """What a model's embedding reads: its name, its question and the start of its content."""
    return f"{model.name}. {model.source_query}\n{model.content[:EMBED_CHARS]}".strip()


def rank_models(
    query: str, query_vector: np.ndarray | None, models: Sequence[MentalModel]
) -> list[tuple[MentalModel, float]]:
    """The *models* a query finds, best first, with a score in 0..1 (1: first in both arms).

    Two arms fused by reciprocal rank (k :data:`RRF_K`): meaning (the cosine of the query
    and the model's stored embedding; a model counts from :data:`MIN_COSINE`) and words
    (how many of the query's keyword terms the model's name, question and content hold).
    A model neither arm finds is left out. Blocking CPU work: call it in the offload."""
    terms = keyword_terms(query)
    semantic: list[tuple[float, int]] = []
    lexical: list[tuple[float, int]] = []
    for i, model in enumerate(models):
        if i % 64 == 0:
            raise_if_cancelled()
        vector = model.embedding
        if query_vector is not None and vector is not None and vector.shape == query_vector.shape:
            cosine = float(vector @ query_vector)
            if cosine >= MIN_COSINE:
                semantic.append((cosine, i))
        if terms:
            words = set(keyword_terms(f"{model.name} {model.source_query} {model.content}", 4096))
            overlap = sum(1 for t in terms if t in words)
            if overlap:
                lexical.append((overlap / len(terms), i))
    fused: dict[int, float] = {}
    for arm in (semantic, lexical):
        arm.sort(key=lambda pair: (-pair[0], pair[1]))
        for rank, (_, i) in enumerate(arm):
            fused[i] = fused.get(i, 0.0) + 1.0 / (RRF_K + rank + 1)
    best = 2.0 / (RRF_K + 1)
    ranked = sorted(fused.items(), key=lambda pair: (-pair[1], pair[0]))
    return [(models[i], min(1.0, round(score / best, 6))) for i, score in ranked]


def _unit_vector(matrix: np.ndarray) -> np.ndarray:
    vector = np.asarray(matrix[0], dtype=np.float32)
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 and math.isfinite(norm) else vector


class MentalModelLookup:
    """How reflect consults a bank's mental models (see :mod:`heed.reflect.agent`): the
    models with content that a query finds (:func:`rank_models`), best first."""

    def __init__(self, store: MentalModelStore, embedder: Embedder) -> None:
        self.store = store
        self.embedder = embedder

    async def relevant(
        self, bank: Bank, query: str, exclude_ids: Sequence[str] = (), limit: int = 3
    ) -> list[MentalModel]:
        """Up to *limit* of *bank*'s models with content that *query* finds, except
        *exclude_ids*; none (and no embedding work) when the bank has none."""
        excluded = set(exclude_ids)
        models = await run_in_thread(self.store.mental_models, bank.ref, True)
        models = [m for m in models if m.content.strip() and m.id not in excluded]
        if not models:
            return []
        return [m for m, _ in (await self.search(query, models))[:limit]]

    async def search(
        self, query: str, models: Sequence[MentalModel]
    ) -> list[tuple[MentalModel, float]]:
        """:func:`rank_models` over *models* for *query*, its embedding made in the offload."""
        if not models:
            return []

        def ranked() -> list[tuple[MentalModel, float]]:
            vector = _unit_vector(self.embedder.embed([query]))
            return rank_models(query, vector, models)

        return await run_in_thread(ranked)

    async def embed(self, model: MentalModel) -> np.ndarray:
        """The embedding of *model* (:func:`embedding_text`), made in the offload."""
        return await run_in_thread(
            lambda: _unit_vector(self.embedder.embed([embedding_text(model)]))
        )
