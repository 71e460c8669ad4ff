"""OpenTelemetry traces: one switch, one tracer, and spans that are free when off.

heed's tracing is off unless the composition root turns it on (``HEED_TRACING=on``, see
docs/tracing.md) with :func:`configure_tracing`. Everything that makes a span goes through
this module, so the one switch holds everywhere:

- **Off** (the default): :func:`span` returns one shared no-op context manager and
  :func:`start_span` the invalid span, without calling into OpenTelemetry at all; callers
  build attributes only under ``span.is_recording()`` (false then), so a hot path pays a
  function call and a boolean test.
- **On**: an SDK ``TracerProvider`` (resource, sampler and batch limits from the standard
  ``OTEL_*`` variables) exporting through the exporters ``OTEL_TRACES_EXPORTER`` names
  (default ``otlp``: OTLP over HTTP/protobuf, endpoint from ``OTEL_EXPORTER_OTLP_*``), or
  the exporters a caller passes (tests: an in-memory exporter). ``OTEL_SDK_DISABLED=true``
  keeps it off whatever the setting says.

The provider is heed's own, never the process-global one: several servers in one process
(the tests) each state theirs, and heed never fights a host application's global setup.

**Cancellation** is not a failure: a span whose work was cancelled (``OperationCancelled``,
``asyncio.CancelledError``) gets a ``heed.cancelled`` event with the reason and
``heed.cancelled=true``, its status left unset; any other exception is recorded and sets
the span's status to error. Both always propagate: a span never swallows anything.

**Links across processes.** A run may execute after the request that started it finished,
in another process: :func:`link_carrier` writes the current span's context as a W3C
``traceparent`` carrier (a small dict, stored with the run), :func:`link_from` reads it
back as a span :class:`~opentelemetry.trace.Link`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import INVALID_SPAN, Link, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from heed.runtime.cancellation import OperationCancelled

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

__all__ = [
    "CANCELLED_EVENT",
    "TRACER_NAME",
    "TracingState",
    "configure_tracing",
    "end_span",
    "link_carrier",
    "link_from",
    "records_content",
    "shutdown_tracing",
    "span",
    "start_span",
    "tracing_enabled",
]

log = logging.getLogger("heed.tracing")

TRACER_NAME: Final = "heed"
CANCELLED_EVENT: Final = "heed.cancelled"
#: The exporter group the SDK's own exporters register under (``console``, ``otlp_proto_http``).
_EXPORTER_GROUP: Final = "opentelemetry_traces_exporter"
#: ``OTEL_TRACES_EXPORTER=otlp`` with the protocol the installed exporter speaks.
_OTLP_ALIASES: Final = {"otlp": "otlp_proto_http"}

_NOOP: Final = contextlib.nullcontext(INVALID_SPAN)
_PROPAGATOR: Final = TraceContextTextMapPropagator()


@dataclass(frozen=True, slots=True)
class TracingState:
    """What :func:`configure_tracing` set: on or off, whether content may be recorded
    (``gen_ai.memory.query.text``), and the provider while on."""

    enabled: bool = False
    record_content: bool = False
    tracer_provider: trace.TracerProvider | None = None
    tracer: trace.Tracer | None = None


_state = TracingState()
_lock = threading.Lock()


def tracing_enabled() -> bool:
    """True while spans are recorded (a cheap read: call it on any path)."""
    return _state.enabled


def records_content() -> bool:
    """True when spans may carry what callers wrote (a recall's query text)."""
    return _state.enabled and _state.record_content


def _sdk_disabled() -> bool:
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def _exporters_from_env() -> list[SpanExporter]:
    """The exporters ``OTEL_TRACES_EXPORTER`` names (comma-separated; default ``otlp``;
    ``none``: none). An unknown name is a configuration error (``ValueError``), raised at
    start-up rather than leaving an operator with silently missing traces."""
    names = [
        n.strip().lower()
        for n in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")
        if n.strip()
    ]
    exporters: list[SpanExporter] = []
    for name in names:
        if name == "none":
            continue
        wanted = _OTLP_ALIASES.get(name, name)
        found = list(entry_points(group=_EXPORTER_GROUP, name=wanted))
        if not found:
            raise ValueError(
                f"OTEL_TRACES_EXPORTER names {name!r}, which no installed exporter provides "
                "(heed ships otlp, otlp_proto_http and console)"
            )
        exporters.append(found[0].load()())
    return exporters


def configure_tracing(
    enabled: bool,
    *,
    record_content: bool = False,
    exporters: Sequence[SpanExporter] | None = None,
    service_name: str = "heed",
) -> TracingState:
    """Turn tracing on or off for this process, replacing what an earlier call set.

    On: an SDK provider whose resource is ``service.name`` *service_name* unless
    ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` say otherwise, exporting through
    *exporters* (each behind a ``SimpleSpanProcessor``: a test reads them at once) or, when
    ``None``, those ``OTEL_TRACES_EXPORTER`` names (each behind a ``BatchSpanProcessor``,
    whose limits ``OTEL_BSP_*`` set). ``OTEL_SDK_DISABLED=true`` means off. Returns the
    new state; the previous provider is left to its owner (:func:`shutdown_tracing`).
    """
    global _state
    if not enabled or _sdk_disabled():
        with _lock:
            _state = TracingState()
        return _state
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name}))
    if exporters is None:
        for exporter in _exporters_from_env():
            provider.add_span_processor(BatchSpanProcessor(exporter))
    else:
        for exporter in exporters:
            provider.add_span_processor(SimpleSpanProcessor(exporter))
    state = TracingState(
        enabled=True,
        record_content=record_content,
        tracer_provider=provider,
        tracer=provider.get_tracer(TRACER_NAME),
    )
    with _lock:
        _state = state
    return state


