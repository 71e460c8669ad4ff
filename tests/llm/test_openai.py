"""The openai provider against a fake OpenAI-compatible server on a real loopback port."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable

import pytest

from heed.llm import (
    BadModelOutput,
    ChatMessage,
    Finish,
    JsonSchemaFormat,
    LlmObserver,
    ProviderError,
    TextDelta,
    ToolCall,
    ToolSpec,
    UnknownModel,
    UpstreamRateLimited,
    UpstreamUnavailable,
    Usage,
    add_global_observer,
    complete,
    complete_json,
    observing,
)
from heed.llm.observe import remove_global_observer
from heed.llm.openai import OpenAIProvider
from heed.runtime import OperationCancelled, RequestContext, use_context
from tests.llm.conftest import wait_for_disconnect
from tests.llm.fake_upstream import (
    Behaviour,
    RunningUpstream,
    text_chunks,
    tool_call_chunks,
    usage_chunk,
)
from tests.support import free_port

MakeProvider = Callable[..., OpenAIProvider]
HELLO = [ChatMessage.system("Be brief."), ChatMessage.user("Say hello")]


def slow_words(n: int = 200) -> list[str]:
    return [f"w{i} " for i in range(n)]


async def test_streams_text_then_usage_then_finish(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    provider = make_openai()
    events = [e async for e in provider.stream(HELLO, max_tokens=20, temperature=0.5)]
    assert events == [TextDelta("Hello"), TextDelta(" world"), Usage(3, 2), Finish("stop")]
    body = upstream.app.records[0].body
    assert body["model"] == "fake-model"
    assert body["stream"] is True
    assert body["max_tokens"] == 20
    assert body["temperature"] == 0.5
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hello"},
    ]


async def test_tool_calls_are_assembled_from_deltas(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    upstream.app.plan(
        Behaviour(
            chunks=[
                *tool_call_chunks(
                    [
                        ("call_a", "recall", ['{"que', 'ry": "ca', 'ts", "k', '": 5}']),
                        ("call_b", "expand", ['{"memory_id"', ': "m-7"}']),
                    ]
                ),
                usage_chunk(40, 12),
            ]
        )
    )
    tools = [
        ToolSpec(name="recall", description="search memories"),
        ToolSpec(name="expand", description="open a memory"),
    ]
    result = await complete(make_openai(), HELLO, tools=tools)
    assert result.tool_calls == [
        ToolCall(id="call_a", name="recall", arguments={"query": "cats", "k": 5}),
        ToolCall(id="call_b", name="expand", arguments={"memory_id": "m-7"}),
    ]
    assert result.finish_reason == "tool_calls"
    assert result.usage == Usage(40, 12)
    sent_tools = upstream.app.records[0].body["tools"]
    assert [t["function"]["name"] for t in sent_tools] == ["recall", "expand"]
    assert sent_tools[0]["type"] == "function"


async def test_tool_round_trip_messages_use_the_openai_wire_format(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    call = ToolCall(id="call_1", name="recall", arguments={"query": "x"})
    messages = [
        ChatMessage.user("q"),
        ChatMessage.assistant("", [call]),
        ChatMessage.tool("call_1", "result text", name="recall"),
    ]
    await complete(make_openai(), messages)
    sent = upstream.app.records[0].body["messages"]
    assert sent[1]["tool_calls"][0] == {
        "id": "call_1",
        "type": "function",
        "function": {"name": "recall", "arguments": '{"query": "x"}'},
    }
    assert sent[2] == {
        "role": "tool",
        "content": "result text",
        "tool_call_id": "call_1",
        "name": "recall",
    }


async def test_cancel_mid_stream_closes_the_upstream_connection(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    upstream.app.plan(Behaviour(chunks=text_chunks(slow_words()), interval=0.02))
    provider = make_openai()
    ctx = RequestContext()
    received_at: list[float] = []

    async def consume() -> None:
        with use_context(ctx):
            async for _event in provider.stream(HELLO):
                received_at.append(time.monotonic())

    task = asyncio.create_task(consume())
    while len(received_at) < 10:
        await asyncio.sleep(0.005)
        assert not task.done(), "the stream ended early"
    ctx.token.cancel("client disconnected")
    cancelled_at = ctx.token.cancelled_at
    assert cancelled_at is not None
    with pytest.raises(OperationCancelled):
        await task
    raised_at = time.monotonic()
    record = upstream.app.records[0]
    closed_at = wait_for_disconnect(record)

    assert raised_at - cancelled_at < 0.1, "the consumer was not released promptly"
    assert closed_at - cancelled_at < 0.1, "the upstream connection stayed open"
    assert all(t <= cancelled_at for t in received_at), "tokens were read after the cancel"
    assert all(t <= closed_at for t in record.sent_at)
    time.sleep(0.1)  # had the connection stayed open, the fake would keep sending
    assert record.chunks_sent < 40
    assert all(t < cancelled_at + 0.1 for t in record.sent_at)


async def test_cancel_while_waiting_for_response_headers(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    upstream.app.plan(Behaviour(header_delay=10.0, chunks=text_chunks(["late"])))
    provider = make_openai()
    ctx = RequestContext()
    asyncio.get_running_loop().call_later(0.2, ctx.token.cancel, "client disconnected")
    with use_context(ctx), pytest.raises(OperationCancelled):
        await complete(provider, HELLO)
    assert ctx.token.cancelled_at is not None
    assert time.monotonic() - ctx.token.cancelled_at < 0.1
    closed_at = wait_for_disconnect(upstream.app.records[0])
    assert closed_at - ctx.token.cancelled_at < 0.1


async def test_cancel_from_another_thread(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    upstream.app.plan(Behaviour(chunks=text_chunks(slow_words()), interval=0.02))
    provider = make_openai()
    ctx = RequestContext()
    asyncio.get_running_loop().call_later(
        0.2, lambda: asyncio.get_running_loop().run_in_executor(None, ctx.token.cancel, "thread")
    )
    with use_context(ctx), pytest.raises(OperationCancelled, match="thread"):
        await complete(provider, HELLO)
    assert ctx.token.cancelled_at is not None
    closed_at = wait_for_disconnect(upstream.app.records[0])
    assert closed_at - ctx.token.cancelled_at < 0.1


async def test_leaving_the_stream_early_closes_the_upstream(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    upstream.app.plan(Behaviour(chunks=text_chunks(slow_words()), interval=0.02))
    provider = make_openai()
    count = 0
    async with contextlib.aclosing(provider.stream(HELLO)) as events:
        async for _event in events:
            count += 1
            if count == 3:
                break
    left_at = time.monotonic()
    closed_at = wait_for_disconnect(upstream.app.records[0])
    assert closed_at - left_at < 0.1


async def test_rate_limit_is_503_with_retry_after_and_not_retried_when_long(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    upstream.app.plan(
        Behaviour(
            status=429,
            body={"error": {"message": "Rate limit reached for requests"}},
            headers={"Retry-After": "7"},
        )
    )
    with pytest.raises(UpstreamRateLimited) as caught:
        await complete(make_openai(retries=2), HELLO)
    error = caught.value
    assert error.status_code == 503
    assert error.retry_after == 7
    assert error.headers == {"Retry-After": "7"}
    assert "Rate limit reached for requests" in error.message
    assert len(upstream.app.records) == 1


async def test_short_rate_limit_is_retried(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    upstream.app.plan(Behaviour(status=429, headers={"Retry-After": "1"}))
    result = await complete(make_openai(retries=1), HELLO)
    assert result.text == "Hello world"
    assert len(upstream.app.records) == 2


async def test_5xx_is_retried_then_reported_with_the_upstream_message(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    failure = Behaviour(status=502, body={"error": {"message": "model server overloaded"}})
    upstream.app.plan(failure, failure, failure, failure)
    with pytest.raises(UpstreamUnavailable) as caught:
        await complete(make_openai(retries=2), HELLO)
    assert caught.value.status_code == 503
    assert "model server overloaded" in caught.value.message
    assert "502" in caught.value.message
    assert len(upstream.app.records) == 3


async def test_a_5xx_then_success_recovers(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    upstream.app.plan(Behaviour(status=503, body="warming up"))
    result = await complete(make_openai(retries=1), HELLO)
    assert result.text == "Hello world"
    assert len(upstream.app.records) == 2


async def test_unreachable_endpoint_is_503_naming_the_url(make_openai: MakeProvider) -> None:
    port = free_port()  # nothing listens there
    base_url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(UpstreamUnavailable) as caught:
        await complete(make_openai(base_url=base_url, retries=1), HELLO)
    assert caught.value.status_code == 503
    assert f"127.0.0.1:{port}" in caught.value.message


async def test_malformed_tool_call_json_is_bad_model_output(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    upstream.app.plan(Behaviour(chunks=tool_call_chunks([("c1", "recall", ['{"query": "ca'])])))
    with pytest.raises(BadModelOutput) as caught:
        await complete(make_openai(), HELLO, tools=[ToolSpec(name="recall")])
    assert caught.value.status_code == 502
    assert "recall" in caught.value.message
    assert "malformed JSON" in caught.value.message


async def test_malformed_chunk_is_bad_model_output(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    upstream.app.plan(Behaviour(chunks=["{not json"]))
    with pytest.raises(BadModelOutput, match="malformed stream chunk"):
        await complete(make_openai(), HELLO)


async def test_unknown_model_names_the_model(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    upstream.app.plan(
        Behaviour(
            status=404,
            body={
                "error": {"message": "The model `nope` does not exist", "code": "model_not_found"}
            },
        )
    )
    with pytest.raises(UnknownModel) as caught:
        await complete(make_openai(model="nope", retries=2), HELLO)
    assert caught.value.status_code == 400
    assert "'nope'" in caught.value.message
    assert len(upstream.app.records) == 1


def test_missing_model_is_refused_at_construction() -> None:
    with pytest.raises(UnknownModel, match="HEED_LLM_MODEL"):
        OpenAIProvider(model="", base_url="http://127.0.0.1:9/v1")


async def test_bad_key_is_502_with_upstream_message(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    upstream.app.plan(Behaviour(status=401, body={"error": {"message": "Incorrect API key"}}))
    with pytest.raises(ProviderError) as caught:
        await complete(make_openai(retries=2), HELLO)
    assert caught.value.status_code == 502
    assert "Incorrect API key" in caught.value.message
    assert len(upstream.app.records) == 1


async def test_error_event_mid_stream(upstream: RunningUpstream, make_openai: MakeProvider) -> None:
    upstream.app.plan(
        Behaviour(chunks=[*text_chunks(["partial"], finish=None), {"error": {"message": "boom"}}])
    )
    with pytest.raises(ProviderError, match="boom"):
        await complete(make_openai(retries=2), HELLO)
    assert len(upstream.app.records) == 1, "a stream that produced output is never retried"


async def test_stream_cut_before_finishing_is_503(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    upstream.app.plan(Behaviour(chunks=text_chunks(["half"], finish=None), done=False))
    with pytest.raises(UpstreamUnavailable, match="before finishing"):
        await complete(make_openai(), HELLO)


async def test_silence_longer_than_the_timeout_is_503(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    # The timeout leaves room for the headers on a loaded machine (0.3 s did not, once, in a
    # full suite run: the headers came late and the error named the wait for an answer).
    upstream.app.plan(Behaviour(chunks=text_chunks(["a", "b"]), interval=6.0))
    started = time.monotonic()
    with pytest.raises(UpstreamUnavailable, match="no data"):
        await complete(make_openai(timeout=1.5), HELLO)
    assert time.monotonic() - started < 5.0


async def test_retries_never_retry_a_cancellation(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    """Cancelled during the backoff after a 503: stop at once, no second request."""
    upstream.app.plan(*[Behaviour(status=503)] * 5)
    provider = make_openai(retries=4, retry_base_delay=5.0)
    ctx = RequestContext()
    asyncio.get_running_loop().call_later(0.3, ctx.token.cancel, "client disconnected")
    started = time.monotonic()
    with use_context(ctx), pytest.raises(OperationCancelled):
        await complete(provider, HELLO)
    assert time.monotonic() - started < 1.5
    await asyncio.sleep(0.2)
    assert len(upstream.app.records) == 1


async def test_cancel_during_a_request_is_not_retried(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    upstream.app.plan(*[Behaviour(header_delay=10.0)] * 3)
    provider = make_openai(retries=2, retry_base_delay=0.01)
    ctx = RequestContext()
    asyncio.get_running_loop().call_later(0.2, ctx.token.cancel, "client disconnected")
    with use_context(ctx), pytest.raises(OperationCancelled):
        await complete(provider, HELLO)
    await asyncio.sleep(0.3)
    assert len(upstream.app.records) == 1


async def test_an_already_cancelled_token_sends_nothing(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    ctx = RequestContext()
    ctx.token.cancel("gone")
    with use_context(ctx), pytest.raises(OperationCancelled):
        await complete(make_openai(), HELLO)
    await asyncio.sleep(0.1)
    assert upstream.app.records == []


FACTS = JsonSchemaFormat(
    name="facts",
    schema={
        "type": "object",
        "properties": {"facts": {"type": "array", "items": {"type": "string"}}},
        "required": ["facts"],
        "additionalProperties": False,
    },
)


async def test_json_schema_is_sent_as_response_format(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    upstream.app.plan(Behaviour(chunks=text_chunks(['{"facts": ', '["Alice has cats"]}'])))
    reply = await complete_json(make_openai(), HELLO, FACTS)
    assert reply.value == {"facts": ["Alice has cats"]}
    body = upstream.app.records[0].body
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "facts", "schema": FACTS.schema, "strict": True},
    }
    loose = JsonSchemaFormat(name="loose", schema={"type": "object"}, strict=False)
    await complete(make_openai(), HELLO, json_schema=loose)
    assert upstream.app.records[1].body["response_format"]["json_schema"]["strict"] is False
    await complete(make_openai(), HELLO)
    assert "response_format" not in upstream.app.records[2].body


class Heard:
    """An observer recording what the provider reported."""

    def __init__(self) -> None:
        self.retries: list[tuple[str, int | None, str, float]] = []
        self.failures: list[tuple[str, int | None, str]] = []
        self.observer = LlmObserver(
            on_retry=lambda *args: self.retries.append(args),
            on_failure=lambda *args: self.failures.append(args),
        )


async def test_a_429_then_success_reports_one_retry(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    upstream.app.plan(Behaviour(status=429, headers={"Retry-After": "1"}))
    heard = Heard()
    with observing(heard.observer):
        result = await complete(make_openai(retries=2, retry_base_delay=0.05), HELLO)
    assert result.text == "Hello world"
    assert len(heard.retries) == 1
    provider, status, reason, delay = heard.retries[0]
    assert (provider, status, reason) == ("openai", 429, "rate_limited")
    assert delay == 1.0  # the upstream's Retry-After, not the shorter backoff (0.025-0.05 s)
    assert heard.failures == []


async def test_repeated_503_reports_each_retry_then_one_failure(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    upstream.app.plan(*[Behaviour(status=503, body="overloaded")] * 4)
    heard = Heard()
    with observing(heard.observer), pytest.raises(UpstreamUnavailable) as caught:
        await complete(make_openai(retries=3, retry_base_delay=0.02), HELLO)
    assert caught.value.upstream_status == 503
    assert len(upstream.app.records) == 4
    assert [r[:3] for r in heard.retries] == [("openai", 503, "upstream_error")] * 3
    # the reported delays are the ones slept: jittered exponential backoff
    for n, (*_, delay) in enumerate(heard.retries):
        nominal = 0.02 * 2**n
        assert nominal / 2 <= delay <= nominal
    gaps = [b.started_at - a.started_at for a, b in itertools.pairwise(upstream.app.records)]
    for gap, (*_, delay) in zip(gaps, heard.retries, strict=True):
        assert gap >= delay * 0.9
    assert heard.failures == [("openai", 503, "upstream_error")]


async def test_unreachable_reports_no_status(make_openai: MakeProvider) -> None:
    heard = Heard()
    base_url = f"http://127.0.0.1:{free_port()}/v1"
    with observing(heard.observer), pytest.raises(UpstreamUnavailable):
        await complete(make_openai(base_url=base_url, retries=1), HELLO)
    assert [r[:3] for r in heard.retries] == [("openai", None, "unreachable")]
    assert heard.failures == [("openai", None, "unreachable")]


async def test_a_refusal_is_a_failure_without_retry(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    upstream.app.plan(Behaviour(status=401, body={"error": {"message": "Incorrect API key"}}))
    heard = Heard()
    with observing(heard.observer), pytest.raises(ProviderError):
        await complete(make_openai(retries=2), HELLO)
    assert heard.retries == []
    assert heard.failures == [("openai", 401, "refused")]


async def test_a_broken_stream_is_a_failure(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    upstream.app.plan(Behaviour(chunks=["{not json"]))
    heard = Heard()
    with observing(heard.observer), pytest.raises(BadModelOutput):
        await complete(make_openai(retries=2), HELLO)
    assert heard.failures == [("openai", None, "bad_output")]


async def test_a_cancellation_is_neither_a_retry_nor_a_failure(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    upstream.app.plan(*[Behaviour(status=503)] * 5)
    provider = make_openai(retries=4, retry_base_delay=5.0)
    heard = Heard()
    ctx = RequestContext()
    asyncio.get_running_loop().call_later(0.3, ctx.token.cancel, "client disconnected")
    started = time.monotonic()
    with observing(heard.observer), use_context(ctx), pytest.raises(OperationCancelled):
        await complete(provider, HELLO)
    assert time.monotonic() - started < 1.5, "the backoff woke on cancel"
    await asyncio.sleep(0.2)
    assert len(upstream.app.records) == 1
    assert len(heard.retries) == 1, "the retry was announced before its sleep"
    assert heard.failures == []


async def test_global_and_nested_observers_all_hear(
    upstream: RunningUpstream, make_openai: MakeProvider
) -> None:
    upstream.app.plan(Behaviour(status=500), Behaviour(status=500))
    outer, inner, everywhere = Heard(), Heard(), Heard()
    add_global_observer(everywhere.observer)
    try:
        with (
            observing(outer.observer),
            observing(inner.observer),
            pytest.raises(UpstreamUnavailable),
        ):
            await complete(make_openai(retries=1), HELLO)
    finally:
        remove_global_observer(everywhere.observer)
    for heard in (outer, inner, everywhere):
        assert [r[:3] for r in heard.retries] == [("openai", 500, "upstream_error")]
        assert heard.failures == [("openai", 500, "upstream_error")]
    # outside the block, and once removed, nobody hears
    upstream.app.plan(Behaviour(status=500))
    with pytest.raises(UpstreamUnavailable):
        await complete(make_openai(), HELLO)
    assert len(outer.failures) == len(everywhere.failures) == 1
