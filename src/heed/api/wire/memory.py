"""The memory API's JSON, shaped like Hindsight's so ``hindsight-client`` works unchanged.

Requests accept (and ignore) fields heed does not implement, unless ignoring
them would silently change results (``tag_groups``, attachments): those get a
400 naming the field; a bank body refuses every field that is not a setting heed honours
(:mod:`heed.memory.bank_config.settings`). Responses carry every field the client's models require.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from heed.api.input_rules import (
    JSON_INTEGER,
    MAX_ENTITIES,
    MAX_LIST_ITEMS,
    MAX_MESSAGES,
    MAX_RETAIN_ITEMS,
    Identifier,
    MetadataMap,
    Name,
    RequestBody,
    Tag,
    TagList,
    Text,
    TokenBudget,
)
from heed.api.wire.config import SettingsBody, setting_fields
from heed.memory.bank_config import settings as bank_config
from heed.memory.curation import MemoryEdit
from heed.memory.models import DISPOSITION_DEFAULT

__all__ = [
    "BankListItem",
    "BankListResponse",
    "BankProfileResponse",
    "BankStatsResponse",
    "BankWrite",
    "CancelOperationResponse",
    "ChunkOut",
    "DeleteDocumentResponse",
    "DeleteResponse",
    "Disposition",
    "DocumentListItem",
    "DocumentResponse",
    "EntityIn",
    "EntityObservation",
    "EntityState",
    "IncludeOptions",
    "ListDocumentsResponse",
    "ListMemoryUnitsResponse",
    "MemoryItemIn",
    "MemoryUnitItem",
    "OperationResponse",
    "OperationStatusResponse",
    "OperationsListResponse",
    "RecallRequest",
    "RecallResponse",
    "RecallResultOut",
    "RecallScores",
    "ReprocessDocumentResponse",
    "RetainRequest",
    "RetainResponse",
    "UpdateDocumentRequest",
    "UpdateDocumentResponse",
    "UpdateMemoryRequest",
    "deleted",
]


class _In(RequestBody):
    model_config = ConfigDict(populate_by_name=True)


# -- banks ------------------------------------------------------------------------------

Trait = Annotated[int, Field(ge=1, le=5), JSON_INTEGER]
"""A disposition trait, 1 to 5."""


class Disposition(RequestBody):
    """A bank's disposition traits, in a request (strict) and in responses."""

    skepticism: Trait = DISPOSITION_DEFAULT
    literalism: Trait = DISPOSITION_DEFAULT
    empathy: Trait = DISPOSITION_DEFAULT


ObservationScopes = bank_config.ObservationScopes
"""How consolidation scopes observations (:mod:`heed.memory.learning.scopes`): a mode, or tag lists
(fnmatch globs allowed)."""


class BankProfileWrite(SettingsBody):
    """The profile fields of a bank body; the settings are added from
    :data:`heed.memory.bank_config.settings.SETTINGS` (:class:`BankWrite`)."""

    model_config = ConfigDict(populate_by_name=True)

    name: Name | None = None
    mission: Text | None = None
    background: Text | None = None
    disposition: Disposition | None = None


if TYPE_CHECKING:
    BankWrite = BankProfileWrite
else:
    BankWrite = create_model(
        "BankWrite",
        __base__=BankProfileWrite,
        __doc__="PUT/PATCH body: Hindsight's CreateBankRequest. Its settings are the bank "
        "settings heed honours (also ``PATCH .../config``); any other field is a 400 naming "
        "it.",
        **setting_fields(),
    )


class MemoryTimeseriesBucket(BaseModel):
    """One bucket: its start (ISO-8601, UTC) and the memories per fact type in it."""

    time: str
    world: int = 0
    experience: int = 0
    observation: int = 0


class MemoriesTimeseriesResponse(BaseModel):
    """Hindsight's MemoriesTimeseriesResponse: every bucket of the period, oldest first."""

    bank_id: str
    period: str
    trunc: str
    time_field: str = "created_at"
    buckets: list[MemoryTimeseriesBucket]


class UpdateDispositionRequest(RequestBody):
    """``PUT .../profile`` body (Hindsight's UpdateDispositionRequest): the three traits."""

    disposition: Disposition


