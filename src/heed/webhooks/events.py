"""The events a webhook can subscribe to, and the one map from run kinds to them.

Every event is the end of a run of a bank (a run grouped under ``bank:<ref>``: retain
operations, file retains in async mode, consolidations, streamed reflects, mental-model
refreshes). When such a run becomes terminal (completed, failed, cancelled or interrupted),
it is :data:`RUN_COMPLETED`, and, for a kind in :data:`KIND_EVENTS`, that kind's event too.
Each carries the run's Hindsight status (``completed``, ``failed``, ``cancelled``): a
subscriber reads ``data.status``, not the event's name, to know how it ended.

``memory_defense.triggered``, which Hindsight also names, is not implemented by heed
(:data:`NOT_IMPLEMENTED`): subscribing to it is refused by name.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Final

from heed.memory.operations import status_of_phase
from heed.runs.model import Run

__all__ = [
    "BANK_PREFIX",
    "EVENT_TYPES",
    "KIND_EVENTS",
    "NOT_IMPLEMENTED",
    "RUN_COMPLETED",
    "bank_ref_of",
    "event_body",
    "event_id",
    "events_of",
]

RUN_COMPLETED: Final = "run.completed"
#: A kind of run -> the event its end is, besides :data:`RUN_COMPLETED`. The one place: a
#: new kind's event is added here (``mental_model_refresh`` works as soon as it is built).
KIND_EVENTS: Final[dict[str, str]] = {
    "retain": "retain.completed",
    "consolidation": "consolidation.completed",
    "mental_model_refresh": "mental_model.refreshed",
}
#: Every event heed sends, in a stable order.
EVENT_TYPES: Final = (*KIND_EVENTS.values(), RUN_COMPLETED)
#: Events Hindsight names that heed does not send.
NOT_IMPLEMENTED: Final = ("memory_defense.triggered",)
#: How a bank's runs are grouped (:func:`heed.memory.operations.bank_session`).
BANK_PREFIX: Final = "bank:"


def bank_ref_of(run: Run) -> str | None:
    """The ref of the bank whose run *run* is, or ``None`` (a chat turn, a task)."""
    if run.session_id is None or not run.session_id.startswith(BANK_PREFIX):
        return None
    return run.session_id[len(BANK_PREFIX) :]


def events_of(run: Run) -> list[str]:
    """The events the end of *run* is (its kind's, then ``run.completed``)."""
    kind_event = KIND_EVENTS.get(run.kind)
    return [kind_event, RUN_COMPLETED] if kind_event else [RUN_COMPLETED]


def event_id(run: Run, event_type: str) -> str:
    """The event's id: one per run and event type, the same for every subscriber."""
    return f"{run.id}:{event_type}"


def event_body(event_type: str, run: Run, bank_id: str, now: float) -> str:
    """The JSON body sent (and signed) for *event_type* of *run*: fixed when enqueued.

    ``{"id", "type", "created_at", "bank_id", "data": {"run_id", "operation_id", "kind",
    "status", "phase", "error", "result", "started_at", "finished_at"}}`` (times ISO 8601).
    """
    body: dict[str, Any] = {
        "id": event_id(run, event_type),
        "type": event_type,
        "created_at": _iso(now),
        "bank_id": bank_id,
        "data": {
            "run_id": run.id,
            "operation_id": run.id,
            "kind": run.kind,
            "status": status_of_phase(run.phase),
            "phase": run.phase,
            "error": run.error,
            "result": run.result,
            "started_at": _iso(run.started_at),
            "finished_at": _iso(run.finished_at),
        },
    }
    return json.dumps(body, separators=(",", ":"), sort_keys=True)


def _iso(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, UTC).isoformat() if ts is not None else None
