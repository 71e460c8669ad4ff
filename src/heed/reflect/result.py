"""The JSON answer of a reflect, built once for both ways of asking.

A plain ``POST .../reflect`` returns it as the response body; a streamed reflect (a run,
see :mod:`heed.reflect.runs`) stores it as the run's result, so its ``completed`` journal
event carries the same object. The shape is hindsight-client's ``ReflectResponse``; the
HTTP layer's wire model (:mod:`heed.api.wire.reflect`) validates it, and a test checks the
two agree field for field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from heed.memory.models import StoredUnit
from heed.reflect.agent import ReflectOutcome

__all__ = ["ResultShape", "reflect_result"]


@dataclass(frozen=True, slots=True)
class ResultShape:
    """Which optional parts the client asked for: ``include.facts`` adds ``based_on``,
    ``include.tool_calls`` adds ``trace``."""

    facts: bool = False
    trace: bool = False


def _fact(unit: StoredUnit) -> dict[str, Any]:
    return {
        "id": unit.id,
        "text": unit.text,
        "type": unit.fact_type,
        "context": unit.context,
        "occurred_start": unit.occurred_start,
        "occurred_end": unit.occurred_end,
        "mentioned_at": unit.mentioned_at,
        "document_id": unit.document_id,
        "chunk_id": unit.chunk_id,
        "tags": unit.tags,
        "metadata": unit.metadata,
    }


def reflect_result(outcome: ReflectOutcome, shape: ResultShape) -> dict[str, Any]:
    """The response object of *outcome* (JSON-able; see the module docstring)."""
    usage = outcome.usage
    based_on = (
        {
            "memories": [_fact(u) for u in outcome.based_on],
            "mental_models": [
                {"id": m.id, "text": m.content, "context": m.name} for m in outcome.mental_models
            ],
            "directives": [
                {"id": d.id, "name": d.name, "content": d.content} for d in outcome.directives
            ],
        }
        if shape.facts
        else None
    )
    trace = (
        {
            "tool_calls": [
                {
                    "tool": t.tool,
                    "input": t.input,
                    "output": t.output,
                    "duration_ms": t.duration_ms,
                    "iteration": t.iteration,
                }
                for t in outcome.tool_calls
            ],
            "llm_calls": [
                {"scope": c.scope, "duration_ms": c.duration_ms} for c in outcome.llm_calls
            ],
        }
        if shape.trace
        else None
    )
    return {
        "text": outcome.text,
        "based_on": based_on,
        "structured_output": outcome.structured_output,
        "structured_output_error": outcome.structured_output_error,
        "usage": {
            "input_tokens": usage.prompt_tokens,
            "output_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
            "cached_tokens": 0,
            "thoughts_tokens": 0,
        },
        "trace": trace,
    }
