"""The ``openai`` provider: any OpenAI-compatible ``/chat/completions`` endpoint.

Works with OpenAI, Ollama, vLLM and the llama.cpp server: it posts
``stream: true`` (with ``stream_options.include_usage``), parses the
server-sent events, yields text deltas as they arrive, assembles tool calls
from their deltas (arguments parsed once complete; malformed JSON is
:class:`~heed.llm.base.BadModelOutput`), and reports usage when the server
sends it.

How cancellation reaches the socket: all upstream I/O (connect, retries,
reading chunks) runs in one *pump* task that feeds a small queue. The consumer
races each ``queue.get()`` against the request token
(:class:`~heed.llm.watch.CancelWatch`); when the token wins, the pump is
cancelled, which interrupts the pending read at once, and its ``finally``
closes the upstream response (``response.aclose()``), so the upstream sees its
connection close and stops generating. The consumer raises
:class:`~heed.runtime.OperationCancelled` only after the response is closed.
Leaving the stream early (``aclose()`` on the generator) closes it the same way.

Structured output: ``json_schema=JsonSchemaFormat(name, schema, strict)`` is sent
as ``response_format: {"type": "json_schema", "json_schema": {"name", "schema",
"strict"}}`` (OpenAI's Structured Outputs; vLLM, Ollama and the llama.cpp server
accept the same shape). The reply's JSON arrives as ordinary text deltas.

Failures: unreachable / timed out / 5xx -> :class:`UpstreamUnavailable` (503),
429 -> :class:`UpstreamRateLimited` (503 + Retry-After), 404 about the model ->
:class:`UnknownModel`, anything else the upstream refuses -> ``ProviderError``
(502), each with the upstream's own message (and ``upstream_status`` set to the
upstream's HTTP status). Failures before the first chunk (429 asking for at most
5 s, 5xx, unreachable) are retried up to ``retries`` times with
:func:`heed.runtime.retry_async` (never a cancellation), after a jittered
exponential backoff that wakes on cancel; a stream that already produced output
is never retried.

Nothing is silent (:mod:`heed.llm.observe`): before each backoff sleep the
provider reports ``on_retry("openai", status, reason, delay)`` (status 429 or
5xx, ``None`` for a connection error), and when it gives up with a
``ProviderError`` it reports ``on_failure("openai", status, reason)`` once. A
cancellation is neither.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import httpx

from heed.llm.base import (
    BadModelOutput,
    ChatMessage,
    Finish,
    ProviderBase,
    ProviderError,
    StreamEvent,
    StreamOptions,
    TextDelta,
    ToolCallEvent,
    ToolSpec,
    UnknownModel,
    UpstreamRateLimited,
    UpstreamTimedOut,
    UpstreamUnavailable,
    Usage,
    parse_tool_arguments,
)
from heed.llm.observe import notify_failure, notify_retry
from heed.llm.watch import CancelWatch
from heed.runtime import retry_async, settle, sleep_unless_cancelled

__all__ = ["OpenAIProvider", "message_to_openai", "tool_to_openai"]

NAME: Final = "openai"
_QUEUE_SIZE: Final = 8
_MAX_RETRY_AFTER: Final = 5  # a 429 asking to wait longer than this is not retried
_MAX_RETRY_DELAY: Final = 5.0


class _End:
    """Queue sentinel: the upstream stream finished normally."""


_END: Final = _End()


def message_to_openai(message: ChatMessage) -> dict[str, Any]:
    """One :class:`ChatMessage` in the OpenAI wire format."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.role == "assistant" and message.tool_calls:
        out["content"] = message.content or None
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
            }
            for call in message.tool_calls
        ]
    if message.role == "tool":
        out["tool_call_id"] = message.tool_call_id or ""
        if message.name:
            out["name"] = message.name
    return out


def tool_to_openai(tool: ToolSpec) -> dict[str, Any]:
    """One :class:`ToolSpec` in the OpenAI wire format."""
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }


def _upstream_message(body: bytes) -> str:
    """The error message an OpenAI-compatible server put in its body, or the body."""
    text = body.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return text[:500] or "(empty body)"
    if isinstance(data, dict):
        error = data.get("error", data.get("detail"))
        if isinstance(error, dict):
            error = error.get("message") or json.dumps(error)
        if isinstance(error, str) and error:
            return error[:500]
    return text[:500]


