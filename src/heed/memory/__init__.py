"""The memory engine: banks of memory units, retain, and a cancellable hybrid recall.

:func:`build_memory_engine` wires the default pieces from settings around a
given store: the MiniLM embedder (shared by every engine of the process), the
reranker and the token counter. The store comes from the composition root
(:mod:`heed.services`): the engine only knows the :class:`MemoryStore` protocol.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from heed.memory.embeddings import Embedder, OnnxMiniLM, OpenAIEmbedder, TokenCounter
from heed.memory.engine import BANK_DELETED, MemoryEngine, RetainSummary
from heed.memory.learning.extraction import Learning
from heed.memory.models import InvalidInput, NotFound
from heed.memory.recall.rerank import build_reranker

if TYPE_CHECKING:
    from heed.llm.base import ChatProvider
    from heed.memory.store import MemoryStore
    from heed.runtime import Lanes
    from heed.settings import Settings

__all__ = [
    "BANK_DELETED",
    "InvalidInput",
    "Learning",
    "MemoryEngine",
    "NotFound",
    "RetainSummary",
    "build_embedder",
    "build_learning",
    "build_memory_engine",
    "shared_minilm",
    "shared_token_counter",
]


@functools.cache
def shared_minilm(batch_size: int = 16) -> OnnxMiniLM:
    """The process-wide MiniLM embedder (loading it costs about half a second)."""
    return OnnxMiniLM(batch_size=batch_size)


@functools.cache
def shared_token_counter() -> TokenCounter:
    """The process-wide token counter."""
    return TokenCounter()


def build_embedder(settings: Settings) -> Embedder:
    """The embedder the settings ask for."""
    if settings.embeddings_provider == "openai":
        key = settings.embeddings_api_key
        return OpenAIEmbedder(
            settings.embeddings_base_url,
            settings.embeddings_model,
            api_key=key.get_secret_value() if key else None,
            dim=settings.embeddings_dim,
        )
    if settings.embeddings_provider != "onnx":
        raise ValueError(
            f"HEED_EMBEDDINGS_PROVIDER must be onnx or openai, got {settings.embeddings_provider!r}"
        )
    return shared_minilm(settings.embeddings_batch_size)


def build_learning(settings: Settings, extractor: Callable[[], ChatProvider]) -> Learning:
    """How the engine learns, from settings: ``auto`` extraction (concise) and observations
    are on when an ``openai`` provider serves retain (``HEED_RETAIN_LLM_*``, else
    ``HEED_LLM_*``); the embedded model does neither unless asked (see the README)."""
    from heed.llm.factory import resolve

    remote = resolve(settings, "retain").provider == "openai"
    extraction = settings.retain_extraction
    if extraction == "auto":
        extraction = "concise" if remote else "off"
    observations = settings.observations == "on" or (settings.observations == "auto" and remote)
    return Learning(
        extraction_default=extraction,
        observations_default=observations,
        extractor=extractor,
        budget_per_hour=settings.llm_budget_tokens_per_hour,
        budget_per_day=settings.llm_budget_tokens_per_day,
    )


def build_memory_engine(
    settings: Settings,
    store: MemoryStore,
    lanes: Lanes,
    embedder: Embedder | None = None,
    learning: Learning | None = None,
) -> MemoryEngine:
    """A memory engine on *store* with the configured embedder and reranker."""
    return MemoryEngine(
        store,
        embedder or build_embedder(settings),
        build_reranker(settings.reranker, settings.reranker_model_dir),
        shared_token_counter(),
        lanes["recall"],
        lanes["retain"],
        max_query_tokens=settings.max_query_tokens,
        max_item_chars=settings.max_item_chars,
        vector_cache_bytes=settings.vector_cache_mb * 1024 * 1024,
        learning=learning,
        min_refresh_interval=settings.mental_model_min_refresh_interval_seconds,
    )
