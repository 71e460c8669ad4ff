"""``response_schema``: checking the caller's JSON Schema and producing structured output.

The schema is checked before any work starts: one that is not valid JSON Schema
is the caller's mistake (:class:`InvalidResponseSchema`, 400, naming the
problem). After the answer, one more model call turns it into JSON; the JSON is
validated against the schema. A model that cannot produce valid JSON is not an
error of the request: the answer text stands and ``structured_output_error``
says what went wrong.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for

from heed.errors import HeedError
from heed.llm.base import ChatMessage, Completion, ToolSpec

__all__ = ["InvalidResponseSchema", "check_schema", "structured_output"]

ModelCall = Callable[
    [Sequence[ChatMessage], Sequence[ToolSpec] | None, str, int], Awaitable[Completion]
]


class InvalidResponseSchema(HeedError):
    """``response_schema`` is not a valid JSON Schema (400)."""

    status_code = 400


def check_schema(schema: Any) -> None:
    """Raise :class:`InvalidResponseSchema` unless *schema* is a valid JSON Schema object."""
    if not isinstance(schema, dict):
        raise InvalidResponseSchema("response_schema must be a JSON object (a JSON Schema)")
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "(root)"
        raise InvalidResponseSchema(
            f"response_schema is not valid JSON Schema at {where}: {exc.message}"
        ) from None


def _first_json_object(text: str) -> Any:
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        raise ValueError("the model's reply contains no JSON object")
    return json.loads(text[start : end + 1])


async def structured_output(
    call: ModelCall, answer: str, schema: dict[str, Any]
) -> tuple[dict[str, Any] | None, str | None]:
    """``(value, None)`` with JSON matching *schema*, or ``(None, why not)``."""
    messages = [
        ChatMessage.system(
            "Convert the answer into JSON matching the JSON Schema. Reply with only the JSON."
        ),
        ChatMessage.user(f"JSON Schema:\n{json.dumps(schema)}\n\nAnswer:\n{answer}"),
    ]
    completion = await call(messages, None, "structured_output", 0)
    try:
        value = _first_json_object(completion.text)
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        return None, f"the model did not produce JSON: {exc}"
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as exc:
        return None, f"the model's JSON does not match response_schema: {exc.message}"
    if not isinstance(value, dict):
        return None, "the model's JSON is not an object"
    return value, None
