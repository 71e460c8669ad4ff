"""Each LLM call as a span named by the OpenTelemetry GenAI convention.

:func:`traced` wraps a provider's stream: the span ``chat {model}`` (kind ``CLIENT``, a child
of the span current when the call starts) carries ``gen_ai.operation.name`` (``chat``),
``gen_ai.provider.name`` and, for older backends, ``gen_ai.system`` (the provider's name:
``openai``, ``local``, ``scripted``), ``gen_ai.request.model``, ``gen_ai.request.max_tokens``
and ``gen_ai.request.temperature`` when set, and once the stream ends
``gen_ai.usage.input_tokens`` / ``gen_ai.usage.output_tokens`` (the provider's reported
usage) and ``gen_ai.response.finish_reasons``. The span is never made current: the stream
yields to its caller between events, and the caller's own spans must not nest under it.

The span ends however the stream ends: finished, failed (recorded as an error), cancelled
(a ``heed.cancelled`` event; the cancellation propagates) or closed early by its consumer.
While tracing is off, :func:`traced` returns the stream itself: no wrapper, no cost.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from typing import Final

from opentelemetry.trace import SpanKind

from heed.llm.base import ChatProvider, Finish, StreamEvent, Usage
from heed.runtime.tracing import end_span, start_span, tracing_enabled

__all__ = ["INPUT_TOKENS", "OUTPUT_TOKENS", "traced"]

INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"


def traced(
    provider: ChatProvider,
    stream: AsyncGenerator[StreamEvent, None],
    *,
    max_tokens: int | None = None,
    temperature: float | None = None,
) -> AsyncGenerator[StreamEvent, None]:
    """*stream* (``provider.stream(...)``'s) inside a ``chat {model}`` span, or *stream*
    itself while tracing is off. Close the result as you would close *stream*."""
    if not tracing_enabled():
        return stream
    return _traced(provider, stream, max_tokens, temperature)


async def _traced(
    provider: ChatProvider,
    stream: AsyncGenerator[StreamEvent, None],
    max_tokens: int | None,
    temperature: float | None,
) -> AsyncGenerator[StreamEvent, None]:
    model = provider.model
    attributes: dict[str, str | int | float] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider.name,
        "gen_ai.system": provider.name,
        "gen_ai.request.model": model,
    }
    if max_tokens is not None:
        attributes["gen_ai.request.max_tokens"] = max_tokens
    if temperature is not None:
        attributes["gen_ai.request.temperature"] = temperature
    span = start_span(f"chat {model}", kind=SpanKind.CLIENT, attributes=attributes)
    error: BaseException | None = None
    try:
        async with contextlib.aclosing(stream) as events:  # closed whatever ends the loop
            async for event in events:
                if isinstance(event, Usage):
                    span.set_attribute(INPUT_TOKENS, event.prompt_tokens)
                    span.set_attribute(OUTPUT_TOKENS, event.completion_tokens)
                elif isinstance(event, Finish):
                    span.set_attribute("gen_ai.response.finish_reasons", [event.reason])
                yield event
    except BaseException as exc:  # recorded on the span, then re-raised as it came
        error = exc
        raise
    finally:
        end_span(span, error)
