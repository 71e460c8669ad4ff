"""The provider interface: streaming chat completion with tool calls and usage.

A :class:`ChatProvider` turns a conversation (:class:`ChatMessage` list, plus
optional :class:`ToolSpec` tools) into an async stream of events:

- :class:`TextDelta`: a piece of the assistant's answer, in order;
- :class:`ToolCallEvent`: one complete tool call (its arguments already parsed
  into a dict; partial tool-call deltas never escape a provider);
- :class:`Usage`: token accounting, at most once, near the end;
- :class:`Finish`: always the last event of a stream that was not interrupted,
  with the reason (``"stop"``, ``"length"``, ``"tool_calls"``...).

**Structured output.** ``stream(..., json_schema=JsonSchemaFormat(...))`` asks
for a reply that is one JSON object matching the schema, in the text deltas.
Each provider passes the request on in its own way (``openai``: the
``response_format`` of type ``json_schema``; ``local``: a llama.cpp grammar
derived from the schema; ``scripted``: recorded, its script decides the reply).
A provider *asks*; it never promises: a caller that needs the guarantee parses
and validates the text, which :func:`heed.llm.structured.complete_json` does.

Contract every provider keeps:

- **Cancellation.** ``stream`` reads the active request context's token
  (:func:`heed.runtime.current_context`) when iteration starts. Once the token is
  cancelled the provider stops producing within 50 ms (an HTTP provider closes
  the upstream response, a local model stops between tokens) and the iterator
  raises :class:`~heed.runtime.OperationCancelled`. Without a request context
  nothing cancels the stream (internal callers behave as before).
- **Clean exit.** The iterator is an async generator: a consumer that stops
  early must close it (``async with contextlib.aclosing(provider.stream(...))``,
  as :func:`complete` does) so upstream work stops at once instead of at garbage
  collection.
- **Errors** are :class:`ProviderError` subclasses carrying an HTTP status
  (see below); nothing else escapes except cancellation. Retries (for transient
  upstream failures before the first event) happen inside the provider and never
  retry a cancellation.

Errors and their statuses:

============================  ======  =============================================
:class:`UnknownProvider`      400     settings or request name a provider heed lacks
:class:`UnknownModel`         400     the provider does not know the model
:class:`BadModelOutput`       502     the model produced unusable output (bad JSON)
:class:`UpstreamUnavailable`  503     endpoint unreachable, timed out or 5xx
:class:`UpstreamRateLimited`  503     upstream said 429; ``Retry-After`` passed on
============================  ======  =============================================

A 429 from upstream becomes **503 with Retry-After**, not a 429 passthrough: the
caller did not exceed heed's limits, heed's upstream is saturated, which is the
same situation (and the same answer) as a full lane.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from heed.errors import HeedError

__all__ = [
    "BadModelOutput",
    "ChatMessage",
    "ChatProvider",
    "Completion",
    "Finish",
    "JsonSchemaFormat",
    "ProviderBase",
    "ProviderError",
    "Role",
    "StreamEvent",
    "StreamOptions",
    "TextDelta",
    "ToolCall",
    "ToolCallEvent",
    "ToolSpec",
    "UnknownModel",
    "UnknownProvider",
    "UpstreamRateLimited",
    "UpstreamUnavailable",
    "Usage",
    "complete",
    "parse_tool_arguments",
]

Role = Literal["system", "user", "assistant", "tool"]


# -- messages and tools ------------------------------------------------------------


class ToolCall(BaseModel):
    """A tool call the assistant made: ``arguments`` is the parsed JSON object."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ChatMessage(BaseModel):
    """One message of a conversation.

    - ``system`` / ``user``: ``content`` is the text.
    - ``assistant``: ``content`` is the text answer (may be empty) and
      ``tool_calls`` the calls it made.
    - ``tool``: the result of the call ``tool_call_id`` as text in ``content``;
      ``name`` optionally names the tool.
    """

    model_config = ConfigDict(frozen=True)

    role: Role
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None

    @classmethod
    def system(cls, content: str) -> ChatMessage:
        return cls(role="system", content=content)

    @classmethod
    def user(cls, content: str) -> ChatMessage:
        return cls(role="user", content=content)

    @classmethod
    def assistant(cls, content: str = "", tool_calls: Sequence[ToolCall] = ()) -> ChatMessage:
        return cls(role="assistant", content=content, tool_calls=list(tool_calls))

    @classmethod
    def tool(cls, tool_call_id: str, content: str, name: str | None = None) -> ChatMessage:
        return cls(role="tool", content=content, tool_call_id=tool_call_id, name=name)


