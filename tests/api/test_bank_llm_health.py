"""``POST .../health/llm`` (the client's ``BanksApi.test_bank_llm``) on a real server whose
providers talk to the fake OpenAI-compatible upstream: each operation's status in
Hindsight's words (``connected`` with its latency, ``auth_failed`` on a 401, ``unreachable``
on a 500, ``timeout`` on a slow upstream, ``not_configured`` for an operation whose provider
cannot be built), retain and consolidation's shared provider probed once, an unknown bank a
404, and a client that leaves stops the probe's call upstream.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hindsight_client_api.api.banks_api import BanksApi
from hindsight_client_api.api_client import ApiClient
from hindsight_client_api.configuration import Configuration
from hindsight_client_api.models.bank_llm_health_response import BankLlmHealthResponse

from heed.api.app import create_app
from heed.settings import Settings
from tests.llm.fake_upstream import Behaviour, RunningUpstream, serve_fake_upstream
from tests.support import LiveServer, live_server, metric_value, wait_for


@pytest.fixture(scope="module")
def upstream() -> Iterator[RunningUpstream]:
    with serve_fake_upstream() as running:
        yield running


def settings(data_dir: Path, upstream: RunningUpstream, **more: object) -> Settings:
    return Settings(
        data_dir=data_dir,
        llm_provider="openai",
        llm_model="fake-model",
        llm_base_url=upstream.base_url,
        llm_api_key="test-key",  # type: ignore[arg-type]
        llm_retries=0,
        retain_extraction="off",
        observations="off",
        **more,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def server(
    upstream: RunningUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    with live_server(create_app(settings(tmp_path_factory.mktemp("llm-health"), upstream))) as srv:
        yield srv


@pytest.fixture
def bank(server: LiveServer, upstream: RunningUpstream) -> Iterator[str]:
    upstream.app.reset()
    name = "probe-" + uuid.uuid4().hex[:8]
    httpx.put(f"{server.url}/v1/default/banks/{name}", json={}, timeout=30).raise_for_status()
    yield name
    upstream.app.reset()
    server.app.state.services.llm_health.timeout = 10.0


def probe(server: LiveServer, bank: str) -> BankLlmHealthResponse:
    async def call() -> BankLlmHealthResponse:
        async with ApiClient(Configuration(host=server.url)) as api_client:
            return await BanksApi(api_client).test_bank_llm(bank)

    return asyncio.run(call())


def statuses(found: BankLlmHealthResponse) -> dict[str, tuple[bool, str]]:
    return {op.operation: (op.ok, op.status) for op in found.operations}


def test_a_working_upstream_is_connected_and_a_shared_provider_is_probed_once(
    server: LiveServer, upstream: RunningUpstream, bank: str
) -> None:
    found = probe(server, bank)
    assert found.bank_id == bank
    assert [op.operation for op in found.operations] == ["retain", "consolidation", "reflect"]
    assert statuses(found) == {
        "retain": (True, "connected"),
        "consolidation": (True, "connected"),
        "reflect": (True, "connected"),
    }
    assert all(op.latency_ms is not None and op.latency_ms > 0 for op in found.operations)
    # retain and consolidation share one provider; reflect has its own: two calls.
    assert len(upstream.app.records) == 2
    assert all(r.body["max_tokens"] == 1 for r in upstream.app.records)


@pytest.mark.parametrize(
    ("status", "expected"), [(401, "auth_failed"), (403, "auth_failed"), (500, "unreachable")]
)
def test_an_upstream_error_is_named_by_its_status_and_nothing_leaks(
    server: LiveServer, upstream: RunningUpstream, bank: str, status: int, expected: str
) -> None:
    upstream.app.default = Behaviour(status=status, body={"error": {"message": "secret detail"}})
    response = httpx.post(f"{server.url}/v1/default/banks/{bank}/health/llm", timeout=30)
    assert response.status_code == 200, response.text
    assert "secret" not in response.text and "fake-model" not in response.text
    operations = response.json()["operations"]
    assert {op["status"] for op in operations} == {expected}
    assert not any(op["ok"] for op in operations)


def test_a_slow_upstream_is_a_timeout(
    server: LiveServer, upstream: RunningUpstream, bank: str
) -> None:
    server.app.state.services.llm_health.timeout = 0.3
    upstream.app.default = Behaviour(header_delay=10.0)
    started = time.monotonic()
    found = probe(server, bank)
    assert time.monotonic() - started < 6.0  # not the two upstream answers' 20 s
    assert {op.status for op in found.operations} == {"timeout"}
    assert all(op.latency_ms is not None and op.latency_ms >= 300 for op in found.operations)


def test_an_unknown_bank_is_a_404(server: LiveServer) -> None:
    response = httpx.post(f"{server.url}/v1/default/banks/no-such-bank/health/llm", timeout=10)
    assert response.status_code == 404


async def test_a_client_that_leaves_stops_the_probe(
    server: LiveServer, upstream: RunningUpstream, bank: str
) -> None:
    labels = {"method": "POST", "route": "/v1/default/banks/{bank_id}/health/llm"}

    def answered(status: str) -> float:
        text = httpx.get(f"{server.url}/metrics", timeout=10).text
        return metric_value(text, "heed_http_requests_total", **labels, status=status)

    before = await asyncio.to_thread(lambda: (answered("200"), answered("499")))
    upstream.app.default = Behaviour(header_delay=30.0)
    async with httpx.AsyncClient(base_url=server.url) as http:
        request = asyncio.create_task(http.post(f"/v1/default/banks/{bank}/health/llm"))
        await asyncio.to_thread(wait_for, lambda: upstream.app.records, 10)
        request.cancel()  # closes the connection: the server sees http.disconnect
        with pytest.raises(asyncio.CancelledError):
            await request
    [record] = upstream.app.records
    assert await asyncio.to_thread(record.wait_disconnected, 5.0)
    # The request ended cancelled (499), not with the probes' statuses.
    await asyncio.to_thread(wait_for, lambda: answered("499") == before[1] + 1, 5)
    assert await asyncio.to_thread(answered, "200") == before[0]
    assert len(upstream.app.records) == 1  # the reflect probe never started


def test_an_operation_without_a_provider_is_not_configured(
    upstream: RunningUpstream, tmp_path: Path
) -> None:
    upstream.app.reset()
    app = create_app(settings(tmp_path, upstream, reflect_llm_provider="nonexistent"))
    with live_server(app) as srv:
        httpx.put(f"{srv.url}/v1/default/banks/b", json={}, timeout=30).raise_for_status()
        found = probe(srv, "b")
    assert statuses(found) == {
        "retain": (True, "connected"),
        "consolidation": (True, "connected"),
        "reflect": (False, "not_configured"),
    }
    assert found.operations[2].latency_ms is None
