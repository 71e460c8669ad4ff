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

One rule for counts: every list and map a client sends has a count limit
(:data:`TagList`, :data:`EntityList`, :data:`MetadataMap`, ...), and every query
parameter a length limit (:data:`QueryText`, :data:`QueryId`), checked by the request
model before any work, so no request can make heed do work proportional to an
unbounded list (a tag merge, a row per tag per unit).

One rule for NUL: no text heed accepts holds U+0000. PostgreSQL cannot store it in
``text`` and SQLite's C API treats it as a terminator in places; rather than let the two
databases disagree, :func:`body_problem` refuses a body holding ``\\u0000`` and
:func:`url_problem` a path or query string holding ``%00``, each with a 400.

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
    "MAX_ENTITIES",
    "MAX_ID_CHARS",
    "MAX_LIST_ITEMS",
    "MAX_MESSAGES",
    "MAX_NAME_CHARS",
    "MAX_OFFSET",
    "MAX_QUERY_CHARS",
    "MAX_REASON_CHARS",
    "MAX_RETAIN_ITEMS",
    "MAX_TAG_CHARS",
    "MAX_TEXT_CHARS",
    "MAX_TOKENS",
    "OFFLOAD_BODY_BYTES",
    "IdPath",
    "Identifier",
    "Limit",
    "MetadataMap",
    "Name",
    "Offset",
    "QueryId",
    "QueryText",
    "RequestBody",
    "Tag",
    "TagList",
    "TagsQuery",
    "Text",
    "TokenBudget",
    "body_problem",
    "url_problem",
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
MAX_LIST_ITEMS: Final = 64
"""Most entries in a list of tags or names a client sends (tags, document tags, tag and
type filters), and most keys in a metadata map."""
MAX_ENTITIES: Final = 256
"""Most entities given with one retained item."""
MAX_RETAIN_ITEMS: Final = 5_000
"""Most items in one retain request (each becomes at least one document or part of one)."""
MAX_MESSAGES: Final = 10_000
"""Most messages in one item's conversation content."""
OFFLOAD_BODY_BYTES: Final = 64 * 1024
"""A request body this large or larger is checked and parsed in a worker thread, not on the
event loop (the text rule here, the JSON parse in :mod:`heed.api.routing`)."""
MAX_QUERY_CHARS: Final = 2_000
"""Longest free-text query parameter (``?q=``); ids and dates in the query string are ids."""


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

TagList = Annotated[list[Tag], Field(max_length=MAX_LIST_ITEMS)]
MetadataMap = Annotated[dict[Tag, Text], Field(max_length=MAX_LIST_ITEMS)]

IdPath = Annotated[str, Path(min_length=1, max_length=MAX_ID_CHARS)]
QueryText = Annotated[str, Query(max_length=MAX_QUERY_CHARS)]
QueryId = Annotated[str, Query(min_length=1, max_length=MAX_ID_CHARS)]
Offset = Annotated[int, Query(ge=0, le=MAX_OFFSET)]
Limit = Annotated[int, Query(ge=1, le=1000)]
TagsQuery = Annotated[list[Tag] | None, Query(max_length=MAX_LIST_ITEMS)]
"""A repeated ``?tags=a&tags=b`` filter."""

# An escaped UTF-16 surrogate (high or low) anywhere in the raw JSON. A valid pair
# (an emoji escaped by Python's json.dumps) matches too; parsing then tells them apart.
_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATES: Final = re.compile("[\ud800-\udfff]")
# ``\u0000`` in the raw JSON (a raw NUL byte is not valid JSON: the parser refuses it). An
# escaped backslash before "u0000" matches too; parsing then tells them apart.
_NUL_ESCAPE: Final = b"\\u0000"
_NUL: Final = re.compile("\x00")


def _string_matching_at(value: Any, pattern: re.Pattern[str]) -> str | None:
    """The path (``items[0].tags[0]``) of the first key or string value *pattern* finds."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if pattern.search(item):
                return path or "(the body)"
        elif isinstance(item, dict):
            for key, child in item.items():
                if pattern.search(key):
                    return f"{path}.{key!a}" if path else f"the key {key!a}"
                stack.append((f"{path}.{key}" if path else key, child))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", child) for i, child in enumerate(item))
    return None


def body_problem(body: bytes) -> str | None:
    """Why *body* breaks the text rule, or None. Cheap unless the body escapes a surrogate
    or NUL.

    Malformed JSON is not this rule's business (the route's parser answers it).
    """
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return (
            f"the request body is not valid UTF-8: byte 0x{body[exc.start]:02x} "
            f"at offset {exc.start}"
        )
    surrogates = _SURROGATE_ESCAPE.search(body) is not None
    nul = _NUL_ESCAPE in body
    if not (surrogates or nul):
        return None
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if surrogates and (where := _string_matching_at(parsed, _SURROGATES)) is not None:
        return (
            f"the request body holds a lone UTF-16 surrogate at {where}: text must be valid "
            "Unicode (pair each \\ud800-\\udbff escape with a following \\udc00-\\udfff one)"
        )
    if nul and (where := _string_matching_at(parsed, _NUL)) is not None:
        return f"the request body holds a NUL character (\\u0000) at {where}: text may not hold NUL"
    return None


def url_problem(path: str, query_string: bytes) -> str | None:
    """Why a request's decoded *path* or raw *query_string* breaks the NUL rule, or None."""
    if "\x00" in path:
        return "the request path holds a NUL character (%00)"
    if b"%00" in query_string or b"\x00" in query_string:
        return "the query string holds a NUL character (%00)"
    return None
