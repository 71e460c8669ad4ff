"""The records of a bank archive: one JSON object per line, checked field by field.

:mod:`heed.transfer.archive` is the container (a zip of sections); this module is what one
line holds, for each section of format versions 1 and 2 (docs/bank-archive.md), and the two
directions: :func:`encode` turns a row of :mod:`heed.transfer.rows` into a JSON line,
:func:`decode` turns a line back into a row or raises :class:`InvalidArchive` naming the
problem. Decoding is strict: the bytes must be UTF-8, the JSON standard (no ``NaN``, no key
twice in an object), every text valid Unicode without NUL (no lone surrogate), every field
of the section's record present with its type (an ``int`` is not a ``str``; a field the
record does not have is refused by name), times ISO-8601 with a zone (kept as UTC text),
vectors base64 of little-endian float32 with finite values. Cross-record rules (unique
ids, references, counts) are :func:`heed.transfer.check.check_archive`'s.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from heed.memory.directives.rules import MAX_CONTENT_CHARS, Directive
from heed.memory.mental_models import (
    HISTORY_LIMIT,
    HistoryEntry,
    KnowledgeFolder,
    MentalModel,
    merge_trigger,
)
from heed.memory.models import CONSOLIDATION_STATES, FACT_TYPES, Bank, InvalidInput
from heed.transfer.rows import (
    ChunkRow,
    DocumentRow,
    EntityRow,
    LinkRow,
    MembershipRow,
    MentalModelRow,
    UnitRow,
)
from heed.webhooks.models import HttpConfig, Webhook

__all__ = [
    "BankRecord",
    "InvalidArchive",
    "bank_record",
    "check_values",
    "decode",
    "decode_vector",
    "encode",
    "encode_bank",
    "encode_vector",
    "iso_utc",
]

#: Longest id the archive may hold (the API's id limit).
ID_CHARS: Final = 512
#: Most tags on one unit or document.
MAX_TAGS: Final = 1024
#: Longest link type (``entity``, ``temporal``, ``source``, ``causal`` today).
LINK_TYPE: Final = re.compile(r"^[a-z][a-z_]{0,31}$")


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


class _Record(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class ChunkRecord(_Record):
    id: Id
    chunk_index: Count
    text: str


class DocumentRecord(_Record):
    document_id: Id
    original_text: str
    content_hash: str | None
    metadata: dict[str, Any]
    tags: Tags
    created_at: str
    updated_at: str
    unit_count: Count
    chunks: list[ChunkRecord]


class HistoryRecord(_Record):
    """An observation's earlier version (what consolidation writes)."""

    text: str
    proof_count: int | None = None
    changed_at: str | None = None
    reason: str | None = None
    state: str = "invalidated"


class UnitRecord(_Record):
    id: Id
    document_id: Id | None
    chunk_id: Id | None
    text: Annotated[str, Field(min_length=1)]
    index_text: str
    fact_type: Literal["world", "experience", "observation"]
    context: str | None
    occurred_start: str | None
    occurred_end: str | None
    mentioned_at: str | None
    metadata: dict[str, str]
    tags: Tags
    created_at: str
    updated_at: str | None
    token_count: Count | None
    consolidation_state: Literal["pending", "done", "failed"] | None
    source_ids: Annotated[list[Id], Field(max_length=100_000)]
    proof_count: Count | None
    history: list[HistoryRecord]
    vector: str | None


class EntityRecord(_Record):
    id: Id
    name: Annotated[str, Field(min_length=1, max_length=2000)]
    type: Annotated[str, Field(max_length=200)] | None


class MembershipRecord(_Record):
    unit_id: Id
    entity_id: Id


class LinkRecord(_Record):
    from_id: Id
    to_id: Id
    link_type: Annotated[str, Field(pattern=LINK_TYPE.pattern)]
    weight: float


#: A text with something besides spaces (a directive's name and content).
_NOT_BLANK: Final = r"\S"


class DirectiveRecord(_Record):
    """A rule of the bank (section ``directives``), by the directive service's limits."""

    id: Id
    name: Annotated[str, Field(min_length=1, max_length=500, pattern=_NOT_BLANK)]
    content: Annotated[str, Field(min_length=1, max_length=MAX_CONTENT_CHARS, pattern=_NOT_BLANK)]
    priority: Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
    is_active: bool
    tags: Annotated[list[Annotated[str, Field(min_length=1, max_length=256)]], Field(max_length=64)]
    created_at: str
    updated_at: str


class FolderRecord(_Record):
    """A knowledge-base folder (section ``knowledge_folders``)."""

    id: Id
    name: Annotated[str, Field(min_length=1, max_length=500, pattern=_NOT_BLANK)]
    parent_id: Id | None
    managed: bool
    created_at: str
    updated_at: str


