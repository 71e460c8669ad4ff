"""Async operations: list, get, cancel, retry, delete (``/v1/default/banks/{bank_id}/operations``).

Operations are a bank's runs of the kinds
:data:`heed.memory.bank_runs.OPERATION_KINDS` names
(retains, consolidations, mental-model refreshes, transfers); their phases map onto Hindsight's
statuses (queued: pending; running and cancelling: processing; cancelled; completed; failed and
interrupted: failed). ``phase`` carries heed's own. ``progress`` is the last progress the run
reported, as Hindsight's ``OperationProgress``: a consolidation knows no total (``null``) and
gives its counters in ``detail``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal

from fastapi import APIRouter, Depends

from heed.api.deps import MemoryDep, RetainOperationsDep
from heed.api.input_rules import IdPath
from heed.api.openapi import CONFLICT
from heed.api.paging import PageQuery, page_query
from heed.api.routing import HeedRoute
from heed.api.wire import memory as wire
from heed.memory.bank_runs import CONSOLIDATION_KIND, RETAIN_KIND, status_of
from heed.memory.retain.operations import RetainOperations
from heed.runs.model import Run
from heed.runs.state import is_terminal

router = APIRouter(
    prefix="/v1/default/banks/{bank_id}/operations", tags=["operations"], route_class=HeedRoute
)

OperationStatus = Literal["pending", "processing", "completed", "failed", "cancelled"]
OperationsPage = Annotated[PageQuery, Depends(page_query(20))]
"""``limit`` 1 to 1000, default 20, and ``offset``."""


def _iso(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, UTC).isoformat() if ts is not None else None


#: The stage a run's progress is in when its events name none (the kind has one).
_STAGE: Final = {RETAIN_KIND: "writing_documents", CONSOLIDATION_KIND: "consolidating"}


async def _progress(operations: RetainOperations, run: Run) -> wire.OperationProgressOut | None:
    """The run's last progress (Hindsight keeps it once the operation ended); a finished
    retain's is its documents written. ``None`` before the run reported any."""
    if is_terminal(run) and run.kind == RETAIN_KIND:
        if not run.result:
            return None
        n = int(run.result.get("documents", 0))
        return wire.OperationProgressOut(
            stage="done", at=_iso(run.finished_at) or "", processed=n, total=n
        )
    latest = await operations.progress(run)
    if latest is None:
        return None
    return wire.OperationProgressOut(
        stage=latest.stage or _STAGE.get(run.kind, "processing"),
        at=_iso(latest.at) or "",
        processed=latest.processed,
        total=latest.total,
        detail=latest.detail or None,
    )


def _updated(run: Run) -> str | None:
    return _iso(run.finished_at or run.cancelled_at or run.started_at or run.created_at)


def _error(run: Run) -> str | None:
    if run.error:
        return run.error
    if run.cancel_reason and status_of(run) == "cancelled":
        return f"cancelled: {run.cancel_reason}"
    return None


async def _operation_fields(operations: RetainOperations, run: Run) -> dict[str, Any]:
    """What an operation's list entry and its status answer both say of *run*, by wire
    name (its progress read from its journal)."""
    return {
        "id": run.id,
        "operation_id": run.id,
        "task_type": run.kind,
        "operation_type": run.kind,
        "updated_at": _updated(run),
        "status": status_of(run),
        "error_message": _error(run),
        "progress": await _progress(operations, run),
    }


@router.get("")
async def list_operations(
    bank_id: IdPath,
    engine: MemoryDep,
    operations: RetainOperationsDep,
    page: OperationsPage,
    status: OperationStatus | None = None,
) -> wire.OperationsListResponse:
    """The bank's operations, newest first."""
    bank = await engine.get_bank(bank_id)
    total, runs = await operations.list(bank, status, offset=page.offset, limit=page.limit)
    return wire.OperationsListResponse(
        bank_id=bank_id,
        total=total,
        limit=page.limit,
        offset=page.offset,
        operations=[
            wire.OperationResponse(
                **await _operation_fields(operations, run),
                items_count=int(run.summary.get("items_count") or 0),
                created_at=_iso(run.created_at) or "",
            )
            for run in runs
        ],
    )


@router.get("/{operation_id}")
async def get_operation(
    bank_id: IdPath, operation_id: IdPath, engine: MemoryDep, operations: RetainOperationsDep
) -> wire.OperationStatusResponse:
    """One operation's status (``phase`` is heed's finer-grained run phase)."""
    bank = await engine.get_bank(bank_id)
    run = await operations.get(bank, operation_id)
    return wire.OperationStatusResponse(
        **await _operation_fields(operations, run),
        created_at=_iso(run.created_at),
        completed_at=_iso(run.finished_at),
        result_metadata=run.result,
        phase=run.phase,
    )


@router.delete("/{operation_id}")
async def cancel_operation(
    bank_id: IdPath, operation_id: IdPath, engine: MemoryDep, operations: RetainOperationsDep
) -> wire.CancelOperationResponse:
    """Cancel a pending or running operation; idempotent. A running one goes
    through ``cancelling`` (status ``processing``) until its worker stopped."""
    bank = await engine.get_bank(bank_id)
    run = await operations.cancel(bank, operation_id)
    return wire.CancelOperationResponse(
        success=True,
        message=f"operation {operation_id!r} is {run.phase}",
        operation_id=run.id,
        status=status_of(run),
    )


@router.post("/{operation_id}/retry", responses=CONFLICT)
async def retry_operation(
    bank_id: IdPath, operation_id: IdPath, engine: MemoryDep, operations: RetainOperationsDep
) -> wire.RetryOperationResponse:
    """Retry a failed or cancelled retain operation: a new operation with the same input
    (its id is ``operation_id``). 409 for one pending, running or completed, or of another
    kind (a consolidation or a refresh is started again by its own route)."""
    bank = await engine.get_bank(bank_id)
    run = await operations.retry(bank, operation_id)
    return wire.RetryOperationResponse(
        success=True,
        message=f"operation {operation_id!r} retried as {run.id!r}",
        operation_id=run.id,
    )


@router.delete("/{operation_id}/delete", responses=CONFLICT)
async def delete_operation(
    bank_id: IdPath, operation_id: IdPath, engine: MemoryDep, operations: RetainOperationsDep
) -> wire.DeleteOperationResponse:
    """Remove a finished (completed, failed or cancelled) operation with its journal and
    input; 409 for one still pending or running (cancel it first)."""
    bank = await engine.get_bank(bank_id)
    run = await operations.delete(bank, operation_id)
    return wire.DeleteOperationResponse(
        success=True, message=f"operation {operation_id!r} deleted", operation_id=run.id
    )
