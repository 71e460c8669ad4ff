"""heed's LLM provider layer: one streaming chat interface, several providers.

- :mod:`heed.llm.base`: messages, tools, stream events, errors, the
  :class:`ChatProvider` protocol and :func:`complete`.
- :mod:`heed.llm.scripted`: deterministic replies for tests and benchmarks.
- :mod:`heed.llm.openai`: any OpenAI-compatible ``/chat/completions`` endpoint.
- :mod:`heed.llm.local`: SmolLM2-135M-Instruct embedded with llama-cpp-python.
- :mod:`heed.llm.factory`: ``build_provider(settings, operation)``.
- :mod:`heed.llm.structured`: ``complete_json``, one validated JSON object from
  any provider (``json_schema`` on ``stream`` / ``complete`` asks for it).
- :mod:`heed.llm.observe`: observers of retries and failures (never silent).

Every provider stops within 50 ms of its request token being cancelled; see
docs/architecture.md ("LLM providers").
"""

from heed.llm.base import (
    BadModelOutput,
    ChatMessage,
    ChatProvider,
    Completion,
    Finish,
    JsonSchemaFormat,
    ProviderError,
    Role,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    ToolSpec,
    UnknownModel,
    UnknownProvider,
    UpstreamRateLimited,
    UpstreamTimedOut,
    UpstreamUnavailable,
    Usage,
    complete,
)
from heed.llm.observe import LlmObserver, add_global_observer, observing
from heed.llm.scripted import Script, ScriptedProvider, ScriptedReply, load_script
from heed.llm.structured import StructuredReply, complete_json

__all__ = [
    "BadModelOutput",
    "ChatMessage",
    "ChatProvider",
    "Completion",
    "Finish",
    "JsonSchemaFormat",
    "LlmObserver",
    "ProviderError",
    "Role",
    "Script",
    "ScriptedProvider",
    "ScriptedReply",
    "StreamEvent",
    "StructuredReply",
    "TextDelta",
    "ToolCall",
    "ToolCallEvent",
    "ToolSpec",
    "UnknownModel",
    "UnknownProvider",
    "UpstreamRateLimited",
    "UpstreamTimedOut",
    "UpstreamUnavailable",
    "Usage",
    "add_global_observer",
    "complete",
    "complete_json",
    "load_script",
    "observing",
]