class ToolSpec(BaseModel):
    """A tool the model may call; ``parameters`` is a JSON Schema (an object schema)."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


_SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True, slots=True)
class JsonSchemaFormat:
    """A request for structured output: one JSON object matching *schema*.

    - ``name`` names the format (1-64 letters, digits, ``_`` or ``-``, as OpenAI
      requires); it appears in error messages.
    - ``schema`` is a JSON Schema (Draft 2020-12) whose top level is an object
      schema. It is heed's own, written in code: schemas from callers belong to
      :mod:`heed.reflect.schema`, which applies a policy to untrusted ones.
    - ``strict`` asks an OpenAI-compatible upstream for strict schema adherence
      (OpenAI then requires ``additionalProperties: false`` and every property in
      ``required``); the other providers ignore it.

    Raises :class:`ValueError` for a malformed name or a schema that is not a dict
    (programming errors).
    """

    name: str
    schema: dict[str, Any]
    strict: bool = True

    def __post_init__(self) -> None:
        if not _SCHEMA_NAME.fullmatch(self.name):
            raise ValueError(
                f"JsonSchemaFormat name {self.name!r}: use 1-64 letters, digits, '_' or '-'"
            )
        if not isinstance(self.schema, dict):
            raise ValueError(f"JsonSchemaFormat {self.name!r}: the schema must be a dict")


# -- stream events -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of the assistant's text, in order."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallEvent:
    """One complete tool call, arguments parsed."""

    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def to_call(self) -> ToolCall:
        return ToolCall(id=self.id, name=self.name, arguments=self.arguments)


@dataclass(frozen=True, slots=True)
class Usage:
    """Token accounting for one completion."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class Finish:
    """The last event of a completed stream: ``stop``, ``length``, ``tool_calls``..."""

    reason: str


StreamEvent = TextDelta | ToolCallEvent | Usage | Finish


# -- errors ------------------------------------------------------------------------


class ProviderError(HeedError):
    """Base of the provider errors; ``provider`` names which provider raised it.

    ``upstream_status`` is the HTTP status the upstream answered with, when the
    error comes from one (429, 503, 401...); ``None`` otherwise (unreachable, a
    broken stream, a local failure). It is for observers and logs, not the answer:
    ``status_code`` is what heed's caller gets.
    """

    status_code = 502
    upstream_status: int | None = None

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        status_code: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message, status_code=status_code, headers=headers)
        self.provider = provider


class UnknownProvider(ProviderError):
    """The configured or requested provider does not exist (400)."""

    status_code = 400


class UnknownModel(ProviderError):
    """The provider does not know the model (400)."""

    status_code = 400


class BadModelOutput(ProviderError):
    """The model produced output heed cannot use, e.g. malformed tool-call JSON (502).
    ``usage``: the tokens the unusable replies took, when known (structured output)."""

    status_code = 502
    usage: Usage | None = None


class UpstreamUnavailable(ProviderError):
    """The upstream is unreachable, timed out or failed (5xx): 503 with its message."""

    status_code = 503


class UpstreamTimedOut(UpstreamUnavailable):
    """The upstream did not answer, or stopped sending, within the provider's timeout (503)."""


class UpstreamRateLimited(ProviderError):
    """Upstream answered 429: 503 with ``Retry-After`` (seconds) for heed's caller."""

    status_code = 503

    def __init__(self, message: str, *, provider: str = "", retry_after: int = 1) -> None:
        retry_after = max(1, int(retry_after))
        super().__init__(message, provider=provider, headers={"Retry-After": str(retry_after)})
        self.retry_after = retry_after


# -- the interface -----------------------------------------------------------------


@runtime_checkable
class ChatProvider(Protocol):
    """A streaming chat model. See the module docstring for the contract."""

    @property
    def name(self) -> str:
        """The provider's kind: ``openai``, ``local`` or ``scripted``."""
        ...

    @property
    def model(self) -> str:
        """The model this provider talks to."""
        ...

    @property
    def follows_tools(self) -> bool:
        """Does the model call tools reliably enough to run an agent loop? When not (the
        embedded SmolLM2-135M), reflect and the turns of bank-bound sessions answer each
        question from recalled memories in single generations (:mod:`heed.llm.grounding`).
        """
        ...

    async def load(self) -> None:
        """Make the model ready now (the embedded one loads its weights; a remote API has
        nothing to do). Otherwise the first request does it."""
        ...

    def stream(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[ToolSpec] | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        json_schema: JsonSchemaFormat | None = None,
    ) -> AsyncGenerator[StreamEvent, None]:
        """Stream the assistant's reply to *messages* (an async generator).

        *json_schema* asks for a reply that is one JSON object matching it (see the
        module docstring: asked for, not guaranteed).
        """
        ...

    async def aclose(self) -> None:
        """Release the provider's resources (HTTP connections); idempotent."""
        ...