class ModelHistoryRecord(_Record):
    """An earlier content of a mental model."""

    version: Annotated[int, Field(ge=1, le=2**31 - 1)]
    previous_content: str
    changed_at: str
    reason: Annotated[str, Field(max_length=100)]


class MentalModelRecord(_Record):
    """A mental model or knowledge-base page (section ``mental_models``), with its
    history (newest first) and the vector it is ranked by."""

    id: Id
    name: Annotated[str, Field(min_length=1, max_length=500, pattern=_NOT_BLANK)]
    source_query: Annotated[str, Field(min_length=1, pattern=_NOT_BLANK)]
    content: str
    tags: Annotated[list[Annotated[str, Field(min_length=1, max_length=256)]], Field(max_length=64)]
    max_tokens: Annotated[int, Field(ge=1, le=8192)]
    trigger: dict[str, Any]
    parent_id: Id | None
    is_page: bool
    reflect_response: dict[str, Any] | None
    created_at: str
    updated_at: str
    last_refreshed_at: str | None
    last_refresh_failed_at: str | None
    history: Annotated[list[ModelHistoryRecord], Field(max_length=HISTORY_LIMIT)]
    vector: str | None


class HttpConfigRecord(_Record):
    method: Literal["POST"]
    timeout_seconds: Annotated[int, Field(ge=1, le=60)]
    headers: dict[str, str]
    params: dict[str, str]


class WebhookRecord(_Record):
    """A webhook of the bank (section ``webhooks``), its secret included: the rules a
    webhook's fields meet (target allow-list, events, secret) are the webhook service's,
    applied again where the archive is imported."""

    id: Id
    url: Annotated[str, Field(min_length=1, max_length=2048)]
    secret: Annotated[str, Field(min_length=1, max_length=512)]
    event_types: Annotated[list[Annotated[str, Field(max_length=100)]], Field(max_length=32)]
    enabled: bool
    http_config: HttpConfigRecord
    created_at: str
    updated_at: str


class Disposition(_Record):
    skepticism: Annotated[int, Field(ge=1, le=5)] = 3
    literalism: Annotated[int, Field(ge=1, le=5)] = 3
    empathy: Annotated[int, Field(ge=1, le=5)] = 3


class BankRecord(_Record):
    """The bank's profile and configuration (section ``bank``, one record)."""

    bank_id: Id
    name: Annotated[str, Field(max_length=500)]
    mission: str
    background: str | None
    disposition: Disposition
    config: dict[str, Any]
    created_at: str


_MODELS: Final[dict[str, type[_Record]]] = {
    "bank": BankRecord,
    "directives": DirectiveRecord,
    "webhooks": WebhookRecord,
    "knowledge_folders": FolderRecord,
    "mental_models": MentalModelRecord,
    "documents": DocumentRecord,
    "units": UnitRecord,
    "observations": UnitRecord,
    "entities": EntityRecord,
    "unit_entities": MembershipRecord,
    "links": LinkRecord,
}

assert set(FACT_TYPES) == {"world", "experience", "observation"}
assert set(CONSOLIDATION_STATES) == {"pending", "done", "failed"}


def _problem(error: ValidationError) -> str:
    first = error.errors(include_url=False)[0]
    loc = ".".join(str(p) for p in first["loc"]) or "(the record)"
    return f"{loc}: {first['msg']}"


def _time(value: str | None, field: str, where: str) -> str | None:
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


# -- rows <-> records ------------------------------------------------------------------------


def _unit_dict(unit: UnitRow) -> dict[str, Any]:
    return {
        "id": unit.id,
        "document_id": unit.document_id,
        "chunk_id": unit.chunk_id,
        "text": unit.text,
        "index_text": unit.index_text if unit.index_text is not None else unit.text,
        "fact_type": unit.fact_type,
        "context": unit.context,
        "occurred_start": unit.occurred_start,
        "occurred_end": unit.occurred_end,
        "mentioned_at": unit.mentioned_at,
        "metadata": unit.metadata,
        "tags": unit.tags,
        "created_at": unit.created_at,
        "updated_at": unit.updated_at,
        "token_count": unit.token_count,
        "consolidation_state": unit.consolidation_state,
        "source_ids": unit.source_ids,
        "proof_count": unit.proof_count,
        "history": unit.history,
        "vector": encode_vector(unit.vector),
    }


