"""The records of a bank archive: one JSON object per line, checked field by field.

:mod:`heed.transfer.archive` is the container (a zip of sections); each section's module
(:mod:`heed.transfer.sections`) says what one of its lines holds, in the terms of this
module: a :class:`Record` (pydantic, strict) checked by :func:`validate`, the field types
(:data:`Id`, :data:`Tags`, :data:`Count`), times (:func:`utc_time`) and vectors
(:func:`encode_vector`, :func:`decode_vector`). Decoding is strict: the bytes must be
UTF-8, the JSON standard (no ``NaN``, no key twice in an object), every text valid
Unicode without NUL (no lone surrogate), every field of the section's record present with its type
(an ``int`` is not a ``str``; a field the record does not have is refused by name), times ISO-8601
with a zone (kept as UTC text), vectors base64 of little-endian float32 with finite values.
Cross-record rules (unique ids, references, counts) are each section's check
(:func:`heed.transfer.check.check_archive`).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, Final, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from heed.memory.models import InvalidInput

__all__ = [
    "MANIFEST",
    "NOT_BLANK",
    "Count",
    "Id",
    "InvalidArchive",
    "Name",
    "Record",
    "ScopeTags",
    "Tags",
    "check_values",
    "codec",
    "decode_vector",
    "encode_vector",
    "epoch",
    "epoch_iso",
    "fields_of",
    "iso_utc",
    "parse_line",
    "row_of",
    "utc_time",
    "validate",
]

#: The archive's manifest entry.
MANIFEST: Final = "manifest.json"

#: Longest id the archive may hold (the API's id limit).
ID_CHARS: Final = 512
#: Most tags on one unit or document.
MAX_TAGS: Final = 1024


class InvalidArchive(InvalidInput):
    """The archive cannot be imported; the message names the entry, line and problem
    (HTTP 400). Nothing was written."""

    def __init__(self, problem: str) -> None:
        super().__init__(f"invalid bank archive: {problem}")


# -- JSON lines ------------------------------------------------------------------------------


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} twice in one object")
        out[key] = value
    return out


_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def _bad_text(value: Any) -> str | None:
    """Why a string in *value* (a key or a value, any depth) cannot be stored, or None."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return "a text holds NUL (\\u0000)"
            if _SURROGATE.search(item):
                return "a text holds a lone UTF-16 surrogate"
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


def check_values(line: bytes, limit: int, where: str) -> None:
    """Refuse *line* when it holds more than *limit* JSON values, before it is decoded.

    Decoding makes an object of every value: ``{}`` costs 64 bytes of memory for its 2 bytes
    of text, so a line of empty objects would cost twenty times its size. Every value but the
    first follows a ``,`` or a ``:`` or opens a container, so counting those bytes bounds the
    values from above; only when that count (strings included) is past the limit are the
    strings taken out and the bytes counted again, both in C.
    """
    if _structure(line) <= limit:
        return
    values = _structure(_STRING.sub(b'""', line))
    if values > limit:
        raise InvalidArchive(
            f"{where}: a record of {values} JSON values; the limit is {limit} a record"
        )


#: A JSON string (the unrolled loop: linear, no backtracking).
_STRING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def _structure(data: bytes) -> int:
    return 1 + sum(data.count(c) for c in (b",", b":", b"[", b"{"))


def parse_line(line: bytes, where: str) -> dict[str, Any]:
    """One JSON object from *line* (see the module docstring); *where* names it."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidArchive(
            f"{where}: not UTF-8 (byte 0x{line[exc.start]:02x} at offset {exc.start})"
        ) from None
    try:
        value = json.loads(text, parse_constant=_no_constants, object_pairs_hook=_no_duplicate_keys)
    except (ValueError, RecursionError) as exc:
        raise InvalidArchive(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise InvalidArchive(f"{where}: a record must be a JSON object")
    if "\\u" in text and (problem := _bad_text(value)) is not None:
        raise InvalidArchive(f"{where}: {problem}")
    return value


# -- field types -----------------------------------------------------------------------------


def iso_utc(value: str) -> str:
    """*value* (ISO-8601 with a zone) as the stores write times: UTC ``isoformat``."""
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError("a time needs a zone (e.g. +00:00)")
    return parsed.astimezone(UTC).isoformat()


Id = Annotated[str, Field(min_length=1, max_length=ID_CHARS)]
Tags = Annotated[list[Annotated[str, Field(max_length=256)]], Field(max_length=MAX_TAGS)]
Count = Annotated[int, Field(ge=0, le=2**31 - 1)]


class Record(BaseModel):
    """A record of a section: strict types, no field it does not declare."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


