"""A bank's memories per time bucket (Hindsight's ``GET .../stats/memories-timeseries``).

A period (:data:`PERIODS`: ``1h`` ... ``90d``) is cut into buckets of one granularity
(``minute``, ``hour`` or ``day``), ending with the bucket holding now; each bucket counts the
bank's units by fact type (``world``, ``experience``, ``observation``) whose time falls in
it. The time is ``created_at`` (when heed stored the unit), or with *time_field*
``mentioned_at`` / ``occurred_start`` (event time, ``created_at`` where a unit has none);
any other value is ``created_at``. Every bucket of the period is returned, empty ones too.

Stored times are ISO-8601 text in UTC, so a bucket is a prefix of that text (the store
groups by it: :meth:`heed.memory.store.MemoryStore.units_per_time_prefix`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from heed.memory.models import InvalidInput

__all__ = [
    "DEFAULT_PERIOD",
    "FACT_TYPES",
    "PERIODS",
    "PREFIX_CHARS",
    "TIME_FIELDS",
    "Bucket",
    "Timeseries",
    "bucket_starts",
    "buckets_of",
    "check_period",
    "count_timeseries",
    "time_field_of",
]

#: Each period: how long, and the granularity of its buckets.
PERIODS: Final[dict[str, tuple[timedelta, str]]] = {
    "1h": (timedelta(hours=1), "minute"),
    "12h": (timedelta(hours=12), "hour"),
    "1d": (timedelta(days=1), "hour"),
    "7d": (timedelta(days=7), "day"),
    "30d": (timedelta(days=30), "day"),
    "90d": (timedelta(days=90), "day"),
}
DEFAULT_PERIOD: Final = "7d"
#: The columns a unit's time may be read from; anything else reads ``created_at``.
TIME_FIELDS: Final = ("created_at", "mentioned_at", "occurred_start")
FACT_TYPES: Final = ("world", "experience", "observation")

_STEP: Final = {
    "minute": timedelta(minutes=1),
    "hour": timedelta(hours=1),
    "day": timedelta(days=1),
}
#: How many characters of an ISO-8601 time name its bucket ("2026-01-02T03:04").
PREFIX_CHARS: Final = {"minute": 16, "hour": 13, "day": 10}


@dataclass(frozen=True, slots=True)
class Bucket:
    """One bucket: its start (ISO-8601, UTC) and the units per fact type in it."""

    time: str
    counts: dict[str, int]


@dataclass(frozen=True, slots=True)
class Timeseries:
    """A period's buckets, oldest first."""

    period: str
    trunc: str
    time_field: str
    buckets: list[Bucket]


def time_field_of(value: str | None) -> str:
    """The column *value* names, or ``created_at`` (unset or unknown: Hindsight's rule)."""
    return value if value in TIME_FIELDS else "created_at"


def _floor(moment: datetime, trunc: str) -> datetime:
    moment = moment.astimezone(UTC).replace(second=0, microsecond=0)
    if trunc in ("hour", "day"):
        moment = moment.replace(minute=0)
    if trunc == "day":
        moment = moment.replace(hour=0)
    return moment


def bucket_starts(period: str, now: datetime) -> tuple[str, list[datetime]]:
    """The granularity of *period* and the start of each of its buckets, oldest first (the
    last one holds *now*). ``KeyError`` for an unknown period."""
    length, trunc = PERIODS[period]
    step = _STEP[trunc]
    last = _floor(now, trunc)
    first = _floor(now - length, trunc) + step
    starts = []
    moment = first
    while moment <= last:
        starts.append(moment)
        moment += step
    return trunc, starts


def buckets_of(
    starts: list[datetime], trunc: str, counted: list[tuple[str, str, int]]
) -> list[Bucket]:
    """Every bucket of *starts*, with the ``(time prefix, fact type, count)`` rows counted
    into theirs (rows outside the buckets, or of other fact types, are left out)."""
    chars = PREFIX_CHARS[trunc]
    by_prefix = {start.isoformat()[:chars]: {t: 0 for t in FACT_TYPES} for start in starts}
    for prefix, fact_type, count in counted:
        counts = by_prefix.get(prefix)
        if counts is not None and fact_type in counts:
            counts[fact_type] += count
    return [
        Bucket(time=start.isoformat(), counts=by_prefix[start.isoformat()[:chars]])
        for start in starts
    ]


def check_period(period: str | None) -> str:
    """*period*, or :data:`DEFAULT_PERIOD` when unset; :class:`InvalidInput` (400) naming an
    unknown one."""
    period = period or DEFAULT_PERIOD
    if period not in PERIODS:
        raise InvalidInput(f"period must be one of {', '.join(PERIODS)}, got {period!r}")
    return period


def count_timeseries(
    period: str, time_field: str | None, count: Callable[..., list[tuple[str, str, int]]]
) -> Timeseries:
    """The buckets of *period* (checked) up to now, counted by *count* (a bank's
    :meth:`~heed.memory.store.MemoryStore.units_per_time_prefix`). Blocking."""
    field = time_field_of(time_field)
    trunc, starts = bucket_starts(period, datetime.now(UTC))
    chars = PREFIX_CHARS[trunc]
    counted = count(time_field=field, chars=chars, since=starts[0].isoformat()[:chars])
    return Timeseries(period, trunc, field, buckets_of(starts, trunc, counted))
