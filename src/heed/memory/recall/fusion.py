"""Reciprocal rank fusion of the retrieval arms' ranked lists."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["RRF_K", "reciprocal_rank_fusion"]

RRF_K = 60


def reciprocal_rank_fusion(
    ranked: Mapping[str, Sequence[tuple[int, float]]],
    weights: Mapping[str, float] | None = None,
    k: int = RRF_K,
) -> list[tuple[int, float]]:
    """Fuse ranked ``(seq, score)`` lists: ``sum(weight / (k + rank))``, best first.

    Ties keep the order in which units first appeared (arms in mapping order).
    """
    scores: dict[int, float] = {}
    for arm, hits in ranked.items():
        weight = 1.0 if weights is None else weights.get(arm, 1.0)
        if weight == 0:
            continue
        for rank, (seq, _score) in enumerate(hits, start=1):
            scores[seq] = scores.get(seq, 0.0) + weight / (k + rank)
    return sorted(scores.items(), key=lambda kv: -kv[1])
