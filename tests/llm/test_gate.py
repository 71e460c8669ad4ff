"""A remote provider's gate (heed.llm.gate), with the openai provider against the fake
OpenAI-compatible upstream on loopback: the bound, users first, 429 honoured, cancels."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from heed.llm import ChatMessage, UpstreamRateLimited, complete
from heed.llm.gate import GatedProvider, ProviderGate, ProviderGates, call_concurrency
from heed.llm.openai import OpenAIProvider
from heed.llm.usage import llm_work
from heed.runtime import CancellationToken, OperationCancelled, RequestContext, use_context
from tests.llm.fake_upstream import Behaviour, RunningUpstream, most_at_once, text_chunks

HELLO = [ChatMessage.user("hello")]
MakeProvider = Callable[..., OpenAIProvider]


def slow(seconds: float) -> Behaviour:
    return Behaviour(header_delay=seconds, chunks=text_chunks(["ok"]))


async def call(provider: GatedProvider, *, background: bool, label: str = "") -> str:
    with llm_work("t", "bank", "consolidation" if background else "reflect", background=background):
        reply = await complete(provider, [ChatMessage.user(label or "hello")])
    return reply.text


async def test_no_more_calls_than_the_concurrency_are_in_flight(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    upstream.app.default = slow(0.3)
    provider = GatedProvider(make_openai(), ProviderGate("fake", 3, 64))
    replies = await asyncio.gather(*(call(provider, background=False) for _ in range(7)))
    assert replies == ["ok"] * 7
    assert most_at_once(upstream.app.records) == 3
    assert provider.gate.stats().in_use == 0


async def test_background_calls_leave_a_slot_and_yield_to_a_user(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    upstream.app.default = slow(1.0)
    provider = GatedProvider(make_openai(), ProviderGate("fake", 2, 64))
    assert call_concurrency(provider, background=True) == 1
    assert call_concurrency(provider, background=False) == 2
    background = [
        asyncio.ensure_future(call(provider, background=True, label=f"bg{n}")) for n in range(3)
    ]
    await asyncio.sleep(0.2)  # one background call in flight, two queued
    assert provider.gate.stats().background_in_use == 1
    assert provider.gate.stats().background_queued == 2
    user = await call(provider, background=False, label="user")
    assert user == "ok"
    await asyncio.gather(*background)
    # The slot background work may not take served the user while bg0 was in flight.
    order = [r.body["messages"][-1]["content"] for r in upstream.app.records]
    assert order[:2] == ["bg0", "user"] and sorted(order[2:]) == ["bg1", "bg2"]


async def test_a_429_pauses_the_gate_and_a_background_call_tries_again(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    refused = Behaviour(
        status=429, headers={"retry-after": "1"}, body={"error": {"message": "slow down"}}
    )
    upstream.app.plan(refused)
    upstream.app.default = Behaviour(chunks=text_chunks(["ok"]))
    provider = GatedProvider(make_openai(retries=0), ProviderGate("fake", 4, 64))
    started = time.monotonic()
    assert await call(provider, background=True) == "ok"
    assert time.monotonic() - started >= 0.95  # the Retry-After was honoured
    assert len(upstream.app.records) == 2
    assert provider.gate.pauses == 1


async def test_a_user_call_during_a_long_pause_is_refused_without_a_request(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    provider = GatedProvider(make_openai(), ProviderGate("fake", 4, 64))
    provider.gate.pause(30)
    with pytest.raises(UpstreamRateLimited) as refused:
        await call(provider, background=False)
    assert 29 <= refused.value.retry_after <= 30
    assert upstream.app.records == []


async def test_a_user_call_gets_the_429_itself(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    upstream.app.default = Behaviour(status=429, headers={"retry-after": "2"})
    provider = GatedProvider(make_openai(retries=0), ProviderGate("fake", 4, 64))
    with pytest.raises(UpstreamRateLimited):
        await call(provider, background=False)
    assert len(upstream.app.records) == 1
    assert provider.gate.paused_for() > 1


async def test_a_call_waiting_for_a_slot_leaves_when_cancelled(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    upstream.app.default = slow(1.0)
    provider = GatedProvider(make_openai(), ProviderGate("fake", 1, 64))
    first = asyncio.ensure_future(call(provider, background=False))
    await asyncio.sleep(0.05)
    token = CancellationToken()

    async def waiting() -> str:
        with use_context(RequestContext(token=token)):
            return await call(provider, background=False)

    second = asyncio.ensure_future(waiting())
    await asyncio.sleep(0.05)
    assert provider.gate.stats().queued == 1
    token.cancel("client left")
    with pytest.raises(OperationCancelled):
        await asyncio.wait_for(second, 0.5)
    assert provider.gate.stats().queued == 0
    assert await first == "ok"
    assert len(upstream.app.records) == 1


def test_one_gate_per_upstream() -> None:
    gates = ProviderGates(8, 64)
    assert gates.for_upstream("http://a") is gates.for_upstream("http://a")
    assert gates.for_upstream("http://a") is not gates.for_upstream("http://b")
    assert gates.for_upstream("http://a").concurrency == 8
    # Named after the provider, never the URL (it shows in /metrics and 503 messages).
    assert [g.lane.name for g in gates.all()] == ["llm:openai", "llm:openai#2"]


def test_the_factory_gates_remote_providers_only() -> None:
    from heed.llm.factory import build_provider
    from heed.settings import Settings

    gates = ProviderGates(5, 64)
    remote = Settings(llm_provider="openai", llm_base_url="http://127.0.0.1:9/v1", llm_model="m")
    retain = build_provider(remote, "retain", gates)
    reflect = build_provider(remote, "reflect", gates)
    assert isinstance(retain, GatedProvider) and isinstance(reflect, GatedProvider)
    assert retain.gate is reflect.gate  # one upstream, one bound
    assert retain.gate.concurrency == 5
    scripted = build_provider(Settings(llm_provider="scripted"), "retain", gates)
    assert not isinstance(scripted, GatedProvider)
    assert call_concurrency(scripted, background=True) == 1
