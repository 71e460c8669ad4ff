"""Memory operations as spans named by the OpenTelemetry GenAI memory convention.

A recall is ``search_memory {bank}``, a retain ``update_memory {bank}``, the delete of a
memory, a document or a bank ``delete_memory {bank}``; each carries
``gen_ai.operation.name``, ``gen_ai.memory.store.id`` (the bank's id) and, when known,
``gen_ai.memory.record.id`` and ``gen_ai.memory.records`` (how many records the operation
returned or wrote). The recall's query is put in ``gen_ai.memory.query.text`` only when
``HEED_TRACING_RECORD_CONTENT`` allows it. While tracing is off, :func:`memory_span` is
the shared no-op (:func:`heed.runtime.tracing.span`) and builds no attribute.
"""

from __future__ import annotations

import contextlib
from typing import Final, Literal

from opentelemetry import trace
from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

from heed.runtime.tracing import records_content, span, tracing_enabled

__all__ = ["MEMORY_RECORDS", "MemoryOperation", "annotate", "memory_span", "stage_span"]

MemoryOperation = Literal["search_memory", "update_memory", "delete_memory"]
#: How many records the operation returned (a recall) or wrote (a retain).
MEMORY_RECORDS: Final = "gen_ai.memory.records"


def memory_span(
    operation: MemoryOperation,
    bank_id: str,
    *,
    record_id: str | None = None,
    query: str | None = None,
) -> contextlib.AbstractContextManager[Span]:
    """The span of one memory operation on bank *bank_id* (see the module docstring)."""
    if not tracing_enabled():
        return span(operation)  # the no-op
    attributes: dict[str, str] = {
        "gen_ai.operation.name": operation,
        "gen_ai.memory.store.id": bank_id,
    }
    if record_id is not None:
        attributes["gen_ai.memory.record.id"] = record_id
    if query is not None and records_content():
        attributes["gen_ai.memory.query.text"] = query
    return span(f"{operation} {bank_id}", attributes=attributes)


def stage_span(name: str) -> contextlib.AbstractContextManager[Span]:
    """The span of one stage of a memory operation (``recall.rerank``, ``recall.arm.graph``...)."""
    return span(name)


def annotate(key: str, value: AttributeValue) -> None:
    """Set *key* on the current span when it records (a no-op while tracing is off)."""
    if tracing_enabled():
        current = trace.get_current_span()
        if current.is_recording():
            current.set_attribute(key, value)
