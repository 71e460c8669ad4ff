"""Wire models of the diagnostics routes (:mod:`heed.api.routes.diagnostics`)."""

from __future__ import annotations

import uuid
from typing import Literal

from pydantic import BaseModel, Field

__all__ = ["BurnRecord", "BurnRequest"]


class BurnRequest(BaseModel):
    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    seconds: float = Field(default=5.0, gt=0, le=120)
    lane: Literal["recall", "reflect", "retain", "turn"] = "recall"
    chunk_ms: float = Field(default=1.0, gt=0, le=1000, description="work between checkpoints")
    ignore_token_ms: float = Field(
        default=0.0, ge=0, description="keep burning this long after a cancel before checking"
    )


class BurnRecord(BaseModel):
    id: str
    started_at: float | None = None
    """time.monotonic() of the worker thread's start (system-wide clock on Linux)."""
    stopped_at: float | None = None
    slot_released_at: float | None = None
    outcome: str | None = None
    cpu_seconds: float | None = None
