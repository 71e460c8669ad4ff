"""The input rules every request meets at the API edge, before any route sees it.

One rule for text: every string heed accepts is valid Unicode, a sequence of
scalar values. JSON can smuggle what UTF-8 cannot carry: an escaped lone
surrogate (``"\\ud800"``) decodes to a Python ``str`` that SQLite cannot store,
the tokenizer cannot read and no response can serialise, so one such value
would poison every later read of what it was stored with. The lifecycle
middleware calls :func:`body_problem` on every request body; a body that is not
UTF-8 or holds a lone surrogate anywhere (a key or a value, at any depth) is
refused with a 400 naming the place, and nothing is written.

One rule for sizes: every id and name has a length limit, declared once here
as annotated types the wire models and routes use (:data:`Identifier`,
:data:`Name`, :data:`Tag`), and every integer a client sends is bounded
(:data:`Offset`), so no value reaches a store that it cannot hold (SQLite's
integers are 64-bit).

One rule for JSON types: a request body's values are taken as the OpenAPI
document types them. Request models derive from :class:`RequestBody`, which
validates strictly, so ``0`` is not ``false`` and ``"3"`` is not ``3`` (an
integer still counts as a number); the schema says ``boolean`` and means it.
Integers add :data:`JSON_INTEGER` (after their bounds), JSON Schema's integer: ``3.0`` is one.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Final

from fastapi import Path, Query
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

__all__ = [
    "JSON_INTEGER",
    "MAX_ID_CHARS",
    "MAX_NAME_CHARS",
    "MAX_OFFSET",
    "MAX_REASON_CHARS",
    "MAX_TAG_CHARS",
    "MAX_TEXT_CHARS",
    "MAX_TOKENS",
    "IdPath",
    "Identifier",
    "Limit",
    "Name",
    "Offset",
    "RequestBody",
    "Tag",
    "Text",
    "TokenBudget",
    "body_problem",
]

MAX_ID_CHARS: Final = 512
"""Longest id: bank, document, memory, session, run and operation ids."""
MAX_NAME_CHARS: Final = 500
"""Longest name: a bank's name, a session's title."""
MAX_TAG_CHARS: Final = 256
"""Longest tag, and longest metadata key."""
MAX_TEXT_CHARS: Final = 200_000
"""Longest free text field other than retained content (missions, contexts, metadata values)."""
MAX_OFFSET: Final = 2**31 - 1
"""Largest list offset (far beyond any bank; small enough for every store)."""
MAX_TOKENS: Final = 1_000_000
"""Largest token budget a request may ask for (recall ``max_tokens``, reflect's)."""
MAX_REASON_CHARS: Final = 200
"""Longest cancel reason a client may give."""


class RequestBody(BaseModel):
    """Base of every request body model: strict JSON types, unknown fields ignored."""

    model_config = ConfigDict(strict=True, extra="ignore")


def _integral(value: Any) -> Any:
    """A float without a fraction is an integer in JSON Schema (and so here); nothing else is."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


JSON_INTEGER: Final = BeforeValidator(_integral)
"""Makes an ``int`` of a strict request body take ``3`` or ``3.0``, never ``"3"``, ``3.5`` or
``true``. Put it after the bounds (``Annotated[int, Field(ge=1), JSON_INTEGER]``): before them,
pydantic leaves ``ge``/``le`` out of the JSON schema's ``minimum``/``maximum``."""

Identifier = Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS)]
Name = Annotated[str, Field(max_length=MAX_NAME_CHARS)]
Tag = Annotated[str, Field(min_length=1, max_length=MAX_TAG_CHARS)]
Text = Annotated[str, Field(max_length=MAX_TEXT_CHARS)]
TokenBudget = Annotated[int, Field(ge=1, le=MAX_TOKENS), JSON_INTEGER]

IdPath = Annotated[str, Path(min_length=1, max_length=MAX_ID_CHARS)]
Offset = Annotated[int, Query(ge=0, le=MAX_OFFSET)]
Limit = Annotated[int, Query(ge=1, le=1000)]

# An escaped UTF-16 surrogate (high or low) anywhere in the raw JSON. A valid pair
# (an emoji escaped by Python's json.dumps) matches too; parsing then tells them apart.
_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATES: Final = re.compile("[\ud800-\udfff]")


def _lone_surrogate_at(value: Any) -> str | None:
    """The path (``items[0].tags[0]``) of the first string holding a lone surrogate."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if _SURROGATES.search(item):
                return path or "(the body)"
        elif isinstance(item, dict):
            for key, child in item.items():
                if _SURROGATES.search(key):
                    return f"{path}.{key!a}" if path else f"the key {key!a}"
                stack.append((f"{path}.{key}" if path else key, child))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", child) for i, child in enumerate(item))
    return None


def body_problem(body: bytes) -> str | None:
    """Why *body* breaks the text rule, or None. Cheap unless the body escapes surrogates.

    Malformed JSON is not this rule's business (the route's parser answers it).
    """
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return (
            f"the request body is not valid UTF-8: byte 0x{body[exc.start]:02x} "
            f"at offset {exc.start}"
        )
    if not _SURROGATE_ESCAPE.search(body):
        return None
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return None
    where = _lone_surrogate_at(parsed)
    if where is None:
        return None
    return (
        f"the request body holds a lone UTF-16 surrogate at {where}: text must be valid "
        "Unicode (pair each \\ud800-\\udbff escape with a following \\udc00-\\udfff one)"
    )
