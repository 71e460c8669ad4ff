"""What a bank's work cost and who did what to it: LLM token usage, LLM request traces and
audit logs (docs/observability.md).

- :mod:`heed.observability.records`: the rows and the store protocol storage implements;
- :mod:`heed.observability.content`: what of a call's text a trace keeps (the setting);
- :mod:`heed.observability.periods`: stats periods and their buckets;
- :mod:`heed.observability.service`: :class:`Observability`, the sink of every LLM call
  (:mod:`heed.llm.usage`) and of audit entries, buffered and written in batches, and the
  reads the API serves.
"""

from heed.observability.records import (
    AuditEntry,
    AuditFilter,
    ObservabilityStore,
    Retention,
    TraceFilter,
    TraceRow,
    UsageRow,
)
from heed.observability.service import Observability

__all__ = [
    "AuditEntry",
    "AuditFilter",
    "Observability",
    "ObservabilityStore",
    "Retention",
    "TraceFilter",
    "TraceRow",
    "UsageRow",
]
