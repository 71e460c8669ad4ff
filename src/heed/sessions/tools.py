"""The tools a chat turn offers its model: ``recall``, ``retain`` and ``start_task``.

``recall`` (the one spec reflect offers too, :data:`heed.llm.grounding.RECALL_TOOL`) and
``retain`` act on the session's memory bank through the memory engine
(:mod:`heed.memory`); for a session bound to no bank they return a clear tool error (the
turn goes on: the model reads the error like any tool result). ``start_task`` starts a
background run of kind ``task`` owned by the session; its completion wakes the session
(see :mod:`heed.sessions.service`).

A tool call never raises for a bad call: it returns ``ToolResult(ok=False,
content=<why>)``. Cancellation always propagates.

:meth:`TurnTools.ground` is the recall a turn of a bank-bound session makes by itself
before its first model call (see :mod:`heed.sessions.turn`): the same recall as the tool,
its memories one per line with their dates (:func:`heed.llm.grounding.memory_line`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from heed.llm.base import ToolSpec
from heed.llm.grounding import RECALL_TOOL, Memory, memory_line
from heed.memory import MemoryEngine
from heed.memory.models import RecallQuery, RetainItem, StoredUnit
from heed.runtime import reraise_cancellation

__all__ = ["NOT_BOUND", "TOOL_SPECS", "Grounding", "ToolResult", "TurnTools", "memory_lines"]

log = logging.getLogger("heed.sessions.tools")

#: The tool error of a memory tool in a session bound to no bank.
NOT_BOUND: Final = "this session is not bound to a memory bank"

TOOL_SPECS: Final = [
    RECALL_TOOL,
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
    """What a turn's own recall found: the tool result it shows, the memories (best first;
    none when the recall failed), and what it cost."""

    result: ToolResult
    memories: list[StoredUnit]
    seconds: float


#: Memories a recall hands the model (the tool's and a turn's own).
RECALL_LINES: Final = 10


def memory_lines(memories: Sequence[Memory]) -> str:
    """Recalled memories as the tool shows them: one line each, with the date it happened
    (or was said); ``(nothing found)`` for none."""
    return "\n".join(memory_line(m) for m in memories) if memories else "(nothing found)"


#: ``start_task(session_id, tenant, payload) -> task run id``
TaskStarter = Callable[[str, str, dict[str, Any]], Awaitable[str]]


class TurnTools:
    """Runs the turn tools for one server over its memory engine."""

    def __init__(self, memory: MemoryEngine, start_task: TaskStarter) -> None:
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

    async def ground(self, query: str, tenant: str, bank_id: str) -> Grounding:
        """The recall a turn of a session bound to *bank_id* makes before its first model
        call. A failed recall is a tool error (and no memories), not a failed turn;
        cancellation propagates."""
        started = time.perf_counter()
        try:
            memories = await self._recall_memories(query, tenant, bank_id)
        except Exception as exc:
            reraise_cancellation(exc)
            log.info("grounding recall failed for bank %s", bank_id, exc_info=True)
            result = ToolResult(False, f"recall failed: {type(exc).__name__}: {exc}")
            return Grounding(result, [], time.perf_counter() - started)
        result = ToolResult(True, memory_lines(memories))
        return Grounding(result, memories, time.perf_counter() - started)

    async def _recall_memories(self, query: str, tenant: str, bank_id: str) -> list[StoredUnit]:
        """The best :data:`RECALL_LINES` memories for *query*, best first."""
        bank = await self._memory.get_bank(bank_id, tenant=tenant)
        outcome = await self._memory.recall(bank, RecallQuery(query=query, max_tokens=1024))
        return [hit.unit for hit in outcome.hits[:RECALL_LINES]]

    async def _recall(
        self, arguments: dict[str, Any], tenant: str, bank_id: str | None
    ) -> ToolResult:
        if not bank_id:
            return ToolResult(False, NOT_BOUND)
        query = str(arguments.get("query", ""))
        return ToolResult(True, memory_lines(await self._recall_memories(query, tenant, bank_id)))

    async def _retain(self, content: str, tenant: str, bank_id: str | None) -> ToolResult:
        if not bank_id:
            return ToolResult(False, NOT_BOUND)
        if not content.strip():
            return ToolResult(False, "retain needs non-empty content")
        engine = self._memory
        bank = await engine.get_bank(bank_id, tenant=tenant)
        summary = await engine.retain(bank, [RetainItem(content=content)])
        return ToolResult(True, json.dumps({"units": getattr(summary, "units", None)}))
