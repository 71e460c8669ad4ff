"""heed's LLM provider layer: one streaming chat interface, several providers.

- :mod:`heed.llm.base`: messages, tools, stream events, errors, the
  :class:`ChatProvider` protocol and :func:`complete`.
- :mod:`heed.llm.scripted`: deterministic replies for tests and benchmarks.
- :mod:`heed.llm.openai`: any OpenAI-compatible ``/chat/completions`` endpoint.
- :mod:`heed.llm.local`: SmolLM2-135M-Instruct embedded with llama-cpp-python.
- :mod:`heed.llm.factory`: ``build_provider(settings, operation)``.

Every provider stops within 50 ms of its request token being cancelled; see
docs/architecture.md ("LLM providers").
"""

from heed.llm.base import (
    BadModelOutput,
    ChatMessage,
    ChatProvider,
    Completion,
    Finish,
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
    UpstreamUnavailable,
    Usage,
    complete,
)
from heed.llm.scripted import Script, ScriptedProvider, ScriptedReply, load_script

__all__ = [
    "BadModelOutput",
    "ChatMessage",
    "ChatProvider",
    "Completion",
    "Finish",
    "ProviderError",
    "Role",
    "Script",
    "ScriptedProvider",
    "ScriptedReply",
    "StreamEvent",
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
    "load_script",
]