class BankProfileResponse(BaseModel):
    bank_id: str
    name: str
    disposition: Disposition
    mission: str
    background: str | None = None


class BankListItem(BaseModel):
    bank_id: str
    name: str | None = None
    disposition: Disposition
    mission: str | None = None
    created_at: str | None = None
    updated_at: str | None = None
    fact_count: int = 0
    display_alias: str | None = None
    matched_aliases: list[str] = Field(default_factory=list)


class BankListResponse(BaseModel):
    banks: list[BankListItem]
    total: int
    limit: int
    offset: int


class BankStatsResponse(BaseModel):
    bank_id: str
    total_nodes: int
    total_links: int
    total_documents: int
    nodes_by_fact_type: dict[str, int]
    links_by_link_type: dict[str, int]
    links_by_fact_type: dict[str, int]
    links_breakdown: dict[str, dict[str, int]]
    pending_operations: int
    failed_operations: int
    operations_by_status: dict[str, int] | None = None
    last_memory_write_at: str | None = None
    in_flight: int = 0
    #: heed's own: the bank's LLM tokens by kind of work (``by_kind``, over the kept 90
    #: days), and ``total``, ``last_hour``, ``last_24h`` sums (docs/observability.md).
    llm_usage: dict[str, Any] | None = None


class DeleteResponse(BaseModel):
    success: bool
    message: str | None = None
    deleted_count: int | None = None


def deleted(message: str, count: int) -> DeleteResponse:
    """A delete that succeeded: *message* says what went, *count* how many."""
    return DeleteResponse(success=True, message=message, deleted_count=count)


# -- retain -------------------------------------------------------------------------------


class EntityIn(_In):
    text: Name
    type: Tag | None = None


Message = Annotated[dict[str, Any], Field(max_length=MAX_LIST_ITEMS)]
"""One message of an item's conversation content (``role``, ``content``, ...)."""


class MemoryItemIn(_In):
    content: str | Annotated[list[Message], Field(max_length=MAX_MESSAGES)]
    timestamp: datetime | str | None = None
    context: Text | None = None
    metadata: MetadataMap | None = None
    document_id: Identifier | None = None
    entities: Annotated[list[EntityIn], Field(max_length=MAX_ENTITIES)] | None = None
    tags: TagList | None = None
    update_mode: Literal["replace", "append"] | None = None
    fact_type: Tag | None = None
    resolve_entities: bool | None = Field(
        default=None,
        description="heed matches entity names by their canonical form (case-folded, "
        "single-spaced) either way: true and false behave alike.",
    )
    # Hindsight's item options heed does not implement: refused by name when given a value.
    strategy: Any = None
    observation_scopes: Any = None


class RetainRequest(_In):
    items: Annotated[list[MemoryItemIn], Field(max_length=MAX_RETAIN_ITEMS)]
    async_: bool = Field(default=False, alias="async")
    document_tags: TagList | None = None
    operation_id: Identifier | None = None


class RetainExtraction(BaseModel):
    """What fact extraction did for a retain (heed's field; null when the bank does not
    extract): facts written, chunks read, chunks whose reply stayed malformed."""

    facts: int
    chunks: int
    failed_chunks: int


