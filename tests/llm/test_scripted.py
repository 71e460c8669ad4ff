"""The scripted provider: deterministic, delay-per-token, cancellable, scriptable from JSON."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from pathlib import Path

import pytest

from heed.llm import (
    BadModelOutput,
    ChatMessage,
    ChatProvider,
    Finish,
    JsonSchemaFormat,
    ProviderError,
    ScriptedProvider,
    ScriptedReply,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    UpstreamRateLimited,
    UpstreamUnavailable,
    Usage,
    complete,
)
from heed.llm.scripted import split_tokens
from heed.runtime import OperationCancelled, RequestContext, use_context

AGENT_SCRIPT = {
    "replies": [
        {"tool_calls": [{"name": "recall", "arguments": {"query": "pets"}}]},
        {"text": "Alice has two cats."},
    ]
}


def test_is_a_chat_provider() -> None:
    provider: ChatProvider = ScriptedProvider()
    assert isinstance(provider, ChatProvider)
    assert provider.name == "scripted"


def test_split_tokens_is_lossless() -> None:
    for text in ["", "one", "  two  words ", "line\nbreak\n\n", "Alice has two cats."]:
        assert "".join(split_tokens(text)) == text
    assert split_tokens("Alice has two cats.") == ["Alice ", "has ", "two ", "cats."]


async def test_stream_shape_for_text() -> None:
    provider = ScriptedProvider({"replies": [{"text": "Hello there friend"}]})
    events = [e async for e in provider.stream([ChatMessage.user("hi you")])]
    assert events == [
        TextDelta("Hello "),
        TextDelta("there "),
        TextDelta("friend"),
        Usage(prompt_tokens=2, completion_tokens=3),
        Finish("stop"),
    ]


async def test_agent_loop_is_deterministic_per_conversation() -> None:
    provider = ScriptedProvider(AGENT_SCRIPT)
    question = [ChatMessage.user("What pets does Alice have?")]
    first = await complete(provider, question)
    assert first.tool_calls == [ToolCall(id="call_0_0", name="recall", arguments={"query": "pets"})]
    assert first.finish_reason == "tool_calls"
    history = [*question, first.as_message(), ChatMessage.tool("call_0_0", "Alice: 2 cats")]
    second = await complete(provider, history)
    assert second.text == "Alice has two cats."
    # the same conversation replayed gives the same replies, whatever ran in between
    assert (await complete(provider, question)).tool_calls == first.tool_calls
    assert (await complete(provider, history)).text == second.text
    # past the end of the script, the last reply repeats
    longer = [*history, second.as_message(), ChatMessage.user("and?")]
    assert (await complete(provider, longer)).text == "Alice has two cats."
    assert [r.reply_index for r in provider.requests] == [0, 1, 0, 1, 1]


async def test_concurrent_conversations_get_their_own_replies() -> None:
    provider = ScriptedProvider({**AGENT_SCRIPT, "token_delay": 0.005})
    question = [ChatMessage.user("q")]
    results = await asyncio.gather(*(complete(provider, question) for _ in range(5)))
    assert all(r.tool_calls and r.tool_calls[0].name == "recall" for r in results)


async def test_sequence_mode_and_when_rules() -> None:
    provider = ScriptedProvider(
        {
            "select": "sequence",
            "replies": [
                {"when": "weather", "text": "Sunny."},
                {"text": "one"},
                {"text": "two"},
            ],
        }
    )
    ask = [ChatMessage.user("hello")]
    assert (await complete(provider, ask)).text == "one"
    assert (await complete(provider, [ChatMessage.user("What's the WEATHER?")])).text == "Sunny."
    assert (await complete(provider, ask)).text == "two"
    assert (await complete(provider, ask)).text == "two"


async def test_no_script_echoes_the_last_user_message() -> None:
    result = await complete(ScriptedProvider(), [ChatMessage.user("echo me please")])
    assert result.text == "echo me please"


async def test_per_token_delay() -> None:
    provider = ScriptedProvider({"token_delay": 0.03, "replies": [{"text": "a b c d e f g h i j"}]})
    seen: list[float] = []
    started = time.monotonic()
    async for event in provider.stream([ChatMessage.user("x")]):
        if isinstance(event, TextDelta):
            seen.append(time.monotonic() - started)
    assert len(seen) == 10
    assert seen[-1] >= 10 * 0.03 * 0.9
    assert seen[-1] < 10 * 0.03 + 1.5
    gaps = [b - a for a, b in itertools.pairwise(seen)]
    assert min(gaps) >= 0.02


async def test_reply_delay_overrides_script_delay() -> None:
    provider = ScriptedProvider(
        {"token_delay": 1.0, "replies": [{"text": "fast reply here", "token_delay": 0}]}
    )
    started = time.monotonic()
    assert (await complete(provider, [ChatMessage.user("x")])).text == "fast reply here"
    assert time.monotonic() - started < 0.5


async def test_max_tokens_cuts_with_length() -> None:
    provider = ScriptedProvider({"replies": [{"text": "one two three four five"}]})
    result = await complete(provider, [ChatMessage.user("x")], max_tokens=2)
    assert result.text == "one two "
    assert result.finish_reason == "length"


async def test_cancel_stops_within_one_token() -> None:
    provider = ScriptedProvider({"token_delay": 0.05, "replies": [{"text": "word " * 200}]})
    ctx = RequestContext()
    received: list[float] = []

    async def consume() -> None:
        with use_context(ctx):
            async for event in provider.stream([ChatMessage.user("x")]):
                if isinstance(event, TextDelta):
                    received.append(time.monotonic())

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.3)
    ctx.token.cancel("client disconnected")
    with pytest.raises(OperationCancelled, match="client disconnected"):
        await task
    assert ctx.token.cancelled_at is not None
    assert time.monotonic() - ctx.token.cancelled_at < 0.1
    assert 2 <= len(received) < 20
    assert all(t <= ctx.token.cancelled_at for t in received)
    assert provider.last_token_at is not None
    assert provider.last_token_at <= ctx.token.cancelled_at


@pytest.mark.parametrize(
    ("kind", "error", "status"),
    [
        ("unavailable", UpstreamUnavailable, 503),
        ("rate_limited", UpstreamRateLimited, 503),
        ("bad_output", BadModelOutput, 502),
    ],
)
async def test_scripted_errors(kind: str, error: type[ProviderError], status: int) -> None:
    provider = ScriptedProvider(
        {"replies": [{"text": "partial answer", "error": kind, "error_message": "it broke"}]}
    )
    events: list[object] = []
    with pytest.raises(error, match="it broke") as caught:
        async for event in provider.stream([ChatMessage.user("x")]):
            events.append(event)
    assert caught.value.status_code == status
    assert events == [TextDelta("partial "), TextDelta("answer")]


async def test_script_from_json_text_file_and_setter(tmp_path: Path) -> None:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"replies": [{"text": "from a file"}]}))
    from_file = ScriptedProvider(str(path))
    assert (await complete(from_file, [ChatMessage.user("x")])).text == "from a file"

    from_text = ScriptedProvider('[{"text": "a bare list"}]')
    assert (await complete(from_text, [ChatMessage.user("x")])).text == "a bare list"

    from_text.script = {"replies": [{"tool_calls": [{"name": "done", "id": "c9"}]}]}
    events = [e async for e in from_text.stream([ChatMessage.user("x")])]
    assert ToolCallEvent("c9", "done", {}) in events


@pytest.mark.parametrize(
    ("script", "needle"),
    [
        ("{not json", "not valid JSON"),
        ('{"replies": [{"txt": "typo"}]}', "txt"),
        ("/no/such/script.json", "neither JSON nor a readable file"),
    ],
)
def test_bad_scripts_are_400_naming_the_problem(script: str, needle: str) -> None:
    with pytest.raises(ProviderError, match=needle) as caught:
        ScriptedProvider(script)
    assert caught.value.status_code == 400


async def test_a_json_reply_is_its_json_text() -> None:
    value = {"facts": ["Alice has two cats"], "n": 1, "ok": True}
    provider = ScriptedProvider({"replies": [{"json": value}]})
    result = await complete(provider, [ChatMessage.user("x")])
    assert result.text == json.dumps(value)
    assert json.loads(result.text) == value
    assert result.finish_reason == "stop"
    assert ScriptedReply(json=[1, 2]).reply_text == "[1, 2]"


async def test_the_json_schema_is_recorded_not_enforced() -> None:
    schema = JsonSchemaFormat(name="facts", schema={"type": "object", "required": ["facts"]})
    provider = ScriptedProvider({"replies": [{"text": "not JSON at all"}]})
    result = await complete(provider, [ChatMessage.user("x")], json_schema=schema)
    assert result.text == "not JSON at all"
    assert provider.requests[-1].json_schema == schema
    await complete(provider, [ChatMessage.user("x")])
    assert provider.requests[-1].json_schema is None


@pytest.mark.parametrize(
    "script",
    [
        {"replies": [{"text": "both", "json": {"a": 1}}]},
        json.dumps([{"text": "both", "json": {"a": 1}}]),
    ],
)
def test_text_and_json_together_are_refused(script: object) -> None:
    with pytest.raises(ProviderError, match="both 'text' and 'json'") as caught:
        ScriptedProvider(script)  # type: ignore[arg-type]
    assert caught.value.status_code == 400
    with pytest.raises(ProviderError, match="both 'text' and 'json'"):
        ScriptedReply(text="both", json={"a": 1})


async def test_latency_passes_before_the_first_token_then_the_reply_comes_at_once() -> None:
    provider = ScriptedProvider({"replies": [{"json": {"a": 1, "b": [1, 2, 3]}, "latency": 0.3}]})
    started = time.monotonic()
    seen: list[float] = []
    async for event in provider.stream([ChatMessage.user("x")]):
        if isinstance(event, TextDelta):
            seen.append(time.monotonic() - started)
    assert len(seen) > 3
    assert seen[0] >= 0.3 * 0.95
    assert seen[-1] - seen[0] < 0.1


async def test_latency_is_cancellable() -> None:
    provider = ScriptedProvider({"replies": [{"text": "late answer", "latency": 5.0}]})
    ctx = RequestContext()
    asyncio.get_running_loop().call_later(0.1, ctx.token.cancel, "client disconnected")
    started = time.monotonic()
    with use_context(ctx), pytest.raises(OperationCancelled, match="client disconnected"):
        await complete(provider, [ChatMessage.user("x")])
    assert time.monotonic() - started < 0.5
    assert provider.last_token_at is None, "no token was produced"


async def test_when_rules_pick_json_replies() -> None:
    provider = ScriptedProvider(
        {
            "replies": [
                {"when": "extract facts", "json": {"facts": ["a"]}, "latency": 0.01},
                {"text": "plain answer"},
            ]
        }
    )
    facts = await complete(provider, [ChatMessage.user("Please EXTRACT FACTS from: a")])
    assert json.loads(facts.text) == {"facts": ["a"]}
    assert provider.requests[-1].reply_index == 0
    plain = await complete(provider, [ChatMessage.user("hello")])
    assert plain.text == "plain answer"
    assert provider.requests[-1].reply_index == 1
