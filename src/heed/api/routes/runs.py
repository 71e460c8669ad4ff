"""Runs over HTTP: list, get, cancel, and the resumable journal stream.

- ``GET /v1/runs``: the caller's runs, oldest first, filtered by ``kind``, ``session_id``
  and ``active`` (not yet terminal: how a client that lost a stream or an MCP call finds
  the work it started);
- ``GET /v1/runs/{run_id}``: the run (404 if unknown or another tenant's).
- ``POST /v1/runs/{run_id}/cancel``: idempotent; returns the run. ``?wait=true``
  waits (up to ``timeout`` seconds, default 30) until the worker has stopped.
- ``GET /v1/runs/{run_id}/stream``: SSE. Each journal event is a frame with
  ``id: <seq>``, ``event: <type>`` and the event JSON as data. The cursor is
  ``?after=N`` or ``Last-Event-ID`` (malformed: 0). Replays retained events
  after the cursor, then tails live with no gap and no duplicate at the seam;
  a cursor older than the retained range gets an ``event: gap`` frame first;
  the stream ends after the terminal event; ``: heartbeat`` comments keep idle
  connections alive. An idle stream waits on the broker and reads nothing; past
  ``HEED_TENANT_MAX_STREAMS`` open streams of the tenant a new one gets 429.

Runs are shown without their payload (their input, read only by the worker that executes
them); ``summary`` is the small part of it each kind chooses to show. A listing leaves out
each run's ``result`` too; the run's own ``GET`` has it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from fastapi import APIRouter, Header, Query
from starlette.responses import StreamingResponse

from heed.api.deps import RunManagerDep, SettingsDep, StreamSlotsDep
from heed.api.input_rules import MAX_ID_CHARS, MAX_REASON_CHARS, IdPath, Limit
from heed.api.openapi import TOO_MANY, event_stream
from heed.api.routing import HeedRoute
from heed.api.sse import journal_frames, parse_cursor, sse_response
from heed.memory.bank_runs import OPERATION_KINDS
from heed.reflect.runs import REFLECT_KIND
from heed.runtime import current_context
from heed.sessions.service import TASK, TURN

router = APIRouter(prefix="/v1/runs", tags=["runs"], route_class=HeedRoute)


RunKind = Literal[
    "turn",
    "task",
    "reflect",
    "retain",
    "consolidation",
    "mental_model_refresh",
    "bank_export",
    "bank_import",
    "bank_clone",
]
"""Every registered kind of run, as a type, so the schema lists them (a test checks it
against the kinds :class:`heed.services.Services` registers)."""
if set(get_args(RunKind)) != {TURN, TASK, REFLECT_KIND, *OPERATION_KINDS}:  # pragma: no cover
    raise RuntimeError(f"RunKind {get_args(RunKind)} differs from the registered kinds")


@router.get("")
async def list_runs(
    manager: RunManagerDep,
    kind: RunKind | None = None,
    session_id: Annotated[str | None, Query(min_length=1, max_length=MAX_ID_CHARS)] = None,
    active: bool = False,
    limit: Limit = 100,
) -> dict[str, Any]:
    """The caller's runs, oldest first; ``active=true``: only those not yet terminal.
    Without their results (``GET /v1/runs/{id}`` has it): a listing's size follows the
    number of runs, not what each one produced."""
    runs = await manager.io.call(
        manager.store.list_runs,
        tenant=current_context().tenant,
        kind=kind,
        session_id=session_id,
        non_terminal=active,
        limit=limit,
        with_result=False,
    )
    listed = []
    for run in runs:
        public = run.to_public()
        del public["result"]
        listed.append(public)
    return {"runs": listed}


@router.get("/{run_id}")
async def get_run(run_id: IdPath, manager: RunManagerDep) -> dict[str, Any]:
    """The run's registry row."""
    run = await manager.get(run_id, tenant=current_context().tenant)
    return run.to_public()


@router.post("/{run_id}/cancel")
async def cancel_run(
    run_id: IdPath,
    manager: RunManagerDep,
    wait: bool = False,
    wait_seconds: float = Query(default=30.0, ge=0, le=600, alias="timeout"),
    reason: Annotated[str, Query(min_length=1, max_length=MAX_REASON_CHARS)] = (
        "cancelled by client"
    ),
) -> dict[str, Any]:
    """Cancel the run (idempotent); a terminal run is returned unchanged."""
    run = await manager.cancel(
        run_id, reason, tenant=current_context().tenant, wait=wait, wait_timeout=wait_seconds
    )
    return run.to_public()


@router.get(
    "/{run_id}/stream",
    response_class=StreamingResponse,
    responses={
        **event_stream(
            "The run's journal: one event per journal entry (`id`: its seq, `event`: its "
            "type, data: the event JSON), `gap` when the cursor is older than what is "
            "retained, and `: heartbeat` comments; ends after the terminal event."
        ),
        **TOO_MANY,
    },
)
async def stream_run(
    run_id: IdPath,
    manager: RunManagerDep,
    settings: SettingsDep,
    stream_slots: StreamSlotsDep,
    after: Annotated[str | None, Query(max_length=MAX_ID_CHARS)] = None,
    last_event_id: str | None = Header(default=None),
) -> Any:
    """The run's journal as SSE; see the module docstring."""
    tenant = current_context().tenant
    await manager.get(run_id, tenant=tenant)  # 404 first
    release = stream_slots.acquire(tenant)  # 429 past HEED_TENANT_MAX_STREAMS
    frames = journal_frames(
        manager.journal,
        run_id,
        parse_cursor(after, last_event_id),
        heartbeat=settings.stream_heartbeat_seconds,
        token=current_context().token,
    )
    return sse_response(frames, release=release)