class RetainResponse(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    success: bool
    bank_id: str
    items_count: int
    async_: bool = Field(alias="async")
    operation_id: str | None = None
    operation_ids: list[str] | None = None
    units_count: int | None = None
    document_ids: list[str] | None = None
    extraction: RetainExtraction | None = None


# -- recall --------------------------------------------------------------------------------


class _MaxTokens(_In):
    max_tokens: TokenBudget | None = None


class SourceFactsIn(_MaxTokens):
    max_tokens_per_observation: Annotated[int, Field(ge=-1, le=10**6), JSON_INTEGER] | None = Field(
        default=None, description="Source-fact tokens per observation (-1: no limit)"
    )


class IncludeOptions(_In):
    entities: _MaxTokens | None = None
    chunks: _MaxTokens | None = None
    source_facts: SourceFactsIn | None = None


class TemporalWindowIn(_In):
    # JSON has no date-time type: a string is parsed (lax), anything else is refused.
    start: datetime = Field(strict=False)
    end: datetime = Field(strict=False)

    @field_validator("start", "end", mode="before")
    @classmethod
    def _a_string(cls, value: object) -> object:
        if not isinstance(value, str):
            raise ValueError("a date-time is an ISO 8601 string")
        return value


class MinScoresIn(_In):
    semantic: float | None = None
    keyword: float | None = None
    reranker: float | None = None
    final: float | None = None


class RecallRequest(_In):
    query: Text
    types: TagList | None = None
    budget: Literal["low", "mid", "high"] | None = None
    max_tokens: TokenBudget | None = 4096
    trace: bool | None = False
    query_timestamp: Tag | None = None
    include: IncludeOptions | None = None
    tags: TagList | None = None
    tags_match: Literal["any", "all", "any_strict", "all_strict", "exact"] | None = "any"
    tag_groups: Annotated[list[Any], Field(max_length=MAX_LIST_ITEMS)] | None = None
    min_scores: MinScoresIn | None = None
    temporal_window: TemporalWindowIn | None = None
    prefer_observations: bool | None = None


class RecallScores(BaseModel):
    final: float
    reranker: float | None = None
    semantic: float | None = None
    keyword: float | None = None


class RecallResultOut(BaseModel):
    id: str
    text: str
    type: str | None = None
    entities: list[str] | None = None
    context: str | None = None
    occurred_start: str | None = None
    occurred_end: str | None = None
    mentioned_at: str | None = None
    document_id: str | None = None
    metadata: dict[str, str] | None = None
    chunk_id: str | None = None
    tags: list[str] | None = None
    source_fact_ids: list[str] | None = None
    scores: RecallScores | None = None


class EntityObservation(BaseModel):
    text: str
    mentioned_at: str | None = None


class EntityState(BaseModel):
    entity_id: str
    canonical_name: str
    observations: list[EntityObservation]


class ChunkOut(BaseModel):
    id: str
    text: str
    chunk_index: int
    truncated: bool = False


class RecallResponse(BaseModel):
    results: list[RecallResultOut]
    trace: dict[str, Any] | None = None
    entities: dict[str, EntityState] | None = None
    chunks: dict[str, ChunkOut] | None = None
    source_facts: dict[str, RecallResultOut] | None = None


# -- memories and documents ----------------------------------------------------------------


class MemoryUnitItem(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    id: str
    text: str
    context: str = ""
    date: str = ""
    fact_type: str | None = None
    document_id: str | None = None
    mentioned_at: str | None = None
    occurred_start: str | None = None
    occurred_end: str | None = None
    entities: str = ""
    chunk_id: str | None = None
    proof_count: int = 1
    tags: list[str] | None = None
    metadata: dict[str, Any] | None = None
    state: str = "valid"
    updated_at: str | None = None
    source_memory_ids: list[str] | None = None
    consolidation_state: str | None = None


class MemoryHistoryEntry(BaseModel):
    text: str
    proof_count: int | None = None
    changed_at: str | None = None
    reason: str | None = None
    state: str = "invalidated"


class MemoryHistoryResponse(BaseModel):
    memory_id: str
    text: str
    history: list[MemoryHistoryEntry]


class UpdateDocumentRequest(_In):
    """A document's new tags (the complete set; ``[]`` clears them)."""

    tags: TagList | None = None
    observation_scopes: Any = Field(
        default=None, description="Not kept per document by heed: refused by name when given"
    )


class UpdateDocumentResponse(BaseModel):
    success: bool


class ReprocessDocumentResponse(BaseModel):
    success: bool
    operation_id: str
    items_count: int = Field(description="Items the operation retains (the document's text)")


class UpdateMemoryRequest(_In):
    """A fact's curation (``PATCH .../memories/{id}``): omit a field to leave it; for
    ``context`` and the dates ``""`` or ``null`` clears it."""

    text: Text | None = None
    context: Text | None = None
    occurred_start: Name | None = None
    occurred_end: Name | None = None
    mentioned_at: Name | None = None
    fact_type: Literal["world", "experience"] | None = None
    entities: Annotated[list[Name], Field(max_length=MAX_ENTITIES)] | None = None
    resolve_entities: bool = Field(
        default=True,
        description="heed matches entity names by their canonical form (case-folded, "
        "single-spaced) either way: a name matches an existing entity only when that form "
        "is the same, so true and false behave alike.",
    )
    state: Literal["valid", "invalidated"] | None = None
    reason: Text | None = None

    def edit(self) -> MemoryEdit:
        """The edit this body asks for: ``context`` and the dates given as ``null`` clear
        (``""``), as ``""`` does; an omitted field is left as it is."""
        sent = self.model_dump(include=self.model_fields_set)
        clearable: dict[str, Any] = {
            name: "" if name in sent and sent[name] is None else sent.get(name)
            for name in ("context", "occurred_start", "occurred_end", "mentioned_at")
        }
        kept = self.model_dump(include={"text", "fact_type", "entities", "state", "reason"})
        return MemoryEdit(**kept, **clearable)


class ConsolidationRequest(_In):
    observation_scopes: ObservationScopes | None = None


class ConsolidationResponse(BaseModel):
    operation_id: str
    deduplicated: bool = False


class RecoverConsolidationResponse(BaseModel):
    retried_count: int


class ClearObservationsResponse(BaseModel):
    deleted_count: int


class ListMemoryUnitsResponse(BaseModel):
    items: list[MemoryUnitItem]
    total: int
    limit: int
    offset: int


class DocumentListItem(BaseModel):
    id: str
    bank_id: str
    content_hash: str | None = None
    created_at: str
    updated_at: str
    text_length: int
    memory_unit_count: int
    document_metadata: dict[str, Any] | None = None
    tags: list[str] | None = None


class ListDocumentsResponse(BaseModel):
    items: list[DocumentListItem]
    total: int
    limit: int
    offset: int


class DocumentResponse(BaseModel):
    id: str
    bank_id: str
    original_text: str | None
    content_hash: str | None
    created_at: str
    updated_at: str
    memory_unit_count: int
    nodes_by_fact_type: dict[str, int] | None = None
    tags: list[str] | None = None
    document_metadata: dict[str, Any] | None = None


class DeleteDocumentResponse(BaseModel):
    success: bool
    message: str
    document_id: str
    memory_units_deleted: int


# -- operations ------------------------------------------------------------------------------


class OperationProgressOut(BaseModel):
    """Hindsight's ``OperationProgress``: the last progress a run reported; ``processed`` and
    ``total`` when the run knows them, its other counters in ``detail``."""

    stage: str
    at: str
    processed: int | None = None
    total: int | None = None
    detail: dict[str, int] | None = None


class OperationResponse(BaseModel):
    id: str
    task_type: str
    operation_id: str | None = None
    operation_type: str | None = None
    items_count: int
    document_id: str | None = None
    created_at: str
    updated_at: str | None = None
    status: str
    error_message: str | None
    progress: OperationProgressOut | None = None


class OperationsListResponse(BaseModel):
    bank_id: str
    total: int
    limit: int
    offset: int
    operations: list[OperationResponse]


class OperationStatusResponse(BaseModel):
    operation_id: str
    status: Literal["pending", "processing", "completed", "failed", "cancelled", "not_found"]
    operation_type: str | None = None
    id: str | None = None
    task_type: str | None = None
    created_at: str | None = None
    updated_at: str | None = None
    completed_at: str | None = None
    error_message: str | None = None
    progress: OperationProgressOut | None = None
    result_metadata: dict[str, Any] | None = None
    phase: str | None = None
    """heed's own run phase (queued, running, cancelling, ...), finer than ``status``."""


class RetryOperationResponse(BaseModel):
    """Hindsight's answer to a retry: ``operation_id`` is the new operation's."""

    success: bool
    message: str
    operation_id: str


class DeleteOperationResponse(BaseModel):
    """Hindsight's answer to deleting a finished operation: the id of the one removed."""

    success: bool
    message: str
    operation_id: str


class CancelOperationResponse(BaseModel):
    success: bool
    message: str
    operation_id: str
    status: str | None = None
