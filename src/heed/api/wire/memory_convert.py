"""Conversions between the memory wire models and the engine's inputs and outputs.

Wire requests become engine inputs here, so validation messages name the offending
field (``items[3].timestamp``). The engine's errors (``InvalidInput`` 400, ``NotFound``
404, ``Conflict`` 409) are ``HeedError`` subclasses, answered by :mod:`heed.api.errors`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final

from heed.api.wire import memory as wire
from heed.api.wire.config import sent_settings
from heed.memory import InvalidInput
from heed.memory.bank_config import settings as bank_config
from heed.memory.curation.service import CurationResult
from heed.memory.dates import parse_timestamp
from heed.memory.models import (
    DISPOSITION_TRAITS,
    FACT_TYPES,
    Bank,
    EntityRef,
    RecallHit,
    RecallOutcome,
    RecallQuery,
    RetainItem,
    StoredUnit,
)

__all__ = [
    "profile_of",
    "recall_query",
    "recall_response",
    "retain_items",
    "unit_item",
]


def profile_of(bank: Bank) -> wire.BankProfileResponse:
    return wire.BankProfileResponse(
        bank_id=bank.bank_id,
        name=bank.name or bank.bank_id,
        disposition=wire.Disposition(**bank.disposition),
        mission=bank.mission,
        background=bank.background,
    )


def bank_fields(body: wire.BankWrite) -> dict[str, Any]:
    """Engine fields of a PUT/PATCH body (only what was sent). Its settings are checked by
    :func:`heed.memory.bank_config.settings.validate`: a field that is not a setting heed honours is
    a 400 naming it, and nothing is written."""
    changes = bank_config.validate(sent_settings(body), where="body")
    disposition: dict[str, int] = {}
    if body.disposition is not None:
        disposition.update(body.disposition.model_dump())
    for trait in DISPOSITION_TRAITS:
        value = changes.pop(f"disposition_{trait}", None)
        if value is not None:
            disposition[trait] = value
    reflect_mission = changes.pop("reflect_mission", None)
    return {
        "name": body.name,
        "mission": body.mission if body.mission is not None else reflect_mission,
        "background": body.background,
        "disposition": disposition,
        "config": changes,  # a null setting leaves the bank's own value as it is
    }


def _content(index: int, content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for j, block in enumerate(content):
        kind = block.get("type")
        if kind != "text" or not isinstance(block.get("text"), str):
            raise InvalidInput(
                f"items[{index}].content[{j}] is a {kind!r} block; heed retains text only"
            )
        texts.append(block["text"])
    return "\n".join(texts)


def _timestamp(index: int, value: datetime | str | None) -> tuple[datetime | None, bool]:
    if value is None:
        return None, False
    if isinstance(value, datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=UTC)
        return aware.astimezone(UTC), False
    if value.strip().lower() == "unset":
        return None, True
    try:
        return parse_timestamp(value), False
    except (ValueError, OverflowError) as exc:
        raise InvalidInput(f"items[{index}].timestamp: {exc}") from None


#: Retain item fields heed refuses when given a value, and why.
_ITEM_NOT_IMPLEMENTED: Final = {
    "strategy": "heed's retain splits and stores every item one way",
    "observation_scopes": "consolidation scopes a bank's facts by its "
    "default_observation_scopes setting (PATCH .../config), not per item",
}


def retain_items(body: wire.RetainRequest) -> list[RetainItem]:
    """Validated engine items of a retain request (400 naming the bad field)."""
    items: list[RetainItem] = []
    for i, raw in enumerate(body.items):
        timestamp, unset = _timestamp(i, raw.timestamp)
        for name, why in _ITEM_NOT_IMPLEMENTED.items():
            if getattr(raw, name) is not None:
                raise InvalidInput(f"items[{i}].{name} is not implemented by heed: {why}")
        fact_type = raw.fact_type or "world"
        if fact_type not in FACT_TYPES:
            raise InvalidInput(
                f"items[{i}].fact_type {fact_type!r} is unknown: use one of {', '.join(FACT_TYPES)}"
            )
        items.append(
            RetainItem(
                content=_content(i, raw.content),
                timestamp=timestamp,
                timestamp_unset=unset,
                context=raw.context,
                metadata=dict(raw.metadata or {}),
                document_id=raw.document_id,
                tags=list(raw.tags or []),
                entities=[EntityRef(e.text, e.type) for e in raw.entities or [] if e.text.strip()],
                update_mode=raw.update_mode or "replace",
                fact_type=fact_type,
            )
        )
    return items


def recall_query(body: wire.RecallRequest) -> RecallQuery:
    """A validated engine query (400 naming the bad field)."""
    if body.types is not None:
        unknown = [t for t in body.types if t not in FACT_TYPES]
        if unknown:
            raise InvalidInput(
                f"unknown fact type(s) {', '.join(map(repr, unknown))}: use {', '.join(FACT_TYPES)}"
            )
    if body.tag_groups:
        raise InvalidInput("tag_groups is not supported by heed; use tags and tags_match")
    anchor = None
    if body.query_timestamp:
        try:
            anchor = parse_timestamp(body.query_timestamp)
        except (ValueError, OverflowError) as exc:
            raise InvalidInput(f"query_timestamp: {exc}") from None
    include = body.include or wire.IncludeOptions()
    window = None
    if body.temporal_window is not None:
        start, end = body.temporal_window.start, body.temporal_window.end
        start = start if start.tzinfo else start.replace(tzinfo=UTC)
        end = end if end.tzinfo else end.replace(tzinfo=UTC)
        if end < start:
            raise InvalidInput("temporal_window.end is before temporal_window.start")
        window = (start, end)
    scores = body.min_scores or wire.MinScoresIn()
    return RecallQuery(
        query=body.query,
        types=body.types or None,
        budget=body.budget or "mid",
        max_tokens=body.max_tokens or 4096,
        trace=bool(body.trace),
        query_timestamp=anchor,
        include_entities=include.entities is not None,
        max_entity_tokens=(include.entities.max_tokens if include.entities else None) or 500,
        include_chunks=include.chunks is not None,
        max_chunk_tokens=(include.chunks.max_tokens if include.chunks else None) or 8192,
        include_source_facts=include.source_facts is not None,
        max_source_facts_tokens=(include.source_facts.max_tokens if include.source_facts else None)
        or 4096,
        max_source_facts_tokens_per_observation=_per_observation(include.source_facts),
        tags=body.tags,
        tags_match=body.tags_match or "any",
        min_semantic=scores.semantic,
        min_keyword=scores.keyword,
        min_final=scores.final if scores.final is not None else scores.reranker,
        temporal_window=window,
        prefer_observations=body.prefer_observations,
    )


def _per_observation(source_facts: wire.SourceFactsIn | None) -> int | None:
    """The per-observation source-fact budget (``None``: none; -1 means none too)."""
    if source_facts is None or source_facts.max_tokens_per_observation in (None, -1):
        return None
    return source_facts.max_tokens_per_observation


def _result(hit: RecallHit) -> dict[str, Any]:
    unit = hit.unit
    return {
        "id": unit.id,
        "text": unit.text,
        "type": unit.fact_type,
        "entities": unit.entities or None,
        "context": unit.context,
        "occurred_start": unit.occurred_start,
        "occurred_end": unit.occurred_end,
        "mentioned_at": unit.mentioned_at,
        "document_id": unit.document_id,
        "metadata": unit.metadata or None,
        "chunk_id": unit.chunk_id,
        "tags": unit.tags or None,
        "source_fact_ids": unit.source_ids or None,
        "scores": {
            "final": round(hit.final, 6),
            "reranker": hit.reranker,
            "semantic": hit.semantic,
            "keyword": hit.keyword,
        },
    }


def recall_response(outcome: RecallOutcome) -> dict[str, Any]:
    """The JSON of :class:`wire.RecallResponse`, built directly (recall is the hot path:
    validating dozens of result models cost more than the rest of the response)."""
    chunks = outcome.chunks
    return {
        "results": [_result(h) for h in outcome.hits],
        "trace": outcome.trace,
        "entities": outcome.entities,
        "chunks": (
            {k: {"truncated": False, **v} for k, v in chunks.items()}
            if chunks is not None
            else None
        ),
        "source_facts": (
            {k: _result(h) for k, h in outcome.source_facts.items()}
            if outcome.source_facts is not None
            else None
        ),
    }


def curated_item(found: CurationResult) -> wire.MemoryUnitItem:
    """A memory, live or invalidated, with its ``state``."""
    item = unit_item(found.unit)
    item.state = "invalidated" if found.invalidated else "valid"
    return item


def unit_item(unit: StoredUnit) -> wire.MemoryUnitItem:
    return wire.MemoryUnitItem(
        id=unit.id,
        text=unit.text,
        context=unit.context or "",
        date=unit.occurred_start or unit.mentioned_at or "",
        fact_type=unit.fact_type,
        document_id=unit.document_id,
        mentioned_at=unit.mentioned_at,
        occurred_start=unit.occurred_start,
        occurred_end=unit.occurred_end,
        entities=", ".join(unit.entities),
        chunk_id=unit.chunk_id,
        tags=unit.tags,
        metadata=unit.metadata,
        updated_at=unit.updated_at,
        proof_count=unit.proof_count or 1,
        source_memory_ids=unit.source_ids or None,
        consolidation_state=unit.consolidation_state,
    )
