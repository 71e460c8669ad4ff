"""Reflect: an agent loop over a memory bank (recall, expand, done) run by an LLM provider.

See :mod:`heed.reflect.agent` for the loop and :mod:`heed.reflect.schema` for
``response_schema``. The HTTP route is :mod:`heed.api.routes.reflect`.
"""

from heed.reflect.agent import (
    ITERATIONS,
    TOOLS,
    LLMTrace,
    ReflectAgent,
    ReflectListener,
    ReflectOutcome,
    ReflectRequest,
    ToolTrace,
)
from heed.reflect.schema import InvalidResponseSchema, check_schema

__all__ = [
    "ITERATIONS",
    "TOOLS",
    "InvalidResponseSchema",
    "LLMTrace",
    "ReflectAgent",
    "ReflectListener",
    "ReflectOutcome",
    "ReflectRequest",
    "ToolTrace",
    "check_schema",
]
