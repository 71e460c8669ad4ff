"""The tools a chat turn offers its model: ``recall``, ``retain`` and ``start_task``.

``recall`` and ``retain`` act on the session's memory bank through the memory
engine (:mod:`heed.memory`) when the server has one; without an engine, or
for a session bound to no bank, they return a clear tool error (the turn goes
on: the model reads the error like any tool result). ``start_task`` starts a
background run of kind ``task`` owned by the session; its completion wakes the
session (see :mod:`heed.sessions.service`).

A tool call never raises for a bad call: it returns ``ToolResult(ok=False,
content=<why>)``. Cancellation always propagates.

:meth:`TurnTools.ground` is the recall a turn of a bank-bound session makes by itself
before its first model call (see :mod:`heed.sessions.turn`): the same recall as the tool,
its memories one per line with their dates.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from heed.llm.base import ToolSpec
from heed.memory import MemoryEngine
from heed.memory.models import RecallOutcome, RecallQuery, RetainItem
from heed.runtime import reraise_cancellation

__all__ = ["NO_MEMORY_ENGINE", "TOOL_SPECS", "Grounding", "ToolResult", "TurnTools"]

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


@dataclass(frozen=True, slots=True)
class Grounding:
    """What a turn's own recall found: the tool result it shows, and what it cost."""

    result: ToolResult
    memories: int
    seconds: float


#: Memories a recall hands the model (the tool's and a turn's own).
RECALL_LINES: Final = 10


def memory_lines(outcome: RecallOutcome) -> str:
    """Recalled memories as prompt lines, each with the date it happened (or was said)."""
    lines = []
    for hit in outcome.hits[:RECALL_LINES]:
        when = hit.unit.occurred_start or hit.unit.mentioned_at
        lines.append(f"- {hit.unit.text}" + (f" ({when[:10]})" if when else ""))
    return "\n".join(lines) if lines else "(nothing found)"


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

    async def ground(self, query: str, tenant: str, bank_id: str | None) -> Grounding | None:
        """The recall a turn makes before its first model call, or ``None`` when the session
        has no bank (or the server no engine). A failed recall is a tool error, not a failed
        turn; cancellation propagates."""
        if self._memory is None or not bank_id:
            return None
        started = time.perf_counter()
        try:
            outcome = await self._recall_outcome(query, tenant, bank_id)
        except Exception as exc:
            reraise_cancellation(exc)
            log.info("grounding recall failed for bank %s", bank_id, exc_info=True)
            result = ToolResult(False, f"recall failed: {type(exc).__name__}: {exc}")
            return Grounding(result, 0, time.perf_counter() - started)
        count = min(len(outcome.hits), RECALL_LINES)
        return Grounding(
            ToolResult(True, memory_lines(outcome)), count, time.perf_counter() - started
        )

    async def _recall_outcome(self, query: str, tenant: str, bank_id: str) -> RecallOutcome:
        assert self._memory is not None
        bank = await self._memory.get_bank(bank_id, tenant=tenant)
        return await self._memory.recall(bank, RecallQuery(query=query, max_tokens=1024))

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
        _engine, bank_name = found
        outcome = await self._recall_outcome(str(arguments.get("query", "")), tenant, bank_name)
        return ToolResult(True, memory_lines(outcome))

    async def _retain(self, content: str, tenant: str, bank_id: str | None) -> ToolResult:
        found = self._engine_and_bank(bank_id)
        if isinstance(found, ToolResult):
            return found
        if not content.strip():
            return ToolResult(False, "retain needs non-empty content")
        engine, bank_name = found
        bank = await engine.get_bank(bank_name, tenant=tenant)
        summary = await engine.retain(bank, [RetainItem(content=content)])
        return ToolResult(True, json.dumps({"units": getattr(summary, "units", None)}))
