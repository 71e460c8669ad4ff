"""Banks: ``/v1/default/banks[/{bank_id}[/stats|/profile]]`` (tenant-scoped); ``PUT .../profile``
sets the disposition."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Query

from heed.api.deps import AliasesDep, MemoryDep, ObservabilityDep, RetainOperationsDep
from heed.api.input_rules import MAX_ID_CHARS, IdPath, QueryText
from heed.api.openapi import CONFLICT
from heed.api.paging import PageDep
from heed.api.policies import continue_on_disconnect
from heed.api.routing import HeedRoute
from heed.api.wire import memory as wire
from heed.api.wire.memory_convert import bank_fields, profile_of
from heed.memory.engine import BANK_ID_RE

router = APIRouter(prefix="/v1/default/banks", tags=["banks"], route_class=HeedRoute)

NewBankId = Annotated[
    str,
    Path(
        min_length=1,
        max_length=MAX_ID_CHARS,
        pattern=BANK_ID_RE.pattern,
        description="1-128 letters, digits, '.', '_', ':', '@' or '-', starting with a letter "
        "or digit.",
    ),
]
"""The id of a bank being created or changed: the engine's own rule, in the schema."""
BankSearch = Annotated[
    QueryText | None,
    Query(description="Case-insensitive substring of the bank's id, name or an alias"),
]
"""The bank list's ``q``: which banks to list by their id, name or aliases."""


@router.get("")
async def list_banks(
    engine: MemoryDep,
    aliases: AliasesDep,
    page: PageDep,
    q: BankSearch = None,
) -> wire.BankListResponse:
    """The caller's banks with their unit counts (those *q* matches, when given), each with
    the alias it is shown under and, when only an alias matched *q*, those aliases."""
    rows, total = await engine.list_banks(page.limit, page.offset, q or None)
    shown, matched = await aliases.display([bank for bank, _ in rows], q)
    return wire.BankListResponse(
        banks=[
            wire.BankListItem(
                bank_id=bank.bank_id,
                name=bank.name,
                disposition=wire.Disposition(**bank.disposition),
                mission=bank.mission,
                created_at=bank.created_at,
                updated_at=bank.updated_at,
                fact_count=count,
                display_alias=shown.get(bank.ref),
                matched_aliases=matched.get(bank.ref, []),
            )
            for bank, count in rows
        ],
        total=total,
        limit=page.limit,
        offset=page.offset,
    )


@router.put("/{bank_id}", responses=CONFLICT)
async def create_or_update_bank(
    bank_id: NewBankId, engine: MemoryDep, body: wire.BankWrite | None = None
) -> wire.BankProfileResponse:
    """Create the bank, or update the fields sent."""
    bank = await engine.put_bank(bank_id, bank_fields(body or wire.BankWrite()))
    return profile_of(bank)


@router.patch("/{bank_id}", responses=CONFLICT)
async def update_bank(
    bank_id: NewBankId, engine: MemoryDep, body: wire.BankWrite | None = None
) -> wire.BankProfileResponse:
    """Update an existing bank (404 when it does not exist)."""
    bank = await engine.put_bank(bank_id, bank_fields(body or wire.BankWrite()), create=False)
    return profile_of(bank)


@router.get("/{bank_id}")
async def get_bank(bank_id: IdPath, engine: MemoryDep) -> wire.BankProfileResponse:
    """The bank's profile."""
    return profile_of(await engine.get_bank(bank_id))


@router.get("/{bank_id}/profile")
async def get_bank_profile(bank_id: IdPath, engine: MemoryDep) -> wire.BankProfileResponse:
    """The bank's profile (Hindsight's path)."""
    return profile_of(await engine.get_bank(bank_id))


@router.get("/{bank_id}/stats/memories-timeseries")
async def memories_timeseries(
    bank_id: IdPath,
    engine: MemoryDep,
    period: Annotated[
        Literal["1h", "12h", "1d", "7d", "30d", "90d"] | None,
        Query(description="1h, 12h, 1d, 7d (default), 30d or 90d"),
    ] = None,
    time_field: Annotated[
        str | None,
        Query(
            max_length=32,
            description="created_at (default: when stored), mentioned_at or occurred_start "
            "(event time, created_at where a memory has none); anything else is created_at",
        ),
    ] = None,
) -> wire.MemoriesTimeseriesResponse:
    """The bank's memories per time bucket of *period* (minutes for 1h, hours for 12h and
    1d, days beyond), by fact type; every bucket is listed, empty ones too (an unknown
    period is a 422 naming the ones there are)."""
    bank, series = await engine.memories_timeseries(bank_id, period, time_field)
    return wire.MemoriesTimeseriesResponse(
        bank_id=bank.bank_id,
        period=series.period,
        trunc=series.trunc,
        time_field=series.time_field,
        buckets=[wire.MemoryTimeseriesBucket(time=b.time, **b.counts) for b in series.buckets],
    )


@router.put("/{bank_id}/profile", responses=CONFLICT)
async def update_bank_profile(
    bank_id: NewBankId, engine: MemoryDep, body: wire.UpdateDispositionRequest
) -> wire.BankProfileResponse:
    """Set the bank's disposition traits (Hindsight's path; the same update as ``PATCH`` with
    a ``disposition``, or ``PATCH .../config`` with ``disposition_*``); 404 when the bank
    does not exist."""
    fields = bank_fields(wire.BankWrite(disposition=body.disposition))
    return profile_of(await engine.put_bank(bank_id, fields, create=False))


@router.delete("/{bank_id}", dependencies=[Depends(continue_on_disconnect)])
async def delete_bank(bank_id: IdPath, engine: MemoryDep) -> wire.DeleteResponse:
    """Cancel the bank's in-flight work, wait until it stopped, then delete everything.

    A delete, once asked, finishes even if the client leaves: stopping half-way would
    leave a bank whose work was cancelled but whose data is still there.
    """
    deleted = await engine.delete_bank(bank_id)
    return wire.deleted(f"bank {bank_id!r} deleted", deleted)


@router.get("/{bank_id}/stats")
async def bank_stats(
    bank_id: IdPath,
    engine: MemoryDep,
    operations: RetainOperationsDep,
    observability: ObservabilityDep,
) -> wire.BankStatsResponse:
    """Counts of units, links, documents and operations, and the bank's LLM tokens."""
    bank, stats = await engine.bank_stats(bank_id)
    by_status = await operations.counts(bank)
    usage = await observability.usage(bank.tenant, bank.bank_id)
    return wire.BankStatsResponse(
        bank_id=bank.bank_id,
        total_nodes=sum(stats.units_by_type.values()),
        total_links=sum(stats.links_by_type.values()),
        total_documents=stats.documents,
        nodes_by_fact_type=stats.units_by_type,
        links_by_link_type=stats.links_by_type,
        links_by_fact_type={},
        links_breakdown={},
        pending_operations=by_status.get("pending", 0) + by_status.get("processing", 0),
        failed_operations=by_status.get("failed", 0),
        operations_by_status=by_status,
        last_memory_write_at=stats.last_write_at,
        in_flight=engine.in_flight(bank),
        llm_usage=usage,
    )