def _model_dict(row: MentalModelRow) -> dict[str, Any]:
    model = row.model
    return {
        "id": model.id,
        "name": model.name,
        "source_query": model.source_query,
        "content": model.content,
        "tags": model.tags,
        "max_tokens": model.max_tokens,
        "trigger": model.trigger,
        "parent_id": model.parent_id,
        "is_page": model.is_page,
        "reflect_response": model.reflect_response,
        "created_at": model.created_at,
        "updated_at": model.updated_at,
        "last_refreshed_at": model.last_refreshed_at,
        "last_refresh_failed_at": model.last_refresh_failed_at,
        "history": [
            {
                "version": h.version,
                "previous_content": h.previous_content,
                "changed_at": h.changed_at,
                "reason": h.reason,
            }
            for h in row.history
        ],
        "vector": encode_vector(model.embedding),
    }


def _epoch_iso(value: float) -> str:
    return datetime.fromtimestamp(value, UTC).isoformat()


def _webhook_dict(webhook: Webhook) -> dict[str, Any]:
    config = webhook.http_config
    return {
        "id": webhook.id,
        "url": webhook.url,
        "secret": webhook.secret,
        "event_types": webhook.event_types,
        "enabled": webhook.enabled,
        "http_config": {
            "method": config.method,
            "timeout_seconds": config.timeout_seconds,
            "headers": config.headers,
            "params": config.params,
        },
        "created_at": _epoch_iso(webhook.created_at),
        "updated_at": _epoch_iso(webhook.updated_at),
    }


def encode(row: Any) -> bytes:
    """One row of :mod:`heed.transfer.rows` (or a directive) as a JSON line (newline
    included)."""
    if isinstance(row, UnitRow):
        value: dict[str, Any] = _unit_dict(row)
    elif isinstance(row, DocumentRow):
        value = {
            "document_id": row.document_id,
            "original_text": row.original_text,
            "content_hash": row.content_hash,
            "metadata": row.metadata,
            "tags": row.tags,
            "created_at": row.created_at,
            "updated_at": row.updated_at,
            "unit_count": row.unit_count,
            "chunks": [
                {"id": c.id, "chunk_index": c.chunk_index, "text": c.text} for c in row.chunks
            ],
        }
    elif isinstance(row, EntityRow):
        value = {"id": row.id, "name": row.name, "type": row.type}
    elif isinstance(row, MembershipRow):
        value = {"unit_id": row.unit_id, "entity_id": row.entity_id}
    elif isinstance(row, Directive):
        value = {
            "id": row.id,
            "name": row.name,
            "content": row.content,
            "priority": row.priority,
            "is_active": row.is_active,
            "tags": row.tags,
            "created_at": row.created_at,
            "updated_at": row.updated_at,
        }
    elif isinstance(row, KnowledgeFolder):
        value = {
            "id": row.id,
            "name": row.name,
            "parent_id": row.parent_id,
            "managed": row.managed,
            "created_at": row.created_at,
            "updated_at": row.updated_at,
        }
    elif isinstance(row, MentalModelRow):
        value = _model_dict(row)
    elif isinstance(row, Webhook):
        value = _webhook_dict(row)
    elif isinstance(row, LinkRow):
        value = {
            "from_id": row.from_id,
            "to_id": row.to_id,
            "link_type": row.link_type,
            "weight": row.weight,
        }
    else:
        raise TypeError(f"not a bank row: {type(row).__name__}")
    return json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8") + b"\n"


def encode_bank(bank: Bank) -> bytes:
    """The ``bank`` section's record of *bank* (its profile and configuration)."""
    value = {
        "bank_id": bank.bank_id,
        "name": bank.name,
        "mission": bank.mission,
        "background": bank.background,
        "disposition": bank.disposition,
        "config": bank.config,
        "created_at": bank.created_at,
    }
    return json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")


def bank_record(value: dict[str, Any], where: str) -> BankRecord:
    """The ``bank`` section's record, checked."""
    try:
        record = BankRecord.model_validate(value)
    except ValidationError as exc:
        raise InvalidArchive(f"{where}: {_problem(exc)}") from None
    _time(record.created_at, "created_at", where)
    return record