def shutdown_tracing(state: TracingState) -> None:
    """Flush and stop *state*'s provider (what :func:`configure_tracing` returned); when it
    is still the current one, tracing is off afterwards. Safe to call with an off state."""
    global _state
    with _lock:
        if _state is state:
            _state = TracingState()
    provider = state.tracer_provider
    shutdown = getattr(provider, "shutdown", None)
    if callable(shutdown):
        shutdown()


def _tracer() -> trace.Tracer | None:
    state = _state
    return state.tracer if state.enabled else None


@dataclass(slots=True, eq=False, repr=False)
class _Recorded:
    """A recording span around a ``with`` block, current inside it: what the SDK's
    ``start_as_current_span`` does, in one small object rather than three nested
    generator-based context managers (a recall makes several spans; the generators were a
    measurable part of each one's cost). The span starts on ``__enter__``; on the way out the
    context is restored, an exception is recorded (:func:`_mark`) and the span ends."""

    _tracer: trace.Tracer
    _name: str
    _kind: SpanKind
    _attributes: Mapping[str, AttributeValue] | None
    _links: Sequence[Link] | None
    _context: Context | None
    #: Set on ``__enter__``: the span, and the token that restores the context.
    _span: Span = field(init=False)
    _token: Any = field(init=False)

    def __enter__(self) -> Span:
        current = self._tracer.start_span(
            self._name,
            context=self._context,
            kind=self._kind,
            attributes=self._attributes,
            links=self._links,
            record_exception=False,
            set_status_on_exception=False,
        )
        self._span = current
        self._token = otel_context.attach(trace.set_span_in_context(current))
        return current

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        otel_context.detach(self._token)
        if exc is not None:
            _mark(self._span, exc)
        self._span.end()


def span(
    name: str,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, AttributeValue] | None = None,
    links: Sequence[Link] | None = None,
    context: Context | None = None,
) -> contextlib.AbstractContextManager[Span]:
    """A span around a ``with`` block, current inside it (its children nest under it,
    in worker threads too: :func:`heed.runtime.run_in_thread` copies the context).

    Off, the shared no-op context manager (the invalid span, which records nothing).
    *context* is the parent's context (``Context()``: a new trace's root), by default the
    current one. An exception leaving the block is recorded (see the module docstring)
    and propagates."""
    tracer = _tracer()
    if tracer is None:
        return _NOOP
    return _Recorded(tracer, name, kind, attributes, links, context)


def start_span(
    name: str,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, AttributeValue] | None = None,
    links: Sequence[Link] | None = None,
) -> Span:
    """A span that is not made current (for work that yields to its caller, like an LLM
    stream: the caller's own spans must not nest under it), a child of the current span.
    The caller ends it with :func:`end_span`. Off: the invalid span."""
    tracer = _tracer()
    if tracer is None:
        return INVALID_SPAN
    return tracer.start_span(name, kind=kind, attributes=attributes, links=links)


def end_span(target: Span, error: BaseException | None = None) -> None:
    """End *target* (from :func:`start_span`), recording *error* first when given."""
    if error is not None and target.is_recording():
        _mark(target, error)
    target.end()


def _mark(target: Span, exc: BaseException) -> None:
    if not target.is_recording():
        return
    if isinstance(exc, OperationCancelled | asyncio.CancelledError):
        reason = exc.reason if isinstance(exc, OperationCancelled) else "task cancelled"
        target.set_attribute("heed.cancelled", True)
        target.add_event(CANCELLED_EVENT, {"heed.cancel.reason": reason})
    elif isinstance(exc, GeneratorExit):
        target.add_event("heed.closed_early")
    else:
        target.record_exception(exc)
        target.set_attribute("error.type", type(exc).__qualname__)
        target.set_status(Status(StatusCode.ERROR, type(exc).__qualname__))


def link_carrier() -> dict[str, str] | None:
    """The current span's context as a W3C trace-context carrier (``traceparent``,
    ``tracestate``), or ``None`` when tracing is off or no span is current."""
    if not _state.enabled:
        return None
    current = trace.get_current_span()
    if not current.get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier or None


def link_from(carrier: Any) -> Link | None:
    """A :class:`Link` to the span *carrier* (from :func:`link_carrier`) names, or ``None``
    when it is absent or malformed (a link is a hint: a bad one is dropped, not an error)."""
    if not isinstance(carrier, Mapping) or not carrier:
        return None
    clean = {str(k): str(v) for k, v in carrier.items() if isinstance(v, str)}
    linked = trace.get_current_span(_PROPAGATOR.extract(clean)).get_span_context()
    return Link(linked) if linked.is_valid else None
