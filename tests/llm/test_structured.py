"""complete_json: one validated JSON object from any provider, one re-ask, never silent."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from typing import Any

import pytest
from referencing.exceptions import Unresolvable

from heed.llm import (
    BadModelOutput,
    ChatMessage,
    JsonSchemaFormat,
    LlmObserver,
    ProviderError,
    ScriptedProvider,
    StructuredReply,
    UpstreamUnavailable,
    complete_json,
    observing,
)
from heed.llm.structured import parse_json_object
from heed.runtime import OperationCancelled, RequestContext, use_context

PERSON = JsonSchemaFormat(
    name="person",
    schema={
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
)
ASK = [ChatMessage.system("Extract the person."), ChatMessage.user("Alice is 30.")]
GOOD = {"name": "Alice", "age": 30}


class Events:
    """An observer that records what it hears."""

    def __init__(self) -> None:
        self.retries: list[tuple[str, int | None, str, float]] = []
        self.failures: list[tuple[str, int | None, str]] = []
        self.observer = LlmObserver(
            on_retry=lambda *args: self.retries.append(args),
            on_failure=lambda *args: self.failures.append(args),
        )


def scripted(*replies: dict[str, Any]) -> ScriptedProvider:
    return ScriptedProvider({"select": "sequence", "replies": list(replies)})


async def test_a_valid_reply_is_returned_parsed() -> None:
    provider = scripted({"json": GOOD})
    reply = await complete_json(provider, ASK, PERSON, max_tokens=50, temperature=0.0)
    assert isinstance(reply, StructuredReply)
    assert reply.value == GOOD
    assert reply.attempts == 1
    assert reply.usage.completion_tokens > 0
    request = provider.requests[0]
    assert request.json_schema == PERSON, "the schema reaches the provider"
    assert (request.max_tokens, request.temperature) == (50, 0.0)
    assert list(request.messages) == ASK


async def test_malformed_then_valid_returns_the_second_and_names_the_error() -> None:
    provider = scripted({"text": '{"name": "Alice", "age": 30'}, {"json": GOOD})
    events = Events()
    with observing(events.observer):
        reply = await complete_json(provider, ASK, PERSON)
    assert reply.value == GOOD
    assert reply.attempts == 2
    first, second = provider.requests
    assert len(second.messages) == len(ASK) + 2
    said, told = second.messages[-2:]
    assert (said.role, said.content) == ("assistant", '{"name": "Alice", "age": 30')
    assert told.role == "user"
    assert "not valid JSON" in told.content
    assert "line 1 column" in told.content
    assert "person" in told.content
    assert second.json_schema == PERSON
    assert list(first.messages) == ASK, "the caller's messages are not modified"
    assert events.retries == [("scripted", None, "invalid_json", 0.0)]
    assert events.failures == []


async def test_two_malformed_replies_raise_bad_model_output() -> None:
    long_prose = "I cannot do that, sorry. " * 40
    provider = scripted({"text": "no JSON here"}, {"text": long_prose})
    events = Events()
    with observing(events.observer), pytest.raises(BadModelOutput) as caught:
        await complete_json(provider, ASK, PERSON)
    error = caught.value
    assert error.status_code == 502
    assert "2 attempts" in error.message
    assert "no JSON object" in error.message
    assert "I cannot do that" in error.message
    assert long_prose.strip() not in error.message, "only an excerpt of the reply"
    assert len(error.message) < 400
    assert len(provider.requests) == 2
    assert events.retries == [("scripted", None, "invalid_json", 0.0)]
    assert events.failures == [("scripted", None, "invalid_json")]


async def test_a_schema_violation_is_retried_naming_the_field() -> None:
    provider = scripted({"json": {"name": "Alice"}}, {"json": GOOD})
    events = Events()
    with observing(events.observer):
        reply = await complete_json(provider, ASK, PERSON)
    assert reply.value == GOOD
    assert reply.attempts == 2
    told = provider.requests[1].messages[-1].content
    assert "'age' is a required property" in told
    assert events.retries == [("scripted", None, "schema_violation", 0.0)]


async def test_schema_violations_after_the_retries_raise() -> None:
    provider = scripted({"json": {"name": "Alice", "age": -1}})
    with pytest.raises(BadModelOutput, match=r"minimum of 0") as caught:
        await complete_json(provider, ASK, PERSON, retries=2)
    assert "3 attempts" in caught.value.message
    assert "$.age" in caught.value.message
    assert len(provider.requests) == 3


async def test_no_retries_means_one_call() -> None:
    provider = scripted({"text": "nope"}, {"json": GOOD})
    with pytest.raises(BadModelOutput, match="1 attempt:"):
        await complete_json(provider, ASK, PERSON, retries=0)
    assert len(provider.requests) == 1


async def test_fences_and_prose_around_the_object_are_tolerated() -> None:
    provider = scripted(
        {"text": 'Sure! Here it is:\n```json\n{"name": "Bob", "age": 4}\n```\nAnything else?'}
    )
    reply = await complete_json(provider, ASK, PERSON)
    assert reply.value == {"name": "Bob", "age": 4}
    assert reply.attempts == 1


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ('{"a": 1}', {"a": 1}),
        ('  {"a": {"b": [1, 2]}}  ', {"a": {"b": [1, 2]}}),
        ('```json\n{"a": 1}\n```', {"a": 1}),
        ('```\n{"a": 1}\n```', {"a": 1}),
        ('The answer is {"a": "}"} as requested {ok}.', {"a": "}"}),
        ('Note: {"a": 1}\n\nThat is {all}', {"a": 1}),
    ],
)
def test_parse_json_object_finds_the_outermost_object(text: str, value: dict[str, Any]) -> None:
    assert parse_json_object(text) == value


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "empty"),
        ("just words", "no JSON object"),
        ("[1, 2]", "JSON list, not a JSON object"),
        ('{"a": 1', "not valid JSON"),
        ("```json\n{'a': 1}\n```", "not valid JSON"),
    ],
)
def test_parse_json_object_names_the_problem(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        parse_json_object(text)


async def test_provider_errors_propagate_and_are_not_retried() -> None:
    provider = scripted({"error": "unavailable", "error_message": "down"}, {"json": GOOD})
    with pytest.raises(UpstreamUnavailable, match="down"):
        await complete_json(provider, ASK, PERSON)
    assert len(provider.requests) == 1


async def test_cancellation_during_a_slow_call_is_prompt_and_not_retried() -> None:
    provider = scripted({"json": GOOD, "latency": 5.0})
    events = Events()
    ctx = RequestContext()
    asyncio.get_running_loop().call_later(0.2, ctx.token.cancel, "client disconnected")
    started = time.monotonic()
    with (
        observing(events.observer),
        use_context(ctx),
        pytest.raises(OperationCancelled, match="client disconnected"),
    ):
        await complete_json(provider, ASK, PERSON, retries=3)
    assert ctx.token.cancelled_at is not None
    assert time.monotonic() - ctx.token.cancelled_at < 0.1
    assert time.monotonic() - started < 1.0
    await asyncio.sleep(0.1)
    assert len(provider.requests) == 1, "a cancellation is never retried"
    assert events.retries == [] and events.failures == [], "nor reported"


async def test_an_invalid_schema_is_a_programming_error_before_any_call() -> None:
    provider = scripted({"json": GOOD})
    broken = JsonSchemaFormat(name="broken", schema={"type": "no-such-type"})
    with pytest.raises(ValueError, match="not a valid JSON Schema"):
        await complete_json(provider, ASK, broken)
    assert len(provider.requests) == 0


async def test_remote_refs_are_never_retrieved(monkeypatch: pytest.MonkeyPatch) -> None:
    fetched: list[object] = []

    def urlopen(*args: object, **kwargs: object) -> None:
        fetched.append(args)
        raise OSError("no network in this test")

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    schema = JsonSchemaFormat(
        name="remote",
        schema={"type": "object", "properties": {"x": {"$ref": "http://127.0.0.1:9/x.json"}}},
    )
    provider = scripted({"json": {"x": 1}})
    with pytest.raises(Unresolvable, match=r"127\.0\.0\.1:9/x\.json"):
        await complete_json(provider, ASK, schema)
    assert fetched == [], "the registry refuses every retrieval"


def test_json_schema_format_checks_its_name() -> None:
    with pytest.raises(ValueError, match="name"):
        JsonSchemaFormat(name="has spaces", schema={})
    with pytest.raises(ValueError, match="dict"):
        JsonSchemaFormat(name="ok", schema=[])  # type: ignore[arg-type]
    assert JsonSchemaFormat(name="facts_v1-2", schema={}).strict is True


class _RefusesTheReAsk(ScriptedProvider):
    """Answers badly, then refuses the re-ask as a bad request (a small model's context
    overflowing), recording the conversation it was sent."""

    def __init__(self) -> None:
        super().__init__({"replies": [{"text": "x" * 5000}]})
        self.calls = 0
        self.seen: list[int] = []

    async def stream(self, messages, tools=(), **kwargs):  # type: ignore[no-untyped-def,override]
        self.calls += 1
        self.seen.append(sum(len(m.content or "") for m in messages))
        if self.calls > 1:
            raise ProviderError("local: the prompt has 2100 tokens", provider="x", status_code=400)
        async for event in super().stream(messages, tools=tools, **kwargs):
            yield event


async def test_a_refused_re_ask_is_bad_output_and_the_echo_is_clipped() -> None:
    from heed.llm.structured import ECHO_CHARS

    provider = _RefusesTheReAsk()
    with pytest.raises(BadModelOutput, match="re-ask was refused"):
        await complete_json(provider, ASK, PERSON)
    first, second = provider.seen
    # The re-ask shows the start of the 5000-character reply, not all of it.
    assert second - first < ECHO_CHARS + 400
    # The first call's refusal is the provider's, unchanged.
    refusing = _RefusesTheReAsk()
    refusing.calls = 1
    with pytest.raises(ProviderError) as caught:
        await complete_json(refusing, ASK, PERSON)
    assert not isinstance(caught.value, BadModelOutput) and caught.value.status_code == 400