def _retry_after(headers: httpx.Headers) -> int:
    try:
        return max(1, int(float(headers.get("retry-after", "1"))))
    except ValueError:
        return 1


def _is_transient(exc: Exception) -> bool:
    if isinstance(exc, UpstreamRateLimited):
        return exc.retry_after <= _MAX_RETRY_AFTER
    return isinstance(exc, UpstreamUnavailable)


def _opening_reason(exc: ProviderError) -> str:
    """The observer's reason for a failure before the stream started (see observe)."""
    if isinstance(exc, UpstreamRateLimited):
        return "rate_limited"
    if isinstance(exc, UnknownModel):
        return "unknown_model"
    if isinstance(exc, UpstreamUnavailable):
        return "unreachable" if exc.upstream_status is None else "upstream_error"
    return "refused"


def _streaming_reason(exc: ProviderError) -> str:
    """The observer's reason for a failure once the stream had started."""
    if isinstance(exc, BadModelOutput):
        return "bad_output"
    if isinstance(exc, UpstreamUnavailable):
        return "stream_broken"
    return "upstream_error"  # an error event in the stream


class _Backoff:
    """The retry policy of one stream's opening, for :func:`retry_async`.

    ``retry_async`` runs the attempts and never retries a cancellation; this
    decides (``should_retry``), reports the retry with its real delay, and sleeps
    that delay at the start of the next attempt (``retry_async`` itself is told to
    wait 0 s), so an observer hears the delay that will actually be slept.
    """

    def __init__(self, base_delay: float) -> None:
        self.base_delay = base_delay
        self.retries = 0
        self.pending = 0.0

    def should_retry(self, exc: Exception) -> bool:
        if not isinstance(exc, ProviderError) or not _is_transient(exc):
            return False
        self.retries += 1
        nominal = min(_MAX_RETRY_DELAY, self.base_delay * 2 ** (self.retries - 1))
        self.pending = nominal * (0.5 + random.random() / 2)
        if isinstance(exc, UpstreamRateLimited):  # its Retry-After is a floor, not a hint
            self.pending = max(self.pending, float(exc.retry_after))
        notify_retry(
            NAME, exc.upstream_status, _opening_reason(exc), self.pending, detail=exc.message
        )
        return True

    async def wait(self) -> None:
        """Sleep the pending delay (if any); wakes and raises on cancel."""
        delay, self.pending = self.pending, 0.0
        if delay <= 0:
            return
        await sleep_unless_cancelled(delay)


