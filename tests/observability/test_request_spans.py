"""heed.api.tracing.RequestSpans, the request span, on a bare ASGI app: joined to the
caller's trace, its attributes set once, the status recorded, probes left out, the query
string kept out unless content may be recorded, and a failure or a cancel recorded as
heed records them (a cancel is not an error)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import baggage
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from starlette.types import Message, Receive, Scope, Send

from heed.api.tracing import RequestSpans
from heed.runtime.tracing import (
    CANCELLED_EVENT,
    TracingState,
    configure_tracing,
    shutdown_tracing,
    span,
)

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


@pytest.fixture
def traced() -> Iterator[tuple[TracingState, InMemorySpanExporter]]:
    memory = InMemorySpanExporter()
    state = configure_tracing(True, exporters=[memory])
    try:
        yield state, memory
    finally:
        shutdown_tracing(state)


def scope(path: str = "/v1/default/banks/b/memories/recall", **extra: Any) -> Scope:
    headers = [
        (b"host", b"127.0.0.1:8888"),
        (b"user-agent", b"tests/1.0"),
        (b"content-type", b"application/json"),
        *extra.pop("headers", []),
    ]
    return {
        "type": "http",
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "query_string": extra.pop("query_string", b""),
        "headers": headers,
        "server": ("127.0.0.1", 8888),
        "client": ("10.0.0.7", 51234),
        **extra,
    }


async def _receive() -> Message:
    return {"type": "http.request", "body": b"{}", "more_body": False}


def answering(status: int, seen: list[Any] | None = None) -> Any:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        with span("inner"):  # a span heed makes for the request nests under its span
            if seen is not None:
                seen.append(baggage.get_baggage("tenant"))
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    return app


def call(app: Any, request: Scope) -> list[Message]:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(app(request, _receive, send))
    return sent


def by_name(memory: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {s.name: s for s in memory.get_finished_spans()}


def test_the_span_joins_the_callers_trace_with_its_attributes_set_once(
    traced: tuple[TracingState, InMemorySpanExporter],
) -> None:
    state, memory = traced
    seen: list[Any] = []
    traceparent = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01".encode()
    request = scope(
        headers=[(b"traceparent", traceparent), (b"baggage", b"tenant=acme")],
        query_string=b"q=secret+words",
    )
    sent = call(RequestSpans(answering(200, seen), state), request)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]

    spans = by_name(memory)
    request_span, inner = spans["POST"], spans["inner"]
    assert request_span.kind == SpanKind.SERVER
    assert request_span.parent is not None and request_span.parent.is_remote
    assert format(request_span.context.trace_id, "032x") == CALLER_TRACE
    assert format(request_span.parent.span_id, "016x") == CALLER_SPAN
    assert inner.parent is not None and inner.parent.span_id == request_span.context.span_id
    assert seen == ["acme"]  # the caller's baggage is in the request's context
    assert dict(request_span.attributes or {}) == {
        "http.request.method": "POST",
        "url.scheme": "http",
        "url.path": "/v1/default/banks/b/memories/recall",
        "network.protocol.version": "1.1",
        "server.address": "127.0.0.1",
        "server.port": 8888,
        "client.address": "10.0.0.7",
        "client.port": 51234,
        "user_agent.original": "tests/1.0",
        "http.response.status_code": 200,
    }  # no url.query: content is not recorded by default
    assert request_span.status.status_code == StatusCode.UNSET


def test_the_query_string_only_when_content_may_be_recorded() -> None:
    memory = InMemorySpanExporter()
    state = configure_tracing(True, record_content=True, exporters=[memory])
    try:
        call(RequestSpans(answering(200), state), scope(query_string=b"q=cats"))
    finally:
        shutdown_tracing(state)
    assert dict(by_name(memory)["POST"].attributes or {})["url.query"] == "q=cats"


def test_without_a_traceparent_the_span_starts_a_trace(
    traced: tuple[TracingState, InMemorySpanExporter],
) -> None:
    state, memory = traced
    call(RequestSpans(answering(404), state), scope())
    request_span = by_name(memory)["POST"]
    assert request_span.parent is None
    assert dict(request_span.attributes or {})["http.response.status_code"] == 404
    assert request_span.status.status_code == StatusCode.UNSET  # a 4xx is the caller's


def test_a_5xx_is_an_error(traced: tuple[TracingState, InMemorySpanExporter]) -> None:
    state, memory = traced
    call(RequestSpans(answering(503), state), scope())
    request_span = by_name(memory)["POST"]
    assert request_span.status.status_code == StatusCode.ERROR
    assert dict(request_span.attributes or {})["error.type"] == "503"


@pytest.mark.parametrize("path", ["/health", "/health/live", "/health/ready", "/metrics"])
def test_probes_and_scrapes_make_no_span(
    traced: tuple[TracingState, InMemorySpanExporter], path: str
) -> None:
    state, memory = traced
    call(RequestSpans(answering(200), state), scope(path, method="GET"))
    assert [s.name for s in memory.get_finished_spans()] == ["inner"]


def test_a_failure_is_recorded_and_a_cancel_is_not_an_error(
    traced: tuple[TracingState, InMemorySpanExporter],
) -> None:
    state, memory = traced

    async def failing(scope: Scope, receive: Receive, send: Send) -> None:
        raise KeyError("boom")

    async def cancelled(scope: Scope, receive: Receive, send: Send) -> None:
        raise asyncio.CancelledError

    with pytest.raises(KeyError):
        call(RequestSpans(failing, state), scope())
    (failed,) = memory.get_finished_spans()
    assert failed.status.status_code == StatusCode.ERROR
    assert dict(failed.attributes or {})["error.type"] == "KeyError"
    memory.clear()

    with pytest.raises(asyncio.CancelledError):
        call(RequestSpans(cancelled, state), scope())
    (stopped,) = memory.get_finished_spans()
    assert stopped.status.status_code == StatusCode.UNSET
    assert [e.name for e in stopped.events] == [CANCELLED_EVENT]


def test_the_span_ends_once_the_response_is_sent(
    traced: tuple[TracingState, InMemorySpanExporter],
) -> None:
    state, memory = traced
    ended_before_return: list[bool] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        assert memory.get_finished_spans() == ()  # still streaming
        await send({"type": "http.response.body", "body": b"b"})
        ended_before_return.append(len(memory.get_finished_spans()) == 1)

    call(RequestSpans(app, state), scope())
    assert ended_before_return == [True]
    assert len(memory.get_finished_spans()) == 1  # ended once
