"""The scripted provider: deterministic replies and tool calls, for tests and benchmarks.

A :class:`Script` is a list of replies. Which reply a call gets:

1. the first reply whose ``when`` text occurs (case-insensitively) in the last
   user message; otherwise
2. with ``select="turn"`` (the default), the unconditional reply whose index is
   the number of assistant messages already in the conversation, so the k-th
   model call of a conversation gets reply k whatever else runs concurrently;
   with ``select="sequence"``, the next reply of a counter on the provider;
   past the end, the last reply repeats;
3. with no unconditional replies at all, an echo of the last user message.

A reply streams its text word by word (``"".join`` of the deltas is the text),
then its tool calls, each after the per-token delay (``token_delay`` on the
reply, else on the script), then :class:`~heed.llm.base.Usage` and
:class:`~heed.llm.base.Finish`. ``json`` (any JSON value but ``null``) is the
text ``json.dumps(json)``, for structured output; giving both ``text`` and
``json`` is refused (:class:`~heed.llm.base.ProviderError`, 400). ``latency``
seconds pass before the first token (cancellably): a slow upstream call that
then answers at once, as a non-streaming API does. A request's ``json_schema``
is recorded, never enforced: the script decides what the "model" says, so a
test can play a model that breaks the schema.

``error`` makes the call fail instead, with the provider error a real upstream
would give (after the text has streamed, if any): ``unavailable`` (503),
``rate_limited`` (503 + Retry-After) or ``bad_output`` (502, like malformed
tool-call JSON).

A script is given programmatically (``ScriptedProvider(script)``,
``provider.script = ...``) or as JSON in ``HEED_LLM_SCRIPT`` (the JSON text, or
a path to a ``.json`` file), for example::

    {"token_delay": 0.01,
     "replies": [
       {"tool_calls": [{"name": "recall", "arguments": {"query": "cats"}}]},
       {"text": "Alice has two cats."}]}

The provider stops within one token of a cancel: every delay races the token.
It records each request it served in ``requests`` (the latest 256).
"""

from __future__ import annotations

import json
import re
import time
from collections import deque
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from heed.llm.base import (
    BadModelOutput,
    ChatMessage,
    Finish,
    JsonSchemaFormat,
    ProviderBase,
    ProviderError,
    StreamEvent,
    StreamOptions,
    TextDelta,
    ToolCallEvent,
    ToolSpec,
    UpstreamRateLimited,
    UpstreamUnavailable,
    Usage,
)
from heed.llm.watch import CancelWatch

__all__ = [
    "Script",
    "ScriptedProvider",
    "ScriptedReply",
    "ScriptedRequest",
    "ScriptedToolCall",
    "load_script",
    "split_tokens",
]

NAME = "scripted"

_TOKEN = re.compile(r"\S+\s*|\s+")


def split_tokens(text: str) -> list[str]:
    """Split *text* into word tokens (trailing whitespace kept), losslessly."""
    return _TOKEN.findall(text)


class ScriptedToolCall(BaseModel):
    """A tool call a scripted reply makes; ``id`` defaults to ``call_<turn>_<i>``."""

    model_config = ConfigDict(extra="forbid")

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    id: str | None = None


class ScriptedReply(BaseModel):
    """One scripted model reply (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    text: str = ""
    #: Structured output: the reply text is ``json.dumps`` of this (``None``: unset).
    #: Named ``json`` in scripts and as a keyword (``ScriptedReply(json={...})``).
    json_value: Any = Field(default=None, alias="json")
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list)
    finish: str | None = None
    when: str | None = None
    token_delay: float | None = Field(default=None, ge=0)
    #: Seconds before the first token (a slow call that answers at once); cancellable.
    latency: float = Field(default=0.0, ge=0)
    error: Literal["unavailable", "rate_limited", "bad_output"] | None = None
    error_message: str = "scripted failure"

    @model_validator(mode="after")
    def _one_kind_of_text(self) -> ScriptedReply:
        if self.text and self.json_value is not None:
            raise ProviderError(
                "scripted: a reply sets both 'text' and 'json'; give one (the text of a "
                "'json' reply is json.dumps of it)",
                provider=NAME,
                status_code=400,
            )
        return self

    @property
    def reply_text(self) -> str:
        """What the reply says: ``text``, or ``json`` as JSON text."""
        if self.json_value is not None:
            return json.dumps(self.json_value)
        return self.text


class Script(BaseModel):
    """A scripted provider's whole behaviour."""

    model_config = ConfigDict(extra="forbid")

    replies: list[ScriptedReply] = Field(default_factory=list)
    token_delay: float = Field(default=0.0, ge=0)
    select: Literal["turn", "sequence"] = "turn"
    model: str = "scripted"
    #: ``false`` plays a model that cannot use tools, like the embedded one.
    follows_tools: bool = True