@contextlib.contextmanager
def _upstream_errors(timed_out: str, broke: str) -> Iterator[None]:
    """Raise httpx's errors in the block as the provider's: a timeout as
    :class:`UpstreamTimedOut` (``"openai: " + timed_out``), another transport error as
    :class:`UpstreamUnavailable` (``"openai: " + broke + ": " + the error``); neither
    chained to the httpx error."""
    try:
        yield
    except httpx.TimeoutException:
        raise UpstreamTimedOut(f"{NAME}: {timed_out}", provider=NAME) from None
    except httpx.TransportError as exc:
        raise UpstreamUnavailable(f"{NAME}: {broke}: {exc!r}", provider=NAME) from None


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class _ChunkAssembler:
    """Turns decoded ``chat.completion.chunk`` objects into stream events."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.calls: dict[int, _PartialCall] = {}
        self.finish_reason: str | None = None
        self.usage: Usage | None = None

    def feed(self, chunk: Any) -> list[StreamEvent]:
        if not isinstance(chunk, dict):
            raise BadModelOutput(
                f"{NAME}: upstream sent a stream chunk that is not an object", provider=NAME
            )
        if "error" in chunk:
            raise ProviderError(
                f"{NAME}: upstream failed mid-stream: "
                f"{_upstream_message(json.dumps(chunk).encode())}",
                provider=NAME,
            )
        events: list[StreamEvent] = []
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = Usage(
                prompt_tokens=int(usage.get("prompt_tokens") or 0),
                completion_tokens=int(usage.get("completion_tokens") or 0),
            )
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            content = delta.get("content")
            if isinstance(content, str) and content:
                events.append(TextDelta(content))
            for position, piece in enumerate(delta.get("tool_calls") or []):
                index = piece.get("index", position)
                partial = self.calls.setdefault(index, _PartialCall())
                if piece.get("id"):
                    partial.id = piece["id"]
                function = piece.get("function") or {}
                if function.get("name"):
                    partial.name += function["name"]
                arguments = function.get("arguments")
                if isinstance(arguments, str):
                    partial.arguments.append(arguments)
                elif isinstance(arguments, dict):  # some servers send an object outright
                    partial.arguments.append(json.dumps(arguments))
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        return events

    def finish(self) -> list[StreamEvent]:
        """The tool calls, usage and finish events once the stream is complete."""
        events: list[StreamEvent] = []
        for index in sorted(self.calls):
            partial = self.calls[index]
            if not partial.name:
                raise BadModelOutput(
                    f"{NAME}: the model made a tool call without a function name", provider=NAME
                )
            arguments = parse_tool_arguments(
                "".join(partial.arguments), tool=partial.name, provider=NAME
            )
            events.append(ToolCallEvent(partial.id or f"call_{index}", partial.name, arguments))
        if self.usage is not None:
            events.append(self.usage)
        reason = self.finish_reason or ("tool_calls" if self.calls else "stop")
        events.append(Finish(reason))
        return events


async def _sse_data(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """The ``data`` payloads of a server-sent event stream, one per event."""
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


class OpenAIProvider(ProviderBase):
    """A :class:`~heed.llm.base.ChatProvider` for an OpenAI-compatible endpoint.

    *base_url* is the API root (``https://api.openai.com/v1``,
    ``http://localhost:11434/v1``); requests go to ``{base_url}/chat/completions``.
    *timeout* bounds connecting and each wait for the next chunk. *retries*
    extra attempts are made for 429/5xx/unreachable before any output.
    """

    name: Final = NAME
    #: Whatever serves the API is trusted with tools; pick a model that can.
    follows_tools: Final = True

    def __init__(
        self,
        *,
        model: str,
        base_url: str,
        api_key: str | None = None,
        timeout: float = 60.0,
        retries: int = 2,
        retry_base_delay: float = 0.5,
        default_max_tokens: int | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not model:
            raise UnknownModel(
                f"{NAME}: no model configured; set HEED_LLM_MODEL (or the per-operation "
                "HEED_<OPERATION>_LLM_MODEL) to a model your endpoint serves",
                provider=NAME,
            )
        self._model = model
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self.retry_base_delay = retry_base_delay
        self.default_max_tokens = default_max_tokens
        headers = {"Accept": "text/event-stream"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._client = httpx.AsyncClient(
            base_url=self.base_url + "/",
            headers=headers,
            timeout=httpx.Timeout(timeout),
            transport=transport,
        )

    @property
    def model(self) -> str:
        return self._model

    async def load(self) -> None:
        """Nothing to load: the model lives behind the API."""

    def _payload(self, messages: Sequence[ChatMessage], options: StreamOptions) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self._model,
            "messages": [message_to_openai(m) for m in messages],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        max_tokens = options.max_tokens
        if max_tokens is None:
            max_tokens = self.default_max_tokens
        if max_tokens is not None:
            payload["max_tokens"] = max_tokens
        if options.temperature is not None:
            payload["temperature"] = options.temperature
        if options.tools:
            payload["tools"] = [tool_to_openai(t) for t in options.tools]
        json_schema = options.json_schema
        if json_schema is not None:
            payload["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": json_schema.name,
                    "schema": json_schema.schema,
                    "strict": json_schema.strict,
                },
            }
        return payload

    async def _stream(
        self, messages: Sequence[ChatMessage], options: StreamOptions
    ) -> AsyncGenerator[StreamEvent, None]:
        """Stream the reply; see the module docstring for cancellation and errors."""
        payload = self._payload(messages, options)
        watch = CancelWatch()
        watch.check()
        channel: asyncio.Queue[StreamEvent | _End | Exception] = asyncio.Queue(_QUEUE_SIZE)
        pump = asyncio.create_task(self._pump(payload, channel), name="heed-openai-stream")
        try:
            while True:
                item = await watch.race(channel.get())
                if isinstance(item, _End):
                    return
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            watch.close()
            await settle(pump)  # the upstream response is closed past this line

    async def _pump(
        self, payload: dict[str, Any], channel: asyncio.Queue[StreamEvent | _End | Exception]
    ) -> None:
        """All upstream I/O for one stream; runs as its own task (see module docstring)."""
        backoff = _Backoff(self.retry_base_delay)

        async def attempt() -> httpx.Response:
            await backoff.wait()
            return await self._open(payload)

        opening = True
        try:
            response = await retry_async(
                attempt,
                attempts=self.retries + 1,
                base_delay=0.0,  # the backoff sleeps, so its observers hear the real delay
                retry_on=backoff.should_retry,
            )
            opening = False
            try:
                with _upstream_errors(
                    f"no data from {self.base_url} for {self._client.timeout.read} s "
                    "while streaming",
                    f"the stream from {self.base_url} broke",
                ):
                    await self._relay(response, channel)
            finally:
                await response.aclose()
            await channel.put(_END)
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            # Cancellation included (retry_async raises it when the token fires during a
            # backoff): the consumer re-raises whatever arrives, so nothing is buried and
            # the consumer never waits on a pump that has already died. Only a provider
            # error is a failure; a cancellation is reported to nobody.
            if isinstance(exc, ProviderError):
                reason = _opening_reason(exc) if opening else _streaming_reason(exc)
                notify_failure(NAME, exc.upstream_status, reason, detail=exc.message)
            await channel.put(exc)

    async def _relay(
        self, response: httpx.Response, channel: asyncio.Queue[StreamEvent | _End | Exception]
    ) -> None:
        """Put the events of *response*'s stream on *channel*, the last one its finish;
        raises :class:`BadModelOutput` on a malformed chunk and :class:`UpstreamUnavailable`
        when the stream ends before its reply did (httpx's errors pass through)."""
        assembler = _ChunkAssembler(self._model)
        done = False
        async for data in _sse_data(response.aiter_lines()):
            if data.strip() == "[DONE]":
                done = True
                break
            try:
                chunk = json.loads(data)
            except json.JSONDecodeError:
                raise BadModelOutput(
                    f"{NAME}: upstream sent a malformed stream chunk: {data[:200]!r}",
                    provider=NAME,
                ) from None
            for event in assembler.feed(chunk):
                await channel.put(event)
        if not done and assembler.finish_reason is None:
            raise UpstreamUnavailable(
                f"{NAME}: the upstream closed the stream before finishing",
                provider=NAME,
            )
        for event in assembler.finish():
            await channel.put(event)

    async def _open(self, payload: dict[str, Any]) -> httpx.Response:
        """POST the request and return the streaming response, or raise the mapped error."""
        url = f"{self.base_url}/chat/completions"
        request = self._client.build_request("POST", "chat/completions", json=payload)
        with _upstream_errors(
            f"{url} did not answer within {self._client.timeout.connect} s", f"cannot reach {url}"
        ):
            response = await self._client.send(request, stream=True)
        if response.status_code < 400:
            return response
        try:
            body = await response.aread()
        except httpx.HTTPError:
            body = b""
        finally:
            await response.aclose()
        raise self._status_error(response.status_code, body, response.headers)

    def _status_error(self, status: int, body: bytes, headers: httpx.Headers) -> ProviderError:
        error = self._status_error_for(status, body, headers)
        error.upstream_status = status
        return error

    def _status_error_for(self, status: int, body: bytes, headers: httpx.Headers) -> ProviderError:
        message = _upstream_message(body)
        if status == 429:
            return UpstreamRateLimited(
                f"{NAME}: upstream is rate limiting (429): {message}",
                provider=NAME,
                retry_after=_retry_after(headers),
            )
        if status >= 500:
            return UpstreamUnavailable(
                f"{NAME}: upstream failed ({status}): {message}", provider=NAME
            )
        if status == 404 and "model" in message.lower():
            return UnknownModel(
                f"{NAME}: unknown model {self._model!r} at {self.base_url}: {message}",
                provider=NAME,
            )
        return ProviderError(
            f"{NAME}: upstream refused the request ({status}): {message}", provider=NAME
        )

    async def aclose(self) -> None:
        """Close the HTTP client and its connections."""
        await self._client.aclose()
