"""Tracing off (the default): a server makes no span and installs no instrumentation."""

from __future__ import annotations

from pathlib import Path

import httpx
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from heed.api.app import create_app
from heed.api.middleware import RequestLifecycleMiddleware
from heed.runtime.tracing import tracing_enabled
from heed.services import Services
from heed.settings import Settings
from tests.support import live_server


def test_tracing_off_makes_no_span(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    settings = Settings(data_dir=tmp_path, llm_provider="scripted")
    assert settings.tracing == "off"
    app = create_app(settings, Services(settings, span_exporters=[exporter]))
    with live_server(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        assert not tracing_enabled()
        client.put("/v1/default/banks/b", json={}).raise_for_status()
        items = {"items": [{"content": "Alice has two cats."}]}
        client.post("/v1/default/banks/b/memories", json=items).raise_for_status()
        recall = client.post(
            "/v1/default/banks/b/memories/recall",
            json={"query": "cats"},
            headers={"traceparent": f"00-{'1' * 32}-{'2' * 16}-01"},
        )
        assert recall.status_code == 200
        assert isinstance(app.middleware_stack, RequestLifecycleMiddleware)  # nothing around it
    assert exporter.get_finished_spans() == ()
