"""Diagnostics for benchmarks and tests (mounted only with ``HEED_ENABLE_DIAGNOSTICS=1``).

``POST /v1/_diag/burn`` burns CPU in an offloaded thread inside a lane slot, the
way a rerank does, and records when the work and the slot really ended, so a
client can measure how long after its disconnect the server stopped working.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, HTTPException

from heed.api.deps import BurnRecordsDep, ServicesDep
from heed.api.input_rules import IdPath
from heed.api.routing import HeedRoute
from heed.api.wire.diagnostics import BurnRecord, BurnRequest
from heed.runtime import current_context, raise_if_cancelled, run_in_thread

router = APIRouter(prefix="/v1/_diag", tags=["diagnostics"], route_class=HeedRoute)

_MAX_RECORDS = 10_000


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
async def burn(spec: BurnRequest, records: BurnRecordsDep, services: ServicesDep) -> BurnRecord:
    """Burn CPU in a lane slot; cancelled when the client disconnects."""
    record = BurnRecord(id=spec.id)
    records[spec.id] = record
    while len(records) > _MAX_RECORDS:
        records.popitem(last=False)
    lane = services.lanes[spec.lane]
    try:
        async with lane.slot():
            await run_in_thread(_burn, record, spec)
    finally:
        record.slot_released_at = time.monotonic()
    return record


@router.get("/burn/{burn_id}")
async def get_burn(burn_id: IdPath, records: BurnRecordsDep) -> BurnRecord:
    record = records.get(burn_id)
    if record is None:
        raise HTTPException(404, f"no burn with id {burn_id!r}")
    return record
