"""LLM retries and failures reach /metrics (issue 30: "LLM 429 / 5xx show as retries and
failures ... in /metrics, never silently").

Real servers on sockets: reflect on the ``openai`` provider against a fake OpenAI-compatible
upstream that answers 429 or 503, and a retain whose extraction call (the scripted provider)
gets a reply that is not JSON, which ``complete_json`` asks again, then gives up on. One
process-wide observer feeds the counters while any app serves, however many apps the
process builds.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from heed.api.app import create_app
from heed.settings import Settings
from tests.llm.fake_upstream import Behaviour, RunningUpstream, serve_fake_upstream
from tests.support import LiveServer, live_server, metric_value

RETRIES = "heed_llm_retries_total"
FAILURES = "heed_llm_failures_total"
TURNS = "Caroline: I adopted a puppy named Rex.\nMelanie: What breed is he?"


@pytest.fixture(scope="module")
def upstream() -> Iterator[RunningUpstream]:
    with serve_fake_upstream() as running:
        yield running


def settings(data_dir: Path, upstream: RunningUpstream) -> Settings:
    return Settings(
        data_dir=data_dir,
        llm_provider="openai",
        llm_model="fake-model",
        llm_base_url=upstream.base_url,
        llm_api_key="test-key",  # type: ignore[arg-type]
        llm_retries=1,
        # retain's extraction on the scripted provider: a reply that is never JSON
        retain_llm_provider="scripted",
        retain_llm_script=json.dumps({"replies": [{"when": "[0] (", "text": "not json at all"}]}),
        retain_extraction="concise",
        observations="off",
    )


@pytest.fixture(scope="module")
def server(
    upstream: RunningUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    with live_server(create_app(settings(tmp_path_factory.mktemp("llm-metrics"), upstream))) as srv:
        yield srv


def scrape(server: LiveServer) -> str:
    response = httpx.get(f"{server.url}/metrics", timeout=10)
    response.raise_for_status()
    return response.text


def new_bank(server: LiveServer) -> str:
    bank = "llm-" + uuid.uuid4().hex[:8]
    httpx.put(f"{server.url}/v1/default/banks/{bank}", json={}, timeout=30).raise_for_status()
    return bank


def reflect(server: LiveServer, bank: str) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/default/banks/{bank}/reflect",
        json={"query": "What does Caroline have?", "budget": "low"},
        timeout=60,
    )


def test_an_upstream_429_then_success_counts_one_retry_and_no_failure(
    server: LiveServer, upstream: RunningUpstream
) -> None:
    bank = new_bank(server)
    before = scrape(server)
    upstream.app.reset()
    upstream.app.plan(Behaviour(status=429, headers={"Retry-After": "1"}))
    response = reflect(server, bank)
    assert response.status_code == 200, response.text
    assert len(upstream.app.records) >= 2  # the 429, then the retry that answered
    after = scrape(server)
    labels = {"provider": "openai", "reason": "rate_limited"}
    assert metric_value(after, RETRIES, **labels) - metric_value(before, RETRIES, **labels) == 1
    assert metric_value(after, FAILURES, **labels) == metric_value(before, FAILURES, **labels)


def test_an_upstream_that_stays_at_503_counts_each_retry_then_one_failure(
    server: LiveServer, upstream: RunningUpstream
) -> None:
    bank = new_bank(server)
    before = scrape(server)
    upstream.app.reset()
    upstream.app.plan(*[Behaviour(status=503, body="overloaded")] * 2)  # llm_retries=1
    response = reflect(server, bank)
    assert response.status_code == 503, response.text
    assert len(upstream.app.records) == 2
    after = scrape(server)
    labels = {"provider": "openai", "reason": "upstream_error"}
    assert metric_value(after, RETRIES, **labels) - metric_value(before, RETRIES, **labels) == 1
    assert metric_value(after, FAILURES, **labels) - metric_value(before, FAILURES, **labels) == 1


def test_a_structured_reply_that_is_not_json_counts_a_reask_then_a_failure(
    server: LiveServer,
) -> None:
    bank = new_bank(server)
    before = scrape(server)
    response = httpx.post(
        f"{server.url}/v1/default/banks/{bank}/memories",
        json={"items": [{"content": TURNS}]},
        timeout=60,
    )
    assert response.status_code == 200, response.text  # the chunk is kept verbatim
    after = scrape(server)
    labels = {"provider": "scripted", "reason": "invalid_json"}
    assert metric_value(after, RETRIES, **labels) - metric_value(before, RETRIES, **labels) == 1
    assert metric_value(after, FAILURES, **labels) - metric_value(before, FAILURES, **labels) == 1
