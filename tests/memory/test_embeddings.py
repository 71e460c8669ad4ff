"""The local embedder: batches bounded by padded tokens, the same vectors however batched."""

from __future__ import annotations

import numpy as np

from heed.memory.embeddings import OnnxMiniLM


def _batches(embedder: OnnxMiniLM, texts: list[str]) -> tuple[np.ndarray, list[int]]:
    starts: list[int] = []
    embedder._before_batch = starts.append
    return embedder.embed(texts), starts


def test_a_batch_holds_short_texts_together_and_a_long_one_alone() -> None:
    embedder = OnnxMiniLM(batch_size=16, batch_tokens=64)
    short = [f"Ana planted {n} tulips." for n in range(10)]  # about 8 tokens each
    long = "Ben repaired the fence along the garden path, " * 12  # over 64 tokens
    vectors, starts = _batches(embedder, [long, *short])
    # Sorted by length: the ten short texts fit 64 padded tokens in fewer batches than
    # texts; the long one is a batch of its own, last.
    assert 2 <= len(starts) <= 4
    assert starts[-1] == 10
    alone = np.stack([embedder.embed([text])[0] for text in [long, *short]])
    assert np.allclose(vectors, alone, atol=1e-5)  # padding is masked out
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_batch_size_bounds_a_batch_of_tiny_texts() -> None:
    embedder = OnnxMiniLM(batch_size=4, batch_tokens=10_000)
    _, starts = _batches(embedder, ["hi"] * 10)
    assert starts == [0, 4, 8]
