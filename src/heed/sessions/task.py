"""Background tasks: runs of kind ``task`` owned by a session.

A task's payload names an ``action``:

- ``wait``: wait ``seconds`` (default 1), checking the token; a stand-in for
  slow background work in tests and demos;
- ``echo``: return ``content`` at once;
- ``retain``: retain ``content`` into the session's memory bank (a tool error
  result, not a failure, when there is no memory engine or no bank).

The run's result becomes the ``task_complete`` event and the wakeup summary.
Cancellation propagates (the run ends ``cancelled``).
"""

from __future__ import annotations

from typing import Any

from heed.runs.events import EventType
from heed.runs.kinds import RunContext
from heed.sessions.tools import TurnTools

__all__ = ["TaskRunner"]


class TaskRunner:
    """Executes ``task`` runs (register ``execute`` as the kind's executor)."""

    def __init__(self, tools: TurnTools, bank_of: Any) -> None:
        self._tools = tools
        self._bank_of = bank_of  # async (session_id) -> bank_id | None

    async def execute(self, rc: RunContext) -> dict[str, Any]:
        payload = rc.payload
        action = str(payload.get("action", "wait"))
        title = str(payload.get("title") or action)
        await rc.emit(EventType.PROGRESS, {"title": title, "action": action})
        if action == "wait":
            seconds = float(payload.get("seconds", 1.0))
            await rc.token.sleep(max(0.0, seconds))
            return {"title": title, "summary": f"waited {seconds:g} s"}
        if action == "echo":
            return {"title": title, "summary": str(payload.get("content", ""))}
        if action == "retain":
            bank_id = await self._bank_of(rc.run.session_id) if rc.run.session_id else None
            result = await self._tools.call(
                "retain",
                {"content": payload.get("content", "")},
                session_id=rc.run.session_id or "",
                tenant=rc.run.tenant,
                bank_id=bank_id,
            )
            return {"title": title, "ok": result.ok, "summary": result.content}
        raise ValueError(f"unknown task action {action!r}")
