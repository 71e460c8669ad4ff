"""The filter query parameters of the listing routes, each set as one dependency class.

- :class:`AuditQuery` (``GET .../audit-logs``): ``action``, ``transport``, ``start_date``,
  ``end_date``; :meth:`AuditQuery.where` is the :class:`~heed.observability.AuditFilter`;
- :class:`TraceQuery` (``GET .../llm-requests``): ``status``, ``operation``, ``scope``,
  ``call_type``, ``provider``, ``trace_id``, ``document_id``, ``memory_id``, ``group``,
  ``start_date``, ``end_date``; :meth:`TraceQuery.where` is the
  :class:`~heed.observability.TraceFilter` (refusing ``document_id`` / ``memory_id``);
- :class:`AuditStatsQuery` (``GET .../audit-logs/stats``): ``action``, ``period``;
- :class:`TraceStatsQuery` (``GET .../llm-requests/stats``): ``operation``, ``call_type``,
  ``period``; :meth:`TraceStatsQuery.where` is the :class:`~heed.observability.TraceFilter`;
- :class:`GraphQuery` (``GET .../graph``): ``type``, ``limit``, ``q``, ``tags``,
  ``tags_match``, ``document_id``, ``chunk_id``; :meth:`GraphQuery.where` is the
  :class:`~heed.memory.store.UnitFilter` of the graph's units;
- :class:`UnitQuery` (``GET .../memories/list``): ``type``, ``q``, ``document_id``,
  ``entity_id``, ``time_field``, ``start_date``, ``end_date``, ``consolidation_state``,
  ``state``, ``tags``, ``tags_match``; :meth:`UnitQuery.where` is the
  :class:`~heed.memory.store.UnitFilter`.

Each class but :class:`TraceQuery` is its own dependency (``Depends(AuditQuery)``):
FastAPI reads its fields as the route's query parameters (:func:`_trace_query` reads
:class:`TraceQuery`'s), documented as when the route declared them (same names,
types, defaults and order; a dependency's parameters follow the route's own). The classes
hold the values as sent: nothing is checked or refused until the route calls ``where``, so
a route refuses a filter at the point of its body it always did (after the request's 422s).

This module does not use postponed annotations: FastAPI reads a class dependency's
parameters from its ``__init__``, whose annotations must be evaluated objects.
"""

from dataclasses import dataclass, replace
from typing import Annotated, Literal, get_args

from fastapi import Depends

from heed.api.input_rules import Limit, QueryId, QueryText, TagsQuery
from heed.api.tag_query import TagsMatchQuery
from heed.memory.models import FACT_TYPES
from heed.memory.store import UnitFilter
from heed.memory.tags import check_tags_match
from heed.observability import AuditFilter, TraceFilter
from heed.observability.periods import BadFilter, IsoDateTime, instant

__all__ = [
    "AuditQuery",
    "AuditQueryDep",
    "AuditStatsQuery",
    "AuditStatsQueryDep",
    "CallType",
    "FactType",
    "GraphQuery",
    "GraphQueryDep",
    "StatsPeriod",
    "TimeField",
    "TraceQuery",
    "TraceQueryDep",
    "TraceStatsQuery",
    "TraceStatsQueryDep",
    "UnitQuery",
    "UnitQueryDep",
]

FactType = Literal["world", "experience", "observation"]
""":data:`heed.memory.models.FACT_TYPES` as a type, so the schema lists them."""
if get_args(FactType) != FACT_TYPES:  # pragma: no cover - a new fact type must be added here
    raise RuntimeError(f"FactType {get_args(FactType)} differs from FACT_TYPES {FACT_TYPES}")
TimeField = Literal["created_at", "updated_at", "mentioned_at", "occurred_start", "occurred_end"]
CallType = Literal["llm", "embedding", "rerank", "decision"]
"""Hindsight's call types; heed traces ``llm`` calls only."""
StatsPeriod = Literal["1d", "7d", "30d"]
"""A stats read's span: a day by hour, or 7 or 30 days by day."""


@dataclass(frozen=True, slots=True)
class AuditQuery:
    """The audit log listing's filters, as sent."""

    action: QueryId | None = None
    transport: QueryId | None = None
    start_date: IsoDateTime | None = None
    end_date: IsoDateTime | None = None

    def where(self) -> AuditFilter:
        """The entries these filters pass."""
        return AuditFilter(
            action=self.action,
            transport=self.transport,
            since=instant(self.start_date),
            until=instant(self.end_date),
        )


