"""The events a webhook can subscribe to, and the one map from run kinds to them.

Every event is the end of a run of a bank (a run grouped under ``bank:<ref>``: retain
operations, file retains in async mode, consolidations, streamed reflects, mental-model
refreshes). When such a run becomes terminal (completed, failed, cancelled or interrupted),
it is :data:`RUN_COMPLETED`, and, for a kind in :data:`KIND_EVENTS`, that kind's event too.
Each carries the run's Hindsight status (``completed``, ``failed``, ``cancelled``): a
subscriber reads ``data.status``, not the event's name, to know how it ended.

``memory_defense.triggered``, which Hindsight also names, is not implemented by heed
(:data:`NOT_IMPLEMENTED`): subscribing to it is refused by name.

An event's body is small and stored once (:class:`~heed.webhooks.models.Event`), however
many webhooks it goes to: the run's ids, status and times, its error (at most
:data:`MAX_ERROR_CHARS` characters) and a summary of its result, the result's scalar entries
(ids, counts, flags, texts of at most :data:`MAX_TEXT_CHARS` characters; at most
:data:`MAX_RESULT_FIELDS` of them). Lists and maps (a retain's document ids, an extraction
report) are left out: a subscriber that wants them reads the operation
(``GET .../operations/{operation_id}``). A body is at most :data:`MAX_BODY_BYTES` bytes.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any, Final

from heed.memory.bank_runs import BANK_PREFIX, status_of_phase
from heed.runs.model import Run

__all__ = [
    "BANK_PREFIX",
    "EVENT_TYPES",
    "KIND_EVENTS",
    "MAX_BODY_BYTES",
    "MAX_ERROR_CHARS",
    "MAX_RESULT_FIELDS",
    "MAX_TEXT_CHARS",
    "NOT_IMPLEMENTED",
    "RUN_COMPLETED",
    "bank_ref_of",
    "event_body",
    "event_id",
    "events_of",
    "result_summary",
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
#: Most entries of a run's result an event carries.
MAX_RESULT_FIELDS: Final = 16
#: Longest text value of a result an event carries (a longer one is left out), and longest key.
MAX_TEXT_CHARS: Final = 256
MAX_KEY_CHARS: Final = 64
#: Longest error an event carries (a longer one is cut, marked with an ellipsis).
MAX_ERROR_CHARS: Final = 1000
#: The largest body an event can have (what the bounds above add up to, with room to spare).
MAX_BODY_BYTES: Final = 8192


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
    """The JSON body sent (and signed) for *event_type* of *run*: fixed when the run ends.

    ``{"id", "type", "created_at", "bank_id", "data": {"run_id", "operation_id", "kind",
    "status", "phase", "error", "result", "started_at", "finished_at"}}`` (times ISO 8601;
    ``result``: :func:`result_summary`). At most :data:`MAX_BODY_BYTES` bytes; never raises
    for any run (it is written in the transaction that ends the run).
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
            "error": _cut(run.error, MAX_ERROR_CHARS),
            "result": result_summary(run.result),
            "started_at": _iso(run.started_at),
            "finished_at": _iso(run.finished_at),
        },
    }
    return json.dumps(body, separators=(",", ":"), sort_keys=True)


def result_summary(result: object) -> dict[str, Any] | None:
    """The scalar entries of a run's *result* (see the module docstring), or ``None``."""
    if not isinstance(result, dict):
        return None
    kept: dict[str, Any] = {}
    for key, value in result.items():
        if len(kept) >= MAX_RESULT_FIELDS:
            break
        if not isinstance(key, str) or len(key) > MAX_KEY_CHARS:
            continue
        if isinstance(value, float) and not math.isfinite(value):
            continue
        scalar = value is None or isinstance(value, bool | int | float)
        if scalar or (isinstance(value, str) and len(value) <= MAX_TEXT_CHARS):
            kept[key] = value
    return kept


def _cut(text: str | None, limit: int) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return text[: limit - 1] + "\u2026"


def _iso(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, UTC).isoformat() if ts is not None else None
