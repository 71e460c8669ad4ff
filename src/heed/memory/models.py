"""The memory engine's data: banks, items to retain, units, and recall requests/results.

Plain dataclasses, independent of the HTTP wire format (``heed.api.wire``
translates) and of storage (``heed.memory.store`` defines the interface).
Times are timezone-aware UTC ``datetime`` objects; ``None`` means unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal

from heed.errors import NUL, HeedError

__all__ = [
    "BUDGETS",
    "CONSOLIDATION_STATES",
    "DISPOSITION_DEFAULT",
    "DISPOSITION_TRAITS",
    "FACT_TYPES",
    "Bank",
    "BankStats",
    "Chunk",
    "Conflict",
    "DocumentInfo",
    "EntityRef",
    "InvalidInput",
    "NotFound",
    "PreparedDocument",
    "PreparedUnit",
    "RecallHit",
    "RecallOutcome",
    "RecallQuery",
    "RetainItem",
    "StoredUnit",
    "TagsMatch",
    "default_disposition",
    "refuse_nul",
]

#: The fact types heed stores. Retained text is "world" unless the item says otherwise;
#: extracted facts are "world" or "experience"; consolidation writes "observation"
#: (:mod:`heed.memory.learning.consolidation`).
FACT_TYPES: Final = ("world", "experience", "observation")
#: What ``consolidation_state`` a unit can have: waiting for consolidation, consolidated,
#: or given up on (the model's reply for it stayed malformed; ``recover`` sets it pending).
CONSOLIDATION_STATES: Final = ("pending", "done", "failed")

Budget = Literal["low", "mid", "high"]
BUDGETS: Final = ("low", "mid", "high")
TagsMatch = Literal["any", "all", "any_strict", "all_strict", "exact"]

#: A bank's disposition traits (1-5 each, a bank setting ``disposition_<trait>``), and the
#: value of a trait nobody set: the one place of both.
DISPOSITION_TRAITS: Final = ("skepticism", "literalism", "empathy")
DISPOSITION_DEFAULT: Final = 3


def default_disposition() -> dict[str, int]:
    """The disposition of a bank that sets none: every trait at :data:`DISPOSITION_DEFAULT`."""
    return dict.fromkeys(DISPOSITION_TRAITS, DISPOSITION_DEFAULT)


class InvalidInput(HeedError, ValueError):
    """The caller's input is wrong; the message names the problem (HTTP 400)."""

    status_code = 400


def refuse_nul(value: str | None, what: str) -> None:
    """The memory domain's NUL rule (see :class:`heed.errors.InvalidText`): an
    :class:`InvalidInput` naming the field *what*."""
    if value is not None and NUL in value:
        raise InvalidInput(f"{what} holds a NUL character (U+0000), which heed does not store")


class NotFound(HeedError, LookupError):
    """A bank, memory, document or operation does not exist for this tenant (HTTP 404)."""

    status_code = 404


class Conflict(HeedError, RuntimeError):
    """The request conflicts with work in progress, e.g. a bank being deleted (HTTP 409,
    ``Retry-After``)."""

    status_code = 409

    def __init__(self, message: str, *, retry_after: int = 1) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after)})


@dataclass(slots=True)
class Bank:
    """A memory bank of one tenant. ``config`` holds the retrieval switches."""

    tenant: str
    bank_id: str
    ref: str
    """Internal id (stable across renames; storage keys use it)."""
    name: str = ""
    mission: str = ""
    background: str | None = None
    disposition: dict[str, int] = field(default_factory=default_disposition)
    config: dict[str, Any] = field(default_factory=dict)
    created_at: str = ""
    updated_at: str = ""


@dataclass(slots=True)
class BankStats:
    """Counts for ``GET .../stats``."""

    units_by_type: dict[str, int]
    links_by_type: dict[str, int]
    documents: int
    last_write_at: str | None


@dataclass(slots=True)
class EntityRef:
    """An entity named in an item (given by the caller or extracted)."""

    name: str
    type: str | None = None


@dataclass(slots=True)
class RetainItem:
    """One item of a retain request, validated."""

    content: str
    timestamp: datetime | None = None
    timestamp_unset: bool = False
    context: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    document_id: str | None = None
    tags: list[str] = field(default_factory=list)
    entities: list[EntityRef] = field(default_factory=list)
    update_mode: Literal["replace", "append"] = "replace"
    fact_type: str = "world"