def decode(section: str, value: dict[str, Any], dim: int, where: str) -> Any:
    """The row a parsed line of *section* holds (see the module docstring); vectors must
    have *dim* values."""
    model = _MODELS[section]
    try:
        record = model.model_validate(value)
    except ValidationError as exc:
        raise InvalidArchive(f"{where}: {_problem(exc)}") from None
    if isinstance(record, UnitRecord):
        return _unit_row(record, dim, where)
    if isinstance(record, DocumentRecord):
        return DocumentRow(
            document_id=record.document_id,
            original_text=record.original_text,
            content_hash=record.content_hash,
            metadata=dict(record.metadata),
            tags=list(record.tags),
            created_at=_time(record.created_at, "created_at", where) or "",
            updated_at=_time(record.updated_at, "updated_at", where) or "",
            unit_count=record.unit_count,
            chunks=[ChunkRow(c.id, c.chunk_index, c.text) for c in record.chunks],
        )
    if isinstance(record, EntityRecord):
        return EntityRow(record.id, record.name, record.type)
    if isinstance(record, MembershipRecord):
        return MembershipRow(record.unit_id, record.entity_id)
    if isinstance(record, DirectiveRecord):
        return Directive(
            id=record.id,
            bank_ref="",
            name=record.name,
            content=record.content,
            priority=record.priority,
            is_active=record.is_active,
            tags=list(record.tags),
            created_at=_time(record.created_at, "created_at", where) or "",
            updated_at=_time(record.updated_at, "updated_at", where) or "",
        )
    if isinstance(record, FolderRecord):
        return KnowledgeFolder(
            bank_ref="",
            id=record.id,
            name=record.name,
            parent_id=record.parent_id,
            managed=record.managed,
            created_at=_time(record.created_at, "created_at", where) or "",
            updated_at=_time(record.updated_at, "updated_at", where) or "",
        )
    if isinstance(record, MentalModelRecord):
        return _model_row(record, dim, where)
    if isinstance(record, WebhookRecord):
        return _webhook_row(record, where)
    if isinstance(record, LinkRecord):
        if not math.isfinite(record.weight):
            raise InvalidArchive(f"{where}: weight is not finite")
        return LinkRow(record.from_id, record.to_id, record.link_type, record.weight)
    raise InvalidArchive(f"{where}: section {section!r} has no rows")  # pragma: no cover


def _unit_row(record: UnitRecord, dim: int, where: str) -> UnitRow:
    return UnitRow(
        id=record.id,
        document_id=record.document_id,
        chunk_id=record.chunk_id,
        text=record.text,
        index_text=record.index_text,
        fact_type=record.fact_type,
        context=record.context,
        occurred_start=_time(record.occurred_start, "occurred_start", where),
        occurred_end=_time(record.occurred_end, "occurred_end", where),
        mentioned_at=_time(record.mentioned_at, "mentioned_at", where),
        metadata=dict(record.metadata),
        tags=list(record.tags),
        created_at=_time(record.created_at, "created_at", where) or "",
        updated_at=_time(record.updated_at, "updated_at", where),
        token_count=record.token_count,
        consolidation_state=record.consolidation_state,
        source_ids=list(record.source_ids),
        proof_count=record.proof_count,
        history=[h.model_dump() for h in record.history],
        vector=decode_vector(record.vector, dim, where) if record.vector is not None else None,
    )


def _model_row(record: MentalModelRecord, dim: int, where: str) -> MentalModelRow:
    try:
        trigger = merge_trigger(None, record.trigger)  # the rule an API write meets
    except InvalidInput as exc:
        raise InvalidArchive(f"{where}: {exc.message}") from None
    versions = [h.version for h in record.history]
    if len(set(versions)) != len(versions):
        raise InvalidArchive(f"{where}: history holds a version twice")
    model = MentalModel(
        bank_ref="",
        id=record.id,
        name=record.name,
        source_query=record.source_query,
        content=record.content,
        tags=list(record.tags),
        max_tokens=record.max_tokens,
        trigger=trigger,
        parent_id=record.parent_id,
        is_page=record.is_page,
        reflect_response=dict(record.reflect_response) if record.reflect_response else None,
        embedding=decode_vector(record.vector, dim, where) if record.vector is not None else None,
        created_at=_time(record.created_at, "created_at", where) or "",
        updated_at=_time(record.updated_at, "updated_at", where) or "",
        last_refreshed_at=_time(record.last_refreshed_at, "last_refreshed_at", where),
        last_refresh_failed_at=_time(
            record.last_refresh_failed_at, "last_refresh_failed_at", where
        ),
    )
    history = [
        HistoryEntry(
            h.version,
            h.previous_content,
            _time(h.changed_at, "history.changed_at", where) or "",
            h.reason,
        )
        for h in sorted(record.history, key=lambda h: -h.version)
    ]
    return MentalModelRow(model, history)


def _epoch(value: str, field: str, where: str) -> float:
    text = _time(value, field, where)
    assert text is not None
    return datetime.fromisoformat(text).timestamp()


def _webhook_row(record: WebhookRecord, where: str) -> Webhook:
    config = record.http_config
    return Webhook(
        id=record.id,
        tenant="",
        bank_ref="",
        bank_id="",
        url=record.url,
        secret=record.secret,
        event_types=list(record.event_types),
        enabled=record.enabled,
        http_config=HttpConfig(
            method=config.method,
            timeout_seconds=config.timeout_seconds,
            headers=dict(config.headers),
            params=dict(config.params),
        ),
        created_at=_epoch(record.created_at, "created_at", where),
        updated_at=_epoch(record.updated_at, "updated_at", where),
    )
