"""Section ``mental_models`` (since version 2): mental models and knowledge pages (at most
:data:`~heed.mental_models.values.MAX_MENTAL_MODELS`), each with its history (newest
first) and its vector, with the same flags as the folders. Ids are kept; the knowledge
base's tree (folders and pages) is checked here, after the folders."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

from pydantic import Field

from heed.memory.models import InvalidInput
from heed.mental_models.values import (
    HISTORY_LIMIT,
    HistoryEntry,
    MentalModel,
    MentalModelRow,
    merge_trigger,
)
from heed.transfer.records import (
    NOT_BLANK,
    Id,
    InvalidArchive,
    Name,
    Record,
    ScopeTags,
    decode_vector,
    encode_vector,
    fields_of,
    utc_time,
    validate,
)
from heed.transfer.sections.base import (
    Checker,
    ExportContext,
    ImportContext,
    KnowledgeNode,
    Section,
    check_knowledge,
    pages,
)

__all__ = ["SECTION", "MentalModelRecord"]

#: Models read or written at once.
_PAGE = 32


class ModelHistoryRecord(Record):
    """An earlier content of a mental model."""

    version: Annotated[int, Field(ge=1, le=2**31 - 1)]
    previous_content: str
    changed_at: str
    reason: Annotated[str, Field(max_length=100)]


class MentalModelRecord(Record):
    """A mental model or knowledge-base page, with its history (newest first) and the
    vector it is ranked by."""

    id: Id
    name: Name
    source_query: Annotated[str, Field(min_length=1, pattern=NOT_BLANK)]
    content: str
    tags: ScopeTags
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


def encode(row: MentalModelRow) -> dict[str, Any]:
    return fields_of(
        row.model,
        MentalModelRecord,
        history=[fields_of(h, ModelHistoryRecord) for h in row.history],
        vector=encode_vector(row.model.embedding),
    )


def decode(value: dict[str, Any], dim: int, where: str) -> MentalModelRow:
    record = validate(MentalModelRecord, value, where)
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
        created_at=utc_time(record.created_at, "created_at", where) or "",
        updated_at=utc_time(record.updated_at, "updated_at", where) or "",
        last_refreshed_at=utc_time(record.last_refreshed_at, "last_refreshed_at", where),
        last_refresh_failed_at=utc_time(
            record.last_refresh_failed_at, "last_refresh_failed_at", where
        ),
    )
    history = [
        HistoryEntry(
            h.version,
            h.previous_content,
            utc_time(h.changed_at, "history.changed_at", where) or "",
            h.reason,
        )
        for h in sorted(record.history, key=lambda h: -h.version)
    ]
    return MentalModelRow(model, history)


def read(ctx: ExportContext) -> Iterator[list[MentalModelRow]]:
    store, ref = ctx.stores.knowledge, ctx.bank.ref
    if store is None:
        return
    for page in pages(store.mental_models(ref, with_embeddings=True), _PAGE):
        yield [MentalModelRow(m, store.mental_model_history(ref, m.id)) for m in page]


def write(ctx: ImportContext) -> dict[str, int]:
    store, ref = ctx.knowledge_store("mental_models"), ctx.staging.ref
    if store is None:
        return {}
    n = 0
    for page in pages(ctx.reader.rows("mental_models"), _PAGE):
        for row in page:
            row.model.bank_ref = ref
        n += store.write_knowledge_rows(ref, [], page)
    return {"mental_models": n}


def check(checker: Checker) -> None:
    checker.knowledge_nodes("mental_models", KnowledgeNode.of_model, "mental models")
    check_knowledge(checker.knowledge)


SECTION = Section("mental_models", 2, "knowledge", encode, decode, read, write, check)