@dataclass(slots=True)
class PreparedUnit:
    """A memory unit ready to be written (its vector computed)."""

    id: str
    text: str
    index_text: str
    """What BM25 indexes: the text plus context, speaker and date words."""
    fact_type: str
    context: str | None
    chunk_index: int
    occurred_start: datetime | None
    occurred_end: datetime | None
    mentioned_at: datetime | None
    metadata: dict[str, str]
    tags: list[str]
    entities: list[EntityRef]
    embedding: Any = None  # np.ndarray (dim,), float32, unit length
    token_count: int | None = None
    source_ids: list[str] = field(default_factory=list)
    """The ids of the units this one rests on: an extracted fact's turns, an observation's
    facts (its provenance)."""
    consolidation_state: str | None = None
    """``pending`` when consolidation should take it (see :data:`CONSOLIDATION_STATES`)."""
    proof_count: int | None = None
    """An observation's: how many facts support it."""
    history: list[dict[str, Any]] | None = None
    """An observation's earlier versions, oldest first."""
    caused_by: list[str] = field(default_factory=list)
    """Ids of units of the same write that caused this one (``causal`` links)."""


@dataclass(slots=True)
class Chunk:
    """The raw text of one item, kept for the ``chunks`` enrichment."""

    id: str
    index: int
    text: str


@dataclass(slots=True)
class PreparedDocument:
    """Everything one document's retain writes, in one transaction."""

    document_id: str
    replace: bool
    original_text: str
    metadata: dict[str, Any]
    tags: list[str]
    chunks: list[Chunk]
    units: list[PreparedUnit]


def loose_units(units: list[PreparedUnit]) -> PreparedDocument:
    """*units* of no document (observations, a curated fact) as the document-shaped value
    the embedder and the vector index take."""
    return PreparedDocument(
        document_id="",
        replace=False,
        original_text="",
        metadata={},
        tags=[],
        chunks=[],
        units=units,
    )


@dataclass(slots=True)
class StoredUnit:
    """A memory unit as read back from storage."""

    id: str
    seq: int
    text: str
    fact_type: str
    context: str | None
    document_id: str | None
    chunk_id: str | None
    occurred_start: str | None
    occurred_end: str | None
    mentioned_at: str | None
    metadata: dict[str, str]
    tags: list[str]
    entities: list[str]
    created_at: str
    updated_at: str | None = None
    token_count: int | None = None
    source_ids: list[str] = field(default_factory=list)
    consolidation_state: str | None = None
    proof_count: int | None = None
    history: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True)
class DocumentInfo:
    """A stored document's metadata (and text when asked)."""

    document_id: str
    created_at: str
    updated_at: str
    unit_count: int
    text_length: int
    content_hash: str | None
    metadata: dict[str, Any]
    tags: list[str]
    original_text: str | None = None
    units_by_type: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class RecallQuery:
    """A validated recall request."""

    query: str
    types: list[str] | None = None
    budget: Budget = "mid"
    max_tokens: int = 4096
    trace: bool = False
    query_timestamp: datetime | None = None
    include_entities: bool = False
    max_entity_tokens: int = 500
    include_chunks: bool = False
    max_chunk_tokens: int = 8192
    include_source_facts: bool = False
    max_source_facts_tokens: int = 4096
    max_source_facts_tokens_per_observation: int | None = None
    tags: list[str] | None = None
    tags_match: TagsMatch = "any"
    min_semantic: float | None = None
    min_keyword: float | None = None
    min_final: float | None = None
    temporal_window: tuple[datetime, datetime] | None = None
    prefer_observations: bool | None = None
    """With observations among the types: drop a raw fact a returned observation rests on
    (``None``: the bank's ``recall_prefer_observations``,
    :mod:`heed.memory.bank_config.settings`)."""


@dataclass(slots=True)
class RecallHit:
    """One recalled unit with its per-stage scores."""

    unit: StoredUnit
    final: float
    semantic: float | None = None
    keyword: float | None = None
    reranker: float | None = None


@dataclass(slots=True)
class RecallOutcome:
    """What recall returns: hits in order, optional enrichment, optional trace."""

    hits: list[RecallHit]
    entities: dict[str, dict[str, Any]] | None = None
    chunks: dict[str, dict[str, Any]] | None = None
    source_facts: dict[str, RecallHit] | None = None
    trace: dict[str, Any] | None = None
