"""A run's span: a new trace's root, linked to the request that started the run.

A run executes after its request may have finished, possibly in another process (the
worker that claims it), so its span is not the request span's child: it starts a trace of
its own and carries a span **link** to the request's span. The link travels with the run's
payload (:data:`TRACE_LINK_KEY`: the W3C ``traceparent`` carrier of the span current when
:meth:`~heed.runs.manager.RunManager.submit` was called), which the store keeps and only the
executing worker reads; the manager takes the key out before the run's kind sees the payload.

The span is ``run {kind}`` with ``heed.run.id``, ``heed.run.kind``, ``heed.run.source``,
``heed.run.attempts`` and, for a session's run, ``heed.session.id``. A cancelled run's span
has the ``heed.cancelled`` event (:mod:`heed.runtime.tracing`). Off: the shared no-op.
"""

from __future__ import annotations

import contextlib
from typing import Final

from opentelemetry.context import Context
from opentelemetry.trace import Link, Span

from heed.runs.model import Run
from heed.runtime.tracing import span, tracing_enabled

__all__ = ["TRACE_LINK_KEY", "run_span"]

#: The payload key under which a run keeps its starting request's span context.
TRACE_LINK_KEY: Final = "_heed_trace_link"


def run_span(run: Run, link: Link | None) -> contextlib.AbstractContextManager[Span]:
    """The span of *run*'s execution, a root linked to *link* when there is one."""
    if not tracing_enabled():
        return span("run")  # the no-op
    attributes: dict[str, str | int] = {
        "heed.run.id": run.id,
        "heed.run.kind": run.kind,
        "heed.run.source": run.source,
        "heed.run.attempts": run.attempts,
    }
    if run.session_id is not None:
        attributes["heed.session.id"] = run.session_id
    return span(
        f"run {run.kind}",
        attributes=attributes,
        links=[link] if link is not None else None,
        context=Context(),
    )