R = TypeVar("R", bound=Record)
T = TypeVar("T")

#: A text with something besides spaces (a name, a directive's content).
NOT_BLANK: Final = r"\S"
#: A directive's, a mental model's or a knowledge-base folder's name.
Name = Annotated[str, Field(min_length=1, max_length=500, pattern=NOT_BLANK)]
#: A directive's or a mental model's scope tags (at most 64, none empty).
ScopeTags = Annotated[
    list[Annotated[str, Field(min_length=1, max_length=256)]], Field(max_length=64)
]


def fields_of(row: Any, record: type[Record], **turned: Any) -> dict[str, Any]:
    """*row*'s attributes named as *record*'s fields, in their order: the record of a row
    whose attributes are the record's (a section's encoding), but for the fields *turned*
    gives (what the section turns itself; *row* need not have them)."""
    return {
        name: turned[name] if name in turned else getattr(row, name) for name in record.model_fields
    }


def row_of(record: Record, row: Callable[..., T], where: str, **fields: Any) -> T:
    """The inverse of :func:`fields_of`: *row* (a row's class) built from *record*'s
    fields by their names, each list and dict copied, ``created_at`` and ``updated_at``
    as UTC text (:func:`utc_time`; ``""`` for none), and *fields* (what the row holds
    besides, or what the section turns itself) over them."""
    values = {name: _copied(getattr(record, name)) for name in type(record).model_fields}
    for name in ("created_at", "updated_at"):
        if name in values:
            values[name] = utc_time(values[name], name, where) or ""
    return row(**{**values, **fields})


def codec(
    record: type[Record], row: Callable[..., T], **fields: Any
) -> tuple[Callable[[T], dict[str, Any]], Callable[[dict[str, Any], int, str], T]]:
    """A section's ``encode`` and ``decode`` when its rows are its records, field for field:
    ``encode`` is :func:`fields_of` (*record*'s fields of a row), ``decode`` validates a
    value as a *record* (:func:`validate`) and builds the *row* of it (:func:`row_of`, with
    *fields* over the record's: what the row holds besides)."""

    def encode(value: T) -> dict[str, Any]:
        return fields_of(value, record)

    def decode(value: dict[str, Any], dim: int, where: str) -> T:
        return row_of(validate(record, value, where), row, where, **fields)

    return encode, decode


def _copied(value: Any) -> Any:
    if isinstance(value, list):
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    return value


def _problem(error: ValidationError) -> str:
    first = error.errors(include_url=False)[0]
    loc = ".".join(str(p) for p in first["loc"]) or "(the record)"
    return f"{loc}: {first['msg']}"


def validate(model: type[R], value: dict[str, Any], where: str) -> R:
    """*value* as a *model* record, or :class:`InvalidArchive` naming the first problem."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise InvalidArchive(f"{where}: {_problem(exc)}") from None


def utc_time(value: str | None, field: str, where: str) -> str | None:
    """A record's time *field* as UTC text (``None`` stays ``None``), or
    :class:`InvalidArchive`."""
    if value is None:
        return None
    try:
        return iso_utc(value)
    except ValueError as exc:
        raise InvalidArchive(f"{where}: {field} {value[:60]!r} is not a time ({exc})") from None


# -- vectors -----------------------------------------------------------------------------------


def encode_vector(vector: Any) -> str | None:
    """A float32 vector as base64 of its little-endian bytes (``None`` stays ``None``)."""
    if vector is None:
        return None
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def decode_vector(text: str, dim: int, where: str) -> np.ndarray:
    """The float32 vector of *text* (:func:`encode_vector`), which must have *dim* finite
    values."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArchive(f"{where}: vector is not base64") from None
    if len(raw) != 4 * dim:
        raise InvalidArchive(
            f"{where}: vector has {len(raw) / 4:g} dimensions; the archive declares {dim}"
        )
    vector = np.frombuffer(raw, dtype="<f4").astype(np.float32)
    if not np.isfinite(vector).all():
        raise InvalidArchive(f"{where}: vector holds a value that is not finite")
    return vector


def epoch_iso(value: float) -> str:
    """Epoch seconds as a record's time."""
    return datetime.fromtimestamp(value, UTC).isoformat()


def epoch(value: str, field: str, where: str) -> float:
    """A record's time *field* as epoch seconds."""
    text = utc_time(value, field, where)
    assert text is not None
    return datetime.fromisoformat(text).timestamp()