@dataclass(frozen=True, slots=True)
class TraceQuery:
    """The LLM request listing's filters (read by :func:`_trace_query`); ``group`` pages
    by run (``trace_id``); ``unlinked`` names ``document_id`` / ``memory_id`` when given."""

    filter: TraceFilter
    call_type: CallType | None
    group: bool
    unlinked: tuple[str, ...]

    def where(self) -> TraceFilter:
        """The traces these filters pass; :class:`BadFilter` (400) naming ``document_id``
        and / or ``memory_id`` when given: heed's traces are not linked to either."""
        if self.unlinked:
            raise BadFilter(
                f"{', '.join(self.unlinked)}: heed's LLM request traces are not linked to "
                "documents or memories; filter by trace_id (a run) instead"
            )
        return self.filter


def _trace_query(
    status: QueryId | None = None,
    operation: QueryId | None = None,
    scope: QueryId | None = None,
    call_type: CallType | None = None,
    provider: QueryId | None = None,
    trace_id: QueryId | None = None,
    document_id: QueryId | None = None,
    memory_id: QueryId | None = None,
    group: bool = False,
    start_date: IsoDateTime | None = None,
    end_date: IsoDateTime | None = None,
) -> TraceQuery:
    where = TraceFilter(
        status=status,
        operation=operation,
        scope=scope,
        provider=provider,
        trace_id=trace_id,
        since=instant(start_date),
        until=instant(end_date),
    )
    unlinked = tuple(n for n, v in (("document_id", document_id), ("memory_id", memory_id)) if v)
    return TraceQuery(where, call_type, group, unlinked)


@dataclass(frozen=True, slots=True)
class AuditStatsQuery:
    """The audit log stats' filter and span, as sent."""

    action: QueryId | None = None
    period: StatsPeriod | None = None


@dataclass(frozen=True, slots=True)
class TraceStatsQuery:
    """The LLM request stats' filters and span, as sent."""

    operation: QueryId | None = None
    call_type: CallType | None = None
    period: StatsPeriod | None = None

    def where(self) -> TraceFilter:
        """The traces counted (by ``operation``; ``call_type`` is the route's)."""
        return TraceFilter(operation=self.operation)


@dataclass(frozen=True, slots=True)
class GraphQuery:
    """The memory graph's filters and size (``limit``: its most units), as sent."""

    type: FactType | None = None
    limit: Limit = 1000
    q: QueryText | None = None
    tags: TagsQuery = None
    tags_match: TagsMatchQuery = "any"
    document_id: QueryId | None = None
    chunk_id: QueryId | None = None

    def where(self) -> UnitFilter:
        """The units these filters pass; an unknown ``tags_match`` is a 400 naming it."""
        return replace(_unit_filter(self), chunk_id=self.chunk_id)


@dataclass(frozen=True, slots=True)
class UnitQuery:
    """The memory listing's filters, as sent."""

    type: FactType | None = None
    q: QueryText | None = None
    document_id: QueryId | None = None
    entity_id: QueryId | None = None
    time_field: TimeField | None = None
    start_date: QueryId | None = None
    end_date: QueryId | None = None
    consolidation_state: Literal["pending", "done", "failed"] | None = None
    state: Literal["valid", "invalidated"] | None = None
    tags: TagsQuery = None
    tags_match: TagsMatchQuery = "any"

    def where(self) -> UnitFilter:
        """The units these filters pass (``time_field`` defaults to ``occurred_start`` when
        a date is given); an unknown ``tags_match`` is a 400 naming it."""
        dated = self.start_date or self.end_date
        return replace(
            _unit_filter(self),
            entity_id=self.entity_id,
            time_field=self.time_field or ("occurred_start" if dated else None),
            start=self.start_date,
            end=self.end_date,
            consolidation_state=self.consolidation_state,
        )


def _unit_filter(query: GraphQuery | UnitQuery) -> UnitFilter:
    """The filter of *query*'s ``type``, ``q``, ``document_id``, ``tags`` and ``tags_match``
    (checked first: an unknown one is a 400 naming it), the rest unset."""
    match = check_tags_match(query.tags_match)
    return UnitFilter(
        fact_type=query.type,
        document_id=query.document_id,
        search=query.q,
        tags=query.tags,
        tags_match=match,
    )


AuditQueryDep = Annotated[AuditQuery, Depends(AuditQuery)]
AuditStatsQueryDep = Annotated[AuditStatsQuery, Depends(AuditStatsQuery)]
TraceStatsQueryDep = Annotated[TraceStatsQuery, Depends(TraceStatsQuery)]
TraceQueryDep = Annotated[TraceQuery, Depends(_trace_query)]
UnitQueryDep = Annotated[UnitQuery, Depends(UnitQuery)]
GraphQueryDep = Annotated[GraphQuery, Depends(GraphQuery)]
