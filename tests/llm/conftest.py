"""Fixtures for the provider tests: a fake OpenAI-compatible upstream on loopback."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from heed.llm.openai import OpenAIProvider
from tests.llm.fake_upstream import Record, RunningUpstream, serve_fake_upstream


@pytest.fixture(scope="module")
def upstream_server() -> Iterator[RunningUpstream]:
    with serve_fake_upstream() as running:
        yield running


@pytest.fixture
def upstream(upstream_server: RunningUpstream) -> RunningUpstream:
    upstream_server.app.reset()
    return upstream_server


@pytest.fixture
async def make_openai(
    upstream: RunningUpstream,
) -> AsyncIterator[Callable[..., OpenAIProvider]]:
    made: list[OpenAIProvider] = []

    def make(**overrides: object) -> OpenAIProvider:
        options: dict[str, object] = {
            "model": "fake-model",
            "base_url": upstream.base_url,
            "api_key": "test-key",
            "timeout": 10.0,
            "retries": 0,
            "retry_base_delay": 0.01,
        }
        options.update(overrides)
        provider = OpenAIProvider(**options)  # type: ignore[arg-type]
        made.append(provider)
        return provider

    yield make
    for provider in made:
        await provider.aclose()


def wait_for_disconnect(record: Record, timeout: float = 3.0) -> float:
    """Block until the fake upstream saw the client close; return that instant."""
    deadline = time.monotonic() + timeout
    while record.disconnected_at is None:
        if time.monotonic() > deadline:
            raise AssertionError("the upstream connection was never closed")
        time.sleep(0.005)
    return record.disconnected_at
