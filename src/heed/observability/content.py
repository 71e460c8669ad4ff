"""What an LLM request trace keeps of a call's text (``HEED_LLM_REQUEST_LOG_CONTENT``).

- ``off`` (the default): no text. The input is the messages' roles and lengths, the output
  the reply's length and the names of the tools it called: enough to see what a call was
  and what it cost, nothing of what a user wrote or a memory holds.
- ``on``: the messages' and the reply's text and the tool calls' arguments, each with the
  server's secrets (every configured API key) and any password shape masked
  (:func:`heed.redact.redact`), each text clipped to :data:`MAX_TEXT` characters.

Never kept either way: API keys, request headers, the provider's URL.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

from heed.llm.base import ChatMessage, ToolCall
from heed.redact import redact

__all__ = ["MAX_TEXT", "input_of", "output_of"]

MAX_TEXT: Final = 20_000


def _text(text: str, keep: bool, secrets: Iterable[str]) -> dict[str, Any]:
    if not keep:
        return {"chars": len(text)}
    clipped = text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "..."
    return {"content": redact(clipped, secrets)}


def input_of(
    messages: Sequence[ChatMessage], *, keep: bool, secrets: Iterable[str]
) -> list[dict[str, Any]]:
    """The trace's ``input``: one object per message (``role`` and the text or its length)."""
    secrets = tuple(secrets)
    out: list[dict[str, Any]] = []
    for message in messages:
        entry: dict[str, Any] = {"role": message.role, **_text(message.content, keep, secrets)}
        if message.tool_calls:
            entry["tool_calls"] = [c.name for c in message.tool_calls]
        out.append(entry)
    return out


def output_of(
    reply: str,
    tool_calls: Sequence[ToolCall],
    finish_reason: str | None,
    *,
    keep: bool,
    secrets: Iterable[str],
) -> dict[str, Any]:
    """The trace's ``output``: the reply (or its length), its tool calls, why it ended."""
    secrets = tuple(secrets)
    calls: list[dict[str, Any]] = []
    for call in tool_calls:
        entry: dict[str, Any] = {"name": call.name}
        if keep:
            entry["arguments"] = redact(str(call.arguments)[:MAX_TEXT], secrets)
        calls.append(entry)
    return {**_text(reply, keep, secrets), "tool_calls": calls, "finish_reason": finish_reason}
