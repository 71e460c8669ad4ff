"""Diagnostics for benchmarks and tests (mounted only with ``HEED_ENABLE_DIAGNOSTICS=1``).

``POST /v1/_diag/burn`` burns CPU in an offloaded thread inside a lane slot, the
way a rerank does, and records when the work and the slot really ended, so a
client can measure how long after its disconnect the server stopped working.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from typing import Literal

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, Field

from heed.api.input_rules import IdPath
from heed.api.routing import HeedRoute
from heed.runtime import current_context, raise_if_cancelled, run_in_thread

router = APIRouter(prefix="/v1/_diag", tags=["diagnostics"], route_class=HeedRoute)

_MAX_RECORDS = 10_000


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


def _records(request: Request) -> OrderedDict[str, BurnRecord]:
    records: OrderedDict[str, BurnRecord] = request.app.state.burn_records
    return records


def _burn(record: BurnRecord, spec: BurnRequest) -> None:
    token = current_context().token
    record.started_at = time.monotonic()
    cpu_start = time.thread_time()
    end = record.started_at + spec.seconds
    chunk = spec.chunk_ms / 1000
    try:
        while time.monotonic() < end:
            chunk_end = time.monotonic() + chunk
            while time.monotonic() < chunk_end:
                sum(i * i for i in range(200))
            if token.cancelled and spec.ignore_token_ms:
                stubborn_end = (
                    token.cancelled_at or time.monotonic()
                ) + spec.ignore_token_ms / 1000
                while time.monotonic() < stubborn_end:
                    sum(i * i for i in range(200))
            raise_if_cancelled()
        record.outcome = "completed"
    except BaseException:
        record.outcome = "cancelled"
        raise
    finally:
        record.stopped_at = time.monotonic()
        record.cpu_seconds = time.thread_time() - cpu_start


@router.post("/burn")
async def burn(spec: BurnRequest, request: Request) -> BurnRecord:
    """Burn CPU in a lane slot; cancelled when the client disconnects."""
    records = _records(request)
    record = BurnRecord(id=spec.id)
    records[spec.id] = record
    while len(records) > _MAX_RECORDS:
        records.popitem(last=False)
    lane = request.app.state.services.lanes[spec.lane]
    try:
        async with lane.slot():
            await run_in_thread(_burn, record, spec)
    finally:
        record.slot_released_at = time.monotonic()
    return record


@router.get("/burn/{burn_id}")
async def get_burn(burn_id: IdPath, request: Request) -> BurnRecord:
    record = _records(request).get(burn_id)
    if record is None:
        raise HTTPException(404, f"no burn with id {burn_id!r}")
    return record
