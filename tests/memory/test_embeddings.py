"""The local embedder: batches bounded by padded tokens, the same vectors however batched;
background embedding holds a core briefly while users wait for one."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np

from heed.memory.embeddings import OnnxMiniLM
from heed.memory.models import PreparedUnit
from heed.memory.retain.prepare import CONTENDED_PIECE, LEND_AFTER_QUIET, embed_in_slots
from heed.runtime import Lane, Lanes


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


class _Counting:
    """An embedder that records how many texts each call embedded."""

    dim = 4

    def __init__(self) -> None:
        self.calls: list[int] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(len(texts))
        return np.ones((len(texts), self.dim), dtype=np.float32) / 2


def _units(count: int) -> list[PreparedUnit]:
    return [
        PreparedUnit(
            str(n), f"unit {n}", f"unit {n}", "world", None, 0, None, None, None, {}, [], []
        )
        for n in range(count)
    ]


async def test_background_embedding_holds_a_core_briefly_while_users_wait_for_one() -> None:
    retain = Lane("retain", capacity=3, max_queue=10, cpu_bound=True, background_max_defer=0.05)
    Lanes([retain], cores=2)
    embedder = _Counting()
    release = asyncio.Event()

    async def user() -> None:
        async with retain.slot():
            await release.wait()

    users = [asyncio.create_task(user()) for _ in range(2)]  # users' work holds both cores
    await asyncio.sleep(0.01)
    units = _units(20)
    await embed_in_slots(units, embedder, None, retain, background=True)  # granted by aging
    assert embedder.calls == [CONTENDED_PIECE, CONTENDED_PIECE, 20 - 2 * CONTENDED_PIECE]
    assert all(u.embedding is not None for u in units)
    release.set()
    await asyncio.gather(*users)
    # Nobody waits now (and nobody has for a while): one piece, in the slot kept for users.
    embedder.calls.clear()
    await asyncio.sleep(LEND_AFTER_QUIET)
    await embed_in_slots(_units(20), embedder, None, retain, background=True)
    assert embedder.calls == [20]