@dataclass(frozen=True, slots=True)
class StreamOptions:
    """What a :meth:`ChatProvider.stream` call asks besides its messages (``None``: the
    provider's default)."""

    tools: Sequence[ToolSpec] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    json_schema: JsonSchemaFormat | None = None


class ProviderBase:
    """The :meth:`ChatProvider.stream` of heed's own providers: the call's options go to
    :meth:`_stream` as one :class:`StreamOptions`, so each provider states the interface's
    signature once, here. The generator is returned as :meth:`_stream` makes it (nothing
    runs before iteration starts)."""

    def stream(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[ToolSpec] | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        json_schema: JsonSchemaFormat | None = None,
    ) -> AsyncGenerator[StreamEvent, None]:
        """See :meth:`ChatProvider.stream`."""
        return self._stream(messages, StreamOptions(tools, max_tokens, temperature, json_schema))

    def _stream(
        self, messages: Sequence[ChatMessage], options: StreamOptions
    ) -> AsyncGenerator[StreamEvent, None]:
        """The provider's reply stream (an async generator keeping the contract of the
        module docstring)."""
        raise NotImplementedError


@dataclass(slots=True)
class Completion:
    """A whole reply, as collected by :func:`complete`."""

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    finish_reason: str = "stop"

    def as_message(self) -> ChatMessage:
        """The reply as an assistant message, to append to the conversation."""
        return ChatMessage.assistant(self.text, self.tool_calls)


async def complete(
    provider: ChatProvider,
    messages: Sequence[ChatMessage],
    *,
    tools: Sequence[ToolSpec] | None = None,
    max_tokens: int | None = None,
    temperature: float | None = None,
    on_text: Callable[[str], Awaitable[None]] | None = None,
    json_schema: JsonSchemaFormat | None = None,
) -> Completion:
    """Run ``provider.stream`` to the end and collect it into a :class:`Completion`.

    *on_text*, when given, is awaited with each text piece as it arrives (to
    forward the reply while it streams). *json_schema* is passed to the provider
    (only when given, so a provider written before it existed still works); the
    text is returned as produced, unparsed. The call is measured
    (:func:`heed.llm.metered.metered_stream`) and, while tracing is on, a ``chat {model}``
    span (:mod:`heed.llm.spans`). Cancellation and provider errors
    propagate unchanged; the stream is always closed before this returns or
    raises.
    """
    from heed.llm.metered import metered_stream  # metered imports this module

    result = Completion()
    parts: list[str] = []
    stream = metered_stream(
        provider,
        messages,
        tools=tools,
        max_tokens=max_tokens,
        temperature=temperature,
        json_schema=json_schema,
    )
    from heed.llm.spans import traced  # spans.py builds on this module

    stream = traced(provider, stream, max_tokens=max_tokens, temperature=temperature)
    async with contextlib.aclosing(stream) as events:
        async for event in events:
            if isinstance(event, TextDelta):
                parts.append(event.text)
                if on_text is not None:
                    await on_text(event.text)
            elif isinstance(event, ToolCallEvent):
                result.tool_calls.append(event.to_call())
            elif isinstance(event, Usage):
                result.usage = event
            elif isinstance(event, Finish):
                result.finish_reason = event.reason
    result.text = "".join(parts)
    return result


def parse_tool_arguments(raw: str, *, tool: str, provider: str) -> dict[str, Any]:
    """Parse a tool call's JSON arguments; :class:`BadModelOutput` if not a JSON object.

    An empty string means no arguments (``{}``).
    """
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        snippet = raw if len(raw) <= 200 else raw[:200] + "..."
        raise BadModelOutput(
            f"{provider}: the model's call to tool {tool!r} has malformed JSON arguments "
            f"({exc.msg} at position {exc.pos}): {snippet!r}",
            provider=provider,
        ) from None
    if not isinstance(value, dict):
        raise BadModelOutput(
            f"{provider}: the model's call to tool {tool!r} has arguments that are not a JSON "
            f"object: {raw[:200]!r}",
            provider=provider,
        )
    return value
