"""heed.runtime.tracing: off costs nothing and records nothing; on, a span records how its
work ended (a cancel is an event, not an error) and never swallows it; links round-trip."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import INVALID_SPAN, StatusCode

from heed.llm import ScriptedProvider
from heed.llm.base import ChatMessage, complete
from heed.runtime import OperationCancelled
from heed.runtime.tracing import (
    CANCELLED_EVENT,
    configure_tracing,
    link_carrier,
    link_from,
    shutdown_tracing,
    span,
    start_span,
    tracing_enabled,
)


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    state = configure_tracing(True, exporters=[memory])
    try:
        yield memory
    finally:
        shutdown_tracing(state)


def test_off_by_default_nothing_is_made() -> None:
    configure_tracing(False)
    assert not tracing_enabled()
    with span("anything", attributes={"a": 1}) as current:
        assert current is INVALID_SPAN
        assert not current.is_recording()
    assert start_span("anything") is INVALID_SPAN
    assert link_carrier() is None


def test_off_when_the_sdk_is_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    memory = InMemorySpanExporter()
    state = configure_tracing(True, exporters=[memory])
    assert not state.enabled and not tracing_enabled()
    with span("anything"):
        pass
    assert memory.get_finished_spans() == ()


def test_an_unknown_exporter_is_refused_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "carrier-pigeon")
    with pytest.raises(ValueError, match="carrier-pigeon"):
        configure_tracing(True)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    shutdown_tracing(configure_tracing(True))


def test_a_cancel_is_an_event_and_propagates(exporter: InMemorySpanExporter) -> None:
    with pytest.raises(OperationCancelled), span("work"):
        raise OperationCancelled("client disconnected")
    (done,) = exporter.get_finished_spans()
    assert done.status.status_code == StatusCode.UNSET  # a cancel is not a failure
    assert dict(done.attributes or {})["heed.cancelled"] is True
    (event,) = done.events
    assert event.name == CANCELLED_EVENT
    assert dict(event.attributes or {}) == {"heed.cancel.reason": "client disconnected"}


def test_a_failure_is_an_error_and_propagates(exporter: InMemorySpanExporter) -> None:
    with pytest.raises(KeyError), span("work"):
        raise KeyError("x")
    (done,) = exporter.get_finished_spans()
    assert done.status.status_code == StatusCode.ERROR
    assert dict(done.attributes or {})["error.type"] == "KeyError"
    assert [e.name for e in done.events] == ["exception"]


def test_children_nest_and_a_link_round_trips(exporter: InMemorySpanExporter) -> None:
    with span("parent") as parent:
        with span("child"):
            pass
        carrier = link_carrier()
    assert carrier is not None and carrier["traceparent"].startswith("00-")
    link = link_from(carrier)
    assert link is not None
    assert link.context.span_id == parent.get_span_context().span_id
    assert link_from({"traceparent": "garbage"}) is None
    assert link_from(None) is None
    child, done = exporter.get_finished_spans()
    assert child.parent is not None and child.parent.span_id == done.context.span_id


async def test_an_llm_call_cancelled_midway_ends_its_span(
    exporter: InMemorySpanExporter,
) -> None:
    provider = ScriptedProvider({"replies": [{"text": "one two three four", "token_delay": 0.5}]})
    call = asyncio.create_task(complete(provider, [ChatMessage.user("hi")]))
    await asyncio.sleep(0.1)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    (done,) = exporter.get_finished_spans()
    assert done.name == f"chat {provider.model}"
    assert CANCELLED_EVENT in [e.name for e in done.events]
