"""A span per HTTP request, joined to the caller's trace (docs/tracing.md).

The official ASGI instrumentation (``opentelemetry-instrumentation-asgi``) makes the request
span: it reads an incoming W3C ``traceparent`` (through the propagators ``OTEL_PROPAGATORS``
names, trace context and baggage by default) and makes heed's span a child of the caller's,
sets the HTTP attributes and the status, and makes the span current, so every span heed makes
for the request (a recall's stages, an LLM call) nests under it. heed installs it only while
tracing is on (:func:`request_spans`, called by :class:`heed.api.app.HeedApp`), outside the
lifecycle middleware: a request refused at the edge (401, 413, 503) has its span too. It
passes ``receive`` through untouched, so it hides no ``http.disconnect`` from the lifecycle
middleware, and its per-message ``receive`` / ``send`` spans are left out (a stream would make
one per event).

The span is first named by the method alone (the path holds ids: a name must not); once the
request is routed, :func:`name_request_span` renames it ``{method} {route}`` with
``http.route``, as the semantic conventions ask.
"""

from __future__ import annotations

from typing import Any, Final

from opentelemetry import trace
from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
from opentelemetry.metrics import NoOpMeterProvider
from starlette.types import ASGIApp, Scope

from heed.runtime.tracing import TracingState, tracing_enabled

__all__ = ["EXCLUDED_URLS", "name_request_span", "request_spans"]

#: Probes and scrapes are not traced: a load balancer's poll would be most of the spans.
EXCLUDED_URLS: Final = r"/health(/live|/ready)?$,/metrics$"


def _span_details(scope: Scope) -> tuple[str, dict[str, Any]]:
    return str(scope.get("method", "HTTP")), {}


def request_spans(app: ASGIApp, state: TracingState) -> ASGIApp:
    """*app* wrapped in the ASGI instrumentation, exporting through *state*'s provider."""
    return OpenTelemetryMiddleware(
        app,
        excluded_urls=EXCLUDED_URLS,
        default_span_details=_span_details,
        tracer_provider=state.tracer_provider,
        meter_provider=NoOpMeterProvider(),
        exclude_spans=["receive", "send"],
    )


def name_request_span(method: str, route: str) -> None:
    """Name the current request span ``{method} {route}`` (the route template, e.g.
    ``/v1/{tenant}/banks/{bank_id}/memories/recall``). A no-op while tracing is off."""
    if not tracing_enabled():
        return
    current = trace.get_current_span()
    if current.is_recording():
        current.update_name(f"{method} {route}")
        current.set_attribute("http.route", route)
