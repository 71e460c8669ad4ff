"""What a trace keeps of a call's text, and what a call is counted as.

- ``off``: roles and lengths, no text; ``on``: the text with every secret masked;
- ``llm_work``: the outermost kind wins, an inner block fills a missing bank, an unknown
  kind is refused;
- ``metered_stream`` turns a call into one record with the provider's usage, or the
  counter's count when none was reported, adds it to the run's tally, and records a
  provider error and a consumer that stopped early.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from heed.llm.base import ChatMessage, ToolCall, UpstreamUnavailable, complete
from heed.llm.metered import metered_stream
from heed.llm.scripted import ScriptedProvider
from heed.llm.usage import LlmCall, add_call_sink, current_work, llm_work, remove_call_sink
from heed.observability.content import input_of, output_of
from heed.runtime import tallying

SECRET = "sk-live-0123456789"


def test_off_keeps_no_text_and_on_masks_secrets() -> None:
    messages = [
        ChatMessage.system("You answer."),
        ChatMessage.user(f"My key is {SECRET}; what is my cat called?"),
    ]
    calls = [ToolCall(id="c1", name="recall", arguments={"query": f"cat {SECRET}"})]
    off = json.dumps(
        [
            input_of(messages, keep=False, secrets=[SECRET]),
            output_of("Tom.", calls, "stop", keep=False, secrets=[SECRET]),
        ]
    )
    assert "cat" not in off and SECRET not in off and "Tom" not in off
    assert input_of(messages, keep=False, secrets=[])[1] == {
        "role": "user",
        "chars": len(messages[1].content),
    }
    on_in = input_of(messages, keep=True, secrets=[SECRET])
    on_out = output_of("Tom.", calls, "stop", keep=True, secrets=[SECRET])
    text = json.dumps([on_in, on_out])
    assert SECRET not in text and "what is my cat called?" in text and "Tom." in text
    assert on_out["tool_calls"][0]["name"] == "recall"


def test_the_outermost_kind_wins_and_an_inner_block_fills_the_bank() -> None:
    assert current_work() is None
    with llm_work("t", None, "mental_model_refresh"):
        with llm_work("t", "b1", "reflect") as inner:
            assert (inner.kind, inner.bank_id, inner.tenant) == ("mental_model_refresh", "b1", "t")
        assert current_work() is not None and current_work().bank_id is None  # type: ignore[union-attr]
    assert current_work() is None
    with pytest.raises(ValueError, match="telepathy"), llm_work("t", "b", "telepathy"):
        pass


@pytest.fixture
def recorded() -> Iterator[list[LlmCall]]:
    calls: list[LlmCall] = []
    add_call_sink(calls.append)
    try:
        yield calls
    finally:
        remove_call_sink(calls.append)


def test_a_call_is_recorded_once_with_its_usage_and_tallied(recorded: list[LlmCall]) -> None:
    provider = ScriptedProvider(json.dumps({"token_delay": 0, "replies": [{"text": "Tom is."}]}))

    async def run() -> dict[str, object]:
        with tallying("run-1") as tally, llm_work("t", "b", "reflect"):
            await complete(provider, [ChatMessage.user("what is the cat called")])
            return tally.as_dict()

    tally = asyncio.run(run())
    assert len(recorded) == 1
    call = recorded[0]
    assert (call.kind, call.bank_id, call.tenant, call.trace_id) == ("reflect", "b", "t", "run-1")
    assert (call.status, call.provider, call.usage_reported) == ("success", "scripted", True)
    assert call.prompt_tokens == 5 and call.completion_tokens > 0
    assert tally["calls"] == 1 and tally["prompt_tokens"] == 5
    assert tally["by_kind"] == {
        "reflect": {
            "prompt_tokens": 5,
            "completion_tokens": call.completion_tokens,
            "total_tokens": 5 + call.completion_tokens,
            "calls": 1,
        }
    }


class _Failing(ScriptedProvider):
    def stream(self, messages, **kwargs):  # type: ignore[no-untyped-def,override]
        async def gen():  # type: ignore[no-untyped-def]
            raise UpstreamUnavailable("upstream answered 503", provider="fake")
            yield  # pragma: no cover

        return gen()


def test_errors_and_early_stops_are_recorded(recorded: list[LlmCall]) -> None:
    async def run() -> None:
        with pytest.raises(UpstreamUnavailable):
            await complete(_Failing(), [ChatMessage.user("hi")])
        provider = ScriptedProvider(json.dumps({"token_delay": 0, "replies": [{"text": "a b c"}]}))
        stream = metered_stream(provider, [ChatMessage.user("hi there")])
        async for _ in stream:
            break  # the consumer had what it needed
        await stream.aclose()

    asyncio.run(run())
    assert [(c.status, c.kind) for c in recorded] == [("error", "other"), ("success", "other")]
    assert recorded[0].error == "upstream answered 503"
    assert recorded[0].usage_reported is False and recorded[0].prompt_tokens > 0  # counted