def load_script(value: Script | dict[str, Any] | str | None) -> Script:
    """A :class:`Script` from a Script, a dict, JSON text or a path to a JSON file.

    ``None`` or an empty string gives the empty (echo) script. Raises
    :class:`ProviderError` (400) naming what is wrong with the script.
    """
    if value is None:
        return Script()
    if isinstance(value, Script):
        return value
    data: Any = value
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return Script()
        if not text.startswith(("{", "[")):
            path = Path(text).expanduser()
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as exc:
                raise ProviderError(
                    f"scripted: the script {value!r} is neither JSON nor a readable file ({exc})",
                    provider=NAME,
                    status_code=400,
                ) from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ProviderError(
                f"scripted: the script is not valid JSON: {exc}", provider=NAME, status_code=400
            ) from None
    if isinstance(data, list):  # a bare list of replies
        data = {"replies": data}
    try:
        return Script.model_validate(data)
    except ValidationError as exc:
        raise ProviderError(
            f"scripted: invalid script: {exc}", provider=NAME, status_code=400
        ) from None


@dataclass(frozen=True, slots=True)
class ScriptedRequest:
    """What one call to the scripted provider was asked."""

    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSpec, ...]
    max_tokens: int | None
    temperature: float | None
    reply_index: int | None  # index into the script's replies; None for the echo
    json_schema: JsonSchemaFormat | None = None


def _last_user_text(messages: Sequence[ChatMessage]) -> str:
    for message in reversed(messages):
        if message.role == "user":
            return message.content
    return ""


class ScriptedProvider(ProviderBase):
    """A :class:`~heed.llm.base.ChatProvider` that plays a :class:`Script`."""

    name: Final = NAME

    def __init__(self, script: Script | dict[str, Any] | str | None = None) -> None:
        self._script = load_script(script)
        self._sequence = 0
        self.requests: deque[ScriptedRequest] = deque(maxlen=256)
        #: ``time.monotonic()`` when the last token (of any stream) was produced.
        self.last_token_at: float | None = None

    @property
    def model(self) -> str:
        return self._script.model

    @property
    def follows_tools(self) -> bool:
        return self._script.follows_tools

    async def load(self) -> None:
        """Nothing to load."""

    @property
    def script(self) -> Script:
        return self._script

    @script.setter
    def script(self, value: Script | dict[str, Any] | str | None) -> None:
        self._script = load_script(value)
        self._sequence = 0

    def _choose(self, messages: Sequence[ChatMessage]) -> tuple[int | None, ScriptedReply]:
        script = self._script
        last_user = _last_user_text(messages).lower()
        for i, reply in enumerate(script.replies):
            if reply.when is not None and reply.when.lower() in last_user:
                return i, reply
        plain = [(i, r) for i, r in enumerate(script.replies) if r.when is None]
        if not plain:
            return None, ScriptedReply(text=_last_user_text(messages))
        if script.select == "sequence":
            k = self._sequence
            self._sequence += 1
        else:
            k = sum(1 for m in messages if m.role == "assistant")
        return plain[min(k, len(plain) - 1)]

    async def _stream(
        self, messages: Sequence[ChatMessage], options: StreamOptions
    ) -> AsyncGenerator[StreamEvent, None]:
        """Play the chosen reply; see the module docstring."""
        max_tokens = options.max_tokens
        watch = CancelWatch()
        try:
            watch.check()
            index, reply = self._choose(messages)
            self.requests.append(
                ScriptedRequest(
                    tuple(messages),
                    tuple(options.tools or ()),
                    max_tokens,
                    options.temperature,
                    index,
                    options.json_schema,
                )
            )
            delay = reply.token_delay if reply.token_delay is not None else self._script.token_delay
            turn = sum(1 for m in messages if m.role == "assistant")
            produced = 0
            finish = reply.finish
            await watch.sleep(reply.latency)
            for piece in split_tokens(reply.reply_text):
                if max_tokens is not None and produced >= max_tokens:
                    finish = "length"
                    break
                await watch.sleep(delay)
                self.last_token_at = time.monotonic()
                produced += 1
                yield TextDelta(piece)
            if reply.error is not None:
                raise _scripted_error(reply)
            if finish != "length":
                for i, call in enumerate(reply.tool_calls):
                    await watch.sleep(delay)
                    self.last_token_at = time.monotonic()
                    produced += 1
                    yield ToolCallEvent(
                        call.id or f"call_{turn}_{i}", call.name, dict(call.arguments)
                    )
            watch.check()
            prompt_tokens = sum(len(m.content.split()) for m in messages)
            yield Usage(prompt_tokens=prompt_tokens, completion_tokens=produced)
            if finish is None:
                finish = "tool_calls" if reply.tool_calls else "stop"
            yield Finish(finish)
        finally:
            watch.close()

    async def aclose(self) -> None:
        """Nothing to release."""


def _scripted_error(reply: ScriptedReply) -> ProviderError:
    message = f"{NAME}: {reply.error_message}"
    if reply.error == "rate_limited":
        return UpstreamRateLimited(message, provider=NAME, retry_after=1)
    if reply.error == "bad_output":
        return BadModelOutput(message, provider=NAME)
    return UpstreamUnavailable(message, provider=NAME)
