"""The tools a chat turn offers its model: ``recall``, ``retain`` and ``start_task``.

``recall`` and ``retain`` act on the session's memory bank through the memory
engine (:mod:`heed.memory`) when the server has one; without an engine, or
for a session bound to no bank, they return a clear tool error (the turn goes
on: the model reads the error like any tool result). ``start_task`` starts a
background run of kind ``task`` owned by the session; its completion wakes the
session (see :mod:`heed.sessions.service`).

A tool call never raises for a bad call: it returns ``ToolResult(ok=False,
content=<why>)``. Cancellation always propagates.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from heed.llm.base import ToolSpec
from heed.memory import MemoryEngine
from heed.runtime import reraise_cancellation

__all__ = ["NO_MEMORY_ENGINE", "TOOL_SPECS", "ToolResult", "TurnTools"]

log = logging.getLogger("heed.sessions.tools")

NO_MEMORY_ENGINE: Final = "no memory engine: this server has no memory engine configured"

TOOL_SPECS: Final = [
    ToolSpec(
        name="recall",
        description="Search the session's memory bank for facts relevant to a query.",
        parameters={
            "type": "object",
            "properties": {"query": {"type": "string", "description": "What to look for."}},
            "required": ["query"],
        },
    ),
    ToolSpec(
        name="retain",
        description="Store a fact or a document in the session's memory bank.",
        parameters={
            "type": "object",
            "properties": {"content": {"type": "string", "description": "What to remember."}},
            "required": ["content"],
        },
    ),
    ToolSpec(
        name="start_task",
        description=(
            "Start background work (action: 'retain' a document, or 'wait' N seconds); "
            "you are woken with its result when it completes."
        ),
        parameters={
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "action": {"type": "string", "enum": ["retain", "wait", "echo"]},
                "content": {"type": "string"},
                "seconds": {"type": "number"},
            },
            "required": ["action"],
        },
    ),
]


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool returned: ``ok`` false means a tool error the model should read."""

    ok: bool
    content: str


#: ``start_task(session_id, tenant, payload) -> task run id``
TaskStarter = Callable[[str, str, dict[str, Any]], Awaitable[str]]


class TurnTools:
    """Runs the turn tools for one server. *memory* returns the engine or ``None``."""

    def __init__(self, memory: MemoryEngine | None, start_task: TaskStarter) -> None:
        self._memory = memory
        self._start_task = start_task

    async def call(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        session_id: str,
        tenant: str,
        bank_id: str | None,
    ) -> ToolResult:
        """Run one tool call; see the module docstring."""
        try:
            if name == "recall":
                return await self._recall(arguments, tenant, bank_id)
            if name == "retain":
                return await self._retain(str(arguments.get("content", "")), tenant, bank_id)
            if name == "start_task":
                run_id = await self._start_task(session_id, tenant, dict(arguments))
                return ToolResult(True, json.dumps({"task_run_id": run_id, "status": "started"}))
            return ToolResult(False, f"unknown tool {name!r}")
        except Exception as exc:
            reraise_cancellation(exc)
            log.info("tool %s failed in session %s", name, session_id, exc_info=True)
            return ToolResult(False, f"{name} failed: {type(exc).__name__}: {exc}")

    def _engine_and_bank(self, bank_id: str | None) -> tuple[MemoryEngine, str] | ToolResult:
        engine = self._memory
        if engine is None:
            return ToolResult(False, NO_MEMORY_ENGINE)
        if not bank_id:
            return ToolResult(False, "this session is not bound to a memory bank")
        return engine, bank_id

    async def _recall(
        self, arguments: dict[str, Any], tenant: str, bank_id: str | None
    ) -> ToolResult:
        found = self._engine_and_bank(bank_id)
        if isinstance(found, ToolResult):
            return found
        engine, bank_name = found
        from heed.memory.models import RecallQuery

        bank = await engine.get_bank(bank_name, tenant=tenant)
        query = RecallQuery(query=str(arguments.get("query", "")), max_tokens=1024)
        outcome = await engine.recall(bank, query)
        lines = [f"- {hit.unit.text}" for hit in outcome.hits[:10]]
        return ToolResult(True, "\n".join(lines) if lines else "(nothing found)")

    async def _retain(self, content: str, tenant: str, bank_id: str | None) -> ToolResult:
        found = self._engine_and_bank(bank_id)
        if isinstance(found, ToolResult):
            return found
        if not content.strip():
            return ToolResult(False, "retain needs non-empty content")
        engine, bank_name = found
        from heed.memory.models import RetainItem

        bank = await engine.get_bank(bank_name, tenant=tenant)
        summary = await engine.retain(bank, [RetainItem(content=content)])
        return ToolResult(True, json.dumps({"units": getattr(summary, "units", None)}))
