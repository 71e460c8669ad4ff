"""OpenTelemetry traces on a real server: the tree under a caller's trace, GenAI attributes,
the link from a run to the request that started it (docs/tracing.md).

One server with tracing on and an in-memory exporter; the scripted LLM provider (it reports
usage: prompt tokens are the words sent, completion tokens the words produced).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from heed.api.app import create_app
from heed.llm import ScriptedProvider
from heed.services import Services
from heed.settings import Settings
from tests.support import LiveServer, live_server, wait_for

CALLER_TRACE = uuid.uuid4().hex
CALLER_SPAN = uuid.uuid4().hex[:16]
TRACEPARENT = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
FACTS = ["Alice has two cats named Tom and Luna.", "Alice works as a nurse in Lyon."]


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, exporter: InMemorySpanExporter
) -> Iterator[LiveServer]:
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("tracing"), llm_provider="scripted", tracing="on"
    )
    services = Services(settings, span_exporters=[exporter])
    with live_server(create_app(settings, services)) as srv:
        yield srv


@pytest.fixture(scope="module")
def bank_id(server: LiveServer) -> str:
    bank = "traced-" + uuid.uuid4().hex[:8]
    with httpx.Client(base_url=server.url, timeout=30) as client:
        client.put(f"/v1/default/banks/{bank}", json={}).raise_for_status()
        items = [{"content": fact} for fact in FACTS]
        client.post(f"/v1/default/banks/{bank}/memories", json={"items": items}).raise_for_status()
    return bank


def hexid(value: int, width: int) -> str:
    return format(value, f"0{width}x")


def named(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, [s.name for s in spans])
    return found[0]


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def descends(span: ReadableSpan, ancestor: ReadableSpan, spans: Sequence[ReadableSpan]) -> bool:
    by_id = {s.context.span_id: s for s in spans}
    current: ReadableSpan | None = span
    while current is not None and current.parent is not None:
        if current.parent.span_id == ancestor.context.span_id:
            return True
        current = by_id.get(current.parent.span_id)
    return False


def finished(exporter: InMemorySpanExporter, name: str) -> tuple[ReadableSpan, ...]:
    """Every finished span, once one called *name* has finished (the request span ends just
    after the response was sent)."""
    return wait_for(
        lambda: (
            exporter.get_finished_spans()
            if any(s.name == name for s in exporter.get_finished_spans())
            else None
        )
    )


def test_a_recall_is_a_span_tree_under_the_callers_trace(
    server: LiveServer, bank_id: str, exporter: InMemorySpanExporter
) -> None:
    exporter.clear()
    route = "/v1/default/banks/{bank_id}/memories/recall"
    with httpx.Client(base_url=server.url, timeout=30) as client:
        response = client.post(
            route.format(bank_id=bank_id),
            json={"query": "What pets does Alice have?"},
            headers={"traceparent": TRACEPARENT},
        )
    assert response.status_code == 200
    hits = len(response.json()["results"])
    assert hits >= 1

    spans = finished(exporter, f"POST {route}")
    assert {hexid(s.context.trace_id, 32) for s in spans} == {CALLER_TRACE}

    request = named(spans, f"POST {route}")
    assert request.kind == SpanKind.SERVER
    assert parent_id(request) == int(CALLER_SPAN, 16)  # joined: the caller's span is its parent
    assert request.attributes is not None
    assert request.attributes["http.route"] == route

    search = named(spans, f"search_memory {bank_id}")
    assert parent_id(search) == request.context.span_id
    assert dict(search.attributes or {}) == {
        "gen_ai.operation.name": "search_memory",
        "gen_ai.memory.store.id": bank_id,
        "gen_ai.memory.records": hits,
        "heed.recall.budget": "mid",
        "heed.recall.background": False,
        "heed.recall.admission_ms": pytest.approx(search.attributes["heed.recall.admission_ms"]),
    }
    assert "gen_ai.memory.query.text" not in (search.attributes or {})  # content stays out

    stages = {"embeddings", "recall.arm.semantic", "recall.arm.keyword", "recall.rerank"}
    for name in stages:
        assert descends(named(spans, name), search, spans), name
    semantic = named(spans, "recall.arm.semantic")
    assert semantic.attributes is not None and semantic.attributes["heed.recall.candidates"] >= 1
    rerank = named(spans, "recall.rerank")
    assert rerank.attributes is not None and rerank.attributes["heed.recall.candidates"] >= 1
    embeddings = named(spans, "embeddings")
    assert embeddings.attributes is not None
    assert embeddings.attributes["gen_ai.operation.name"] == "embeddings"


def use_script(server: LiveServer, replies: list[dict[str, Any]]) -> ScriptedProvider:
    provider = ScriptedProvider({"replies": [{"text": "unused"}, *replies]})
    server.app.state.services.reflect.provider = provider
    return provider


def chat_spans(spans: Sequence[ReadableSpan]) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith("chat ")]


def test_each_llm_call_is_a_genai_span_with_its_token_usage(
    server: LiveServer, bank_id: str, exporter: InMemorySpanExporter
) -> None:
    provider = use_script(server, [{"text": "Alice is a nurse."}])
    exporter.clear()
    route = "/v1/default/banks/{bank_id}/reflect"
    with httpx.Client(base_url=server.url, timeout=30) as client:
        response = client.post(
            route.format(bank_id=bank_id),
            json={"query": "Who is Alice?"},
            headers={"traceparent": TRACEPARENT},
        )
    assert response.status_code == 200, response.text
    spans = finished(exporter, f"POST {route}")
    request = named(spans, f"POST {route}")

    calls = chat_spans(spans)
    assert calls, [s.name for s in spans]
    assert len(calls) == len(provider.requests)
    for call in calls:
        assert call.name == f"chat {provider.model}"
        assert call.kind == SpanKind.CLIENT
        assert descends(call, request, spans)
        attributes = dict(call.attributes or {})
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.provider.name"] == "scripted"
        assert attributes["gen_ai.request.model"] == provider.model
        assert attributes["gen_ai.usage.input_tokens"] > 0
        assert attributes["gen_ai.usage.output_tokens"] > 0
        assert attributes["gen_ai.response.finish_reasons"] == ("stop",)
    answered = max(calls, key=lambda s: s.end_time or 0)
    assert dict(answered.attributes or {})["gen_ai.usage.output_tokens"] == 4  # its 4 words


def test_a_run_started_by_a_request_links_to_the_request_span(
    server: LiveServer, bank_id: str, exporter: InMemorySpanExporter
) -> None:
    use_script(server, [{"text": "Alice is a nurse."}])
    exporter.clear()
    route = "/v1/default/banks/{bank_id}/reflect"
    with (
        httpx.Client(base_url=server.url, timeout=30) as client,
        client.stream(
            "POST",
            route.format(bank_id=bank_id),
            json={"query": "Who is Alice?", "stream": True},
            headers={"traceparent": TRACEPARENT},
        ) as response,
    ):
        assert response.status_code == 200
        run_id = response.headers["x-heed-run-id"]
        body = response.read().decode()
    assert "completed" in body

    spans = finished(exporter, "run reflect")
    spans = finished(exporter, f"POST {route}")
    request = named(spans, f"POST {route}")
    run = named(spans, "run reflect")
    assert run.parent is None  # a trace of its own: it may outlive the request
    assert run.context.trace_id != request.context.trace_id
    assert [(link.context.trace_id, link.context.span_id) for link in run.links] == [
        (request.context.trace_id, request.context.span_id)
    ]
    assert dict(run.attributes or {})["heed.run.id"] == run_id
    assert dict(run.attributes or {})["heed.run.kind"] == "reflect"
    # the run's own work nests under its span
    assert any(descends(call, run, spans) for call in chat_spans(spans))
    assert any(descends(s, run, spans) for s in spans if s.name.startswith("search_memory"))
