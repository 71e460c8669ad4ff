"""Synthetic memories for the transfer benchmarks: dialogue turns of seven speakers with
random unit vectors of the default embedder's size (nothing is embedded)."""

from __future__ import annotations

import uuid

import numpy as np

from heed.transfer.rows import UnitRow

MODEL, DIM = "onnx:all-MiniLM-L6-v2-int8", 384
NOW = "2024-05-01T10:00:00+00:00"
TOPICS = ("garden", "kayak", "violin", "harbour", "lantern", "meadow", "orchard", "pepper")
SPEAKERS = 7


def turn(i: int, document_id: str, chunk_id: str | None, vector: np.ndarray) -> UnitRow:
    """The *i*-th turn of a synthetic conversation, a memory of *document_id* (*vector* is
    normalised here)."""
    text = (
        f"Speaker{i % SPEAKERS}: turn {i}, about the {TOPICS[i % len(TOPICS)]} "
        f"and the {TOPICS[(i // 3) % len(TOPICS)]}, said on a quiet afternoon."
    )
    return UnitRow(
        id=str(uuid.uuid4()),
        document_id=document_id,
        chunk_id=chunk_id,
        text=text,
        index_text=text,
        fact_type="world",
        context="a synthetic conversation",
        occurred_start=NOW,
        occurred_end=NOW,
        mentioned_at=NOW,
        metadata={},
        tags=["synthetic"],
        created_at=NOW,
        updated_at=None,
        token_count=20,
        consolidation_state=None,
        source_ids=[],
        proof_count=None,
        history=[],
        vector=vector / np.linalg.norm(vector),
    )
