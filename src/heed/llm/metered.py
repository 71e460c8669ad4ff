"""The one place an LLM call is measured: :func:`metered_stream`.

``metered_stream(provider, messages, ...)`` is ``provider.stream(...)`` (same events, same
errors, same cancellation, the provider's stream closed when it ends) that, once the
stream ends however it ends, makes one :class:`~heed.llm.usage.LlmCall` of it: the work
it served (:func:`~heed.llm.usage.current_work`), times, status, tokens (the provider's
usage, else counted) and the text in and out. The call is added to the context's run
tally (:func:`heed.runtime.current_tally`) and handed to the sinks
(:func:`~heed.llm.usage.notify_call`). :func:`heed.llm.base.complete` and the chat turn's
model step stream through it, so every call reflect, turns, extraction, consolidation
and mental-model refreshes make is measured here and nowhere else.

A stream the consumer closes early (it had what it needed) ends ``success``; a provider
error ends ``error`` with its message; a cancellation ``cancelled``.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncGenerator, Sequence

from heed.llm.base import (
    ChatMessage,
    ChatProvider,
    Finish,
    JsonSchemaFormat,
    ProviderError,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    ToolSpec,
    Usage,
)
from heed.llm.usage import (
    LlmCall,
    admitted,
    count_tokens,
    current_work,
    notify_call,
    wall_clock,
)
from heed.runtime import OperationCancelled, current_context, current_tally

__all__ = ["metered_stream"]


async def metered_stream(
    provider: ChatProvider,
    messages: Sequence[ChatMessage],
    *,
    tools: Sequence[ToolSpec] | None = None,
    max_tokens: int | None = None,
    temperature: float | None = None,
    json_schema: JsonSchemaFormat | None = None,
) -> AsyncGenerator[StreamEvent, None]:
    """``provider.stream(...)``, measured (see the module docstring). *json_schema* is
    passed on only when given (a provider written before it existed still works)."""
    extra = {} if json_schema is None else {"json_schema": json_schema}
    async with admitted(messages, max_tokens):  # a bank's budget may hold it (heed.llm.budget)
        stream = provider.stream(
            messages, tools=tools, max_tokens=max_tokens, temperature=temperature, **extra
        )
        async with contextlib.aclosing(_measured(provider, messages, stream)) as events:
            async for event in events:
                yield event


async def _measured(
    provider: ChatProvider,
    messages: Sequence[ChatMessage],
    stream: AsyncGenerator[StreamEvent, None],
) -> AsyncGenerator[StreamEvent, None]:
    """*stream*'s events, recorded as one call once it ends however it ends."""
    started = wall_clock()
    usage: Usage | None = None
    parts: list[str] = []
    calls: list[ToolCall] = []
    finish: str | None = None
    status, error = "success", None
    try:
        async with contextlib.aclosing(stream) as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    parts.append(event.text)
                elif isinstance(event, ToolCallEvent):
                    calls.append(event.to_call())
                elif isinstance(event, Usage):
                    usage = event
                elif isinstance(event, Finish):
                    finish = event.reason
                yield event
    except OperationCancelled:
        status = "cancelled"
        raise
    except ProviderError as exc:
        status, error = "error", exc.message
        raise
    except BaseException as exc:
        if not isinstance(exc, GeneratorExit):  # GeneratorExit: the consumer closed early
            status, error = "error", f"{type(exc).__name__}: {exc}"[:1000]
        raise
    finally:
        _record(provider, messages, started, usage, parts, calls, finish, status, error)


def _record(
    provider: ChatProvider,
    messages: Sequence[ChatMessage],
    started: float,
    usage: Usage | None,
    parts: list[str],
    calls: list[ToolCall],
    finish: str | None,
    status: str,
    error: str | None,
) -> None:
    reply = "".join(parts)
    reported = usage is not None and (usage.prompt_tokens > 0 or usage.completion_tokens > 0)
    if usage is not None and reported:
        prompt, completion = usage.prompt_tokens, usage.completion_tokens
    else:
        prompt = sum(count_tokens(m.content) for m in messages)
        completion = count_tokens(reply) + sum(count_tokens(str(c.arguments)) for c in calls)
    work = current_work()
    kind = work.kind if work is not None else "other"
    tally = current_tally()
    if tally is not None:
        tally.add(kind, prompt, completion)
    tenant = work.tenant if work is not None and work.tenant else current_context().tenant
    notify_call(
        LlmCall(
            id=uuid.uuid4().hex,
            tenant=tenant,
            bank_id=work.bank_id if work is not None else None,
            kind=kind,
            provider=provider.name,
            model=provider.model,
            status=status,
            started_at=started,
            ended_at=wall_clock(),
            prompt_tokens=prompt,
            completion_tokens=completion,
            usage_reported=reported,
            messages=tuple(messages),
            reply=reply,
            tool_calls=tuple(calls),
            error=error,
            finish_reason=finish,
            trace_id=tally.run_id if tally is not None else None,
        )
    )
