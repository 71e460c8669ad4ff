"""A span per HTTP request, joined to the caller's trace (docs/tracing.md).

:class:`RequestSpans` makes the request span: it reads an incoming W3C ``traceparent`` (through
the propagators ``OTEL_PROPAGATORS`` names, trace context and baggage by default) and makes
heed's span a child of the caller's, sets the HTTP attributes of the stable semantic
conventions and the status, and makes the span current, so every span heed makes for the
request (a recall's stages, an LLM call) nests under it. heed installs it only while tracing
is on (:func:`request_spans`, called by :class:`heed.api.app.HeedApp`), outside the lifecycle
middleware: a request refused at the edge (401, 413, 503) has its span too. It passes
``receive`` through untouched, so it hides no ``http.disconnect`` from the lifecycle
middleware, and makes no per-message span (a stream would make one per event).

It replaces the official ASGI instrumentation (``opentelemetry-instrumentation-asgi``), which
a profile of traced recalls showed costing a request as much as several spans: each of its
eight header look-ups a request decoded every header, it built each attribute for the old and
the new conventions and set it again one by one, and fed metric instruments heed gives a
no-op meter. This one decodes only the headers the propagators read (and ``user-agent``), sets its
attributes once, at the span's start, and records only the status after.

The span is first named by the method alone (the path holds ids: a name must not); once the
request is routed, :func:`name_request_span` renames it ``{method} {route}`` with
``http.route``, as the semantic conventions ask.
"""

from __future__ import annotations

from typing import Final

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from heed.runtime.tracing import TracingState, end_span, records_content, tracing_enabled

__all__ = ["EXCLUDED_PATHS", "RequestSpans", "name_request_span", "request_spans"]

#: Probes and scrapes are not traced: a load balancer's poll would be most of the spans.
EXCLUDED_PATHS: Final = frozenset({"/health", "/health/live", "/health/ready", "/metrics"})
#: Methods a span may be named after; any other is ``HTTP`` (the conventions' ``_OTHER``).
_KNOWN_METHODS: Final = frozenset(
    {"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"}
)


class RequestSpans:
    """ASGI middleware: one ``SERVER`` span per HTTP request (see the module docstring).

    Attributes, set as the span starts: ``http.request.method``, ``url.scheme``,
    ``url.path``, ``network.protocol.version``, ``server.address`` / ``server.port``,
    ``client.address`` / ``client.port``, ``user_agent.original`` when sent, ``url.query``
    only when content may be recorded (a query string can hold what a caller wrote); once
    the response starts, ``http.response.status_code`` (a 5xx also sets ``error.type`` and
    the error status). The span ends when the response's last body part was sent, or when
    the app returns or raises without one (an exception is recorded as
    :func:`heed.runtime.tracing.end_span` records it: a cancellation is not a failure)."""

    def __init__(self, app: ASGIApp, state: TracingState) -> None:
        if state.tracer is None:
            raise ValueError("request spans need tracing on (a state with a tracer)")
        self.app = app
        self._tracer = state.tracer
        self._textmap: TextMapPropagator | None = None
        self._fields: frozenset[bytes] = frozenset()

    def _propagation_fields(self) -> tuple[TextMapPropagator, frozenset[bytes]]:
        """The global propagator and the header names it reads (ASGI names are lower-case
        bytes), recomputed only when the global propagator is replaced."""
        textmap = propagate.get_global_textmap()
        if textmap is not self._textmap:
            self._fields = frozenset(f.lower().encode("latin-1") for f in textmap.fields)
            self._textmap = textmap
        return textmap, self._fields

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in EXCLUDED_PATHS:
            await self.app(scope, receive, send)
            return
        textmap, fields = self._propagation_fields()
        carrier: dict[str, list[str]] | None = None
        user_agent: str | None = None
        for name, value in scope["headers"]:
            if name in fields:
                if carrier is None:
                    carrier = {}
                carrier.setdefault(name.decode("latin-1"), []).append(value.decode("latin-1"))
            elif name == b"user-agent":
                user_agent = value.decode("latin-1")
        parent = textmap.extract(carrier) if carrier is not None else None

        method = scope["method"]
        attributes: dict[str, AttributeValue] = {
            "http.request.method": method if method in _KNOWN_METHODS else "_OTHER",
            "url.scheme": scope.get("scheme", "http"),
            "url.path": scope["path"],
            "network.protocol.version": scope.get("http_version", "1.1"),
        }
        server = scope.get("server")
        if server is not None:
            attributes["server.address"] = server[0]
            if server[1] is not None:
                attributes["server.port"] = server[1]
        client = scope.get("client")
        if client is not None:
            attributes["client.address"] = client[0]
            attributes["client.port"] = client[1]
        if user_agent is not None:
            attributes["user_agent.original"] = user_agent
        query = scope.get("query_string")
        if query and records_content():
            attributes["url.query"] = query.decode("latin-1")

        span = self._tracer.start_span(
            method if method in _KNOWN_METHODS else "HTTP",
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
        )
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        ended = False

        async def traced_send(message: Message) -> None:
            nonlocal ended
            kind = message["type"]
            if kind == "http.response.start":
                status = int(message["status"])
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_attribute("error.type", str(status))
                    span.set_status(Status(StatusCode.ERROR))
            await send(message)
            if kind == "http.response.body" and not message.get("more_body", False) and not ended:
                ended = True  # the response is complete: the span ends as the caller sees it
                span.end()

        try:
            await self.app(scope, receive, traced_send)
        except BaseException as exc:  # recorded on the span, then re-raised as it came
            if not ended:
                ended = True
                end_span(span, exc)
            raise
        finally:
            otel_context.detach(token)
            if not ended:
                span.end()


def request_spans(app: ASGIApp, state: TracingState) -> ASGIApp:
    """*app* wrapped in :class:`RequestSpans`, exporting through *state*'s provider."""
    return RequestSpans(app, state)


def name_request_span(method: str, route: str) -> None:
    """Name the current request span ``{method} {route}`` (the route template, e.g.
    ``/v1/{tenant}/banks/{bank_id}/memories/recall``). A no-op while tracing is off."""
    if not tracing_enabled():
        return
    current = trace.get_current_span()
    if current.is_recording():
        current.update_name(f"{method} {route}")
        current.set_attribute("http.route", route)
