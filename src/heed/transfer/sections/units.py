"""Section ``units``: the documents' memories, document after document in the order of
``documents``, each document's in its order (exactly ``unit_count`` for each). They are
checked and written with their documents (:mod:`heed.transfer.sections.documents`).

A memory's record is shared with ``observations``. Its keyword text travels
(``index_text``); where the store could not read it back (PostgreSQL keeps only a
``tsvector``) an export rebuilds it by the rule of retain and consolidation
(:func:`with_index_texts`, :mod:`heed.memory.retain.units`).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import Field

from heed.memory.models import CONSOLIDATION_STATES, FACT_TYPES
from heed.memory.retain.units import index_text, neighbour_texts, with_neighbours
from heed.transfer.records import (
    Count,
    Id,
    Record,
    Tags,
    decode_vector,
    encode_vector,
    utc_time,
    validate,
)
from heed.transfer.rows import UnitRow
from heed.transfer.sections.base import Checker, ExportContext, ImportContext, Section, pages

__all__ = ["SECTION", "UnitRecord", "decode", "encode", "with_index_texts"]


class HistoryRecord(Record):
    """An observation's earlier version (what consolidation writes)."""

    text: str
    proof_count: int | None = None
    changed_at: str | None = None
    reason: str | None = None
    state: str = "invalidated"


class UnitRecord(Record):
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


assert set(FACT_TYPES) == {"world", "experience", "observation"}
assert set(CONSOLIDATION_STATES) == {"pending", "done", "failed"}


def encode(unit: UnitRow) -> dict[str, Any]:
    # Written out, not by the record's fields: an export encodes every memory (a third
    # less time than fields_of).
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


def decode(value: dict[str, Any], dim: int, where: str) -> UnitRow:
    record = validate(UnitRecord, value, where)
    return UnitRow(
        id=record.id,
        document_id=record.document_id,
        chunk_id=record.chunk_id,
        text=record.text,
        index_text=record.index_text,
        fact_type=record.fact_type,
        context=record.context,
        occurred_start=utc_time(record.occurred_start, "occurred_start", where),
        occurred_end=utc_time(record.occurred_end, "occurred_end", where),
        mentioned_at=utc_time(record.mentioned_at, "mentioned_at", where),
        metadata=dict(record.metadata),
        tags=list(record.tags),
        created_at=utc_time(record.created_at, "created_at", where) or "",
        updated_at=utc_time(record.updated_at, "updated_at", where),
        token_count=record.token_count,
        consolidation_state=record.consolidation_state,
        source_ids=list(record.source_ids),
        proof_count=record.proof_count,
        history=[h.model_dump() for h in record.history],
        vector=decode_vector(record.vector, dim, where) if record.vector is not None else None,
    )


def when(value: str | None) -> datetime | None:
    """A row's time as a ``datetime`` (``None`` when absent or not one)."""
    if not value:
        return None
    with contextlib.suppress(ValueError):
        return datetime.fromisoformat(value)
    return None


def _rebuilt(units: list[UnitRow]) -> None:
    """Give *units* (one document's, in order, or observations) the keyword text retain
    and consolidation give (:mod:`heed.memory.retain.units`) where the store could not read
    it back: a document's units their text, context and date, and its verbatim units
    (those resting on no other) the neighbours among them; an observation its text."""
    verbatim = [u for u in units if u.document_id is not None and not u.source_ids]
    texts = [u.text for u in verbatim]
    position = {id(u): i for i, u in enumerate(verbatim)}
    for unit in units:
        if unit.index_text is not None:
            continue
        if unit.document_id is None:
            unit.index_text = index_text(unit.text, None, None)
            continue
        base = index_text(unit.text, unit.context, when(unit.mentioned_at))
        at = position.get(id(unit))
        unit.index_text = base if at is None else with_neighbours(base, neighbour_texts(texts, at))


def with_index_texts(units: Iterator[list[UnitRow]], size: int) -> Iterator[list[UnitRow]]:
    """Pages of *units*, each document's given its keyword text where missing
    (:func:`_rebuilt`, which needs a whole document: pages are regrouped by document)."""
    flat = (unit for page in units for unit in page)
    for _, group in itertools.groupby(flat, key=lambda u: u.document_id):
        mine = list(group)
        if any(u.index_text is None for u in mine):
            _rebuilt(mine)
        yield from pages(mine, size)


def read(ctx: ExportContext) -> Iterator[list[UnitRow]]:
    for page in with_index_texts(ctx.snapshot().units(ctx.batch), ctx.batch):
        yield page
        ctx.progress.add(len(page))


def write(ctx: ImportContext) -> dict[str, int]:
    """Written with their documents."""
    return {}


def check(checker: Checker) -> None:
    """Checked with their documents."""


SECTION = Section("units", 1, "data", encode, decode, read, write, check)
