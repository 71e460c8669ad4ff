"""Stats periods (``1d``, ``7d``, ``30d``), their time buckets, and ISO datetime filters.

A period covers the last day, week or month up to now, in UTC buckets of an hour (``1d``)
or a day (``7d``, ``30d``): the ``trunc`` the answer names. Hindsight buckets every period
by day; heed gives the one-day period hourly buckets, where a day bucket would say nothing.
Another period is a 400 naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from heed.errors import HeedError

__all__ = ["PERIODS", "BadFilter", "Period", "iso", "parse_instant", "period_of"]

PERIODS: Final = {"1d": (1, "hour"), "7d": (7, "day"), "30d": (30, "day")}


class BadFilter(HeedError):
    """A query parameter heed cannot read: 400 naming it."""

    status_code = 400


@dataclass(frozen=True, slots=True)
class Period:
    """A stats period as of now: its name, bucket unit and start."""

    name: str
    trunc: str
    start: datetime

    def bucket(self, when: float) -> str:
        """The ISO start of the bucket holding epoch second *when*."""
        moment = datetime.fromtimestamp(when, UTC)
        if self.trunc == "hour":
            moment = moment.replace(minute=0, second=0, microsecond=0)
        else:
            moment = moment.replace(hour=0, minute=0, second=0, microsecond=0)
        return moment.isoformat()


def period_of(name: str | None, now: float) -> Period:
    """The period *name* (default ``7d``) ending at *now*; :class:`BadFilter` otherwise."""
    name = name or "7d"
    if name not in PERIODS:
        raise BadFilter(f"period must be one of {', '.join(PERIODS)}; got {name!r}")
    days, trunc = PERIODS[name]
    return Period(name, trunc, datetime.fromtimestamp(now, UTC) - timedelta(days=days))


def parse_instant(value: str | None, name: str) -> float | None:
    """The ISO datetime *value* as epoch seconds (UTC when it names no zone), ``None``
    for none; :class:`BadFilter` naming the parameter *name* when it is not one."""
    if value is None or value == "":
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise BadFilter(f"{name} must be an ISO 8601 datetime; got {value[:80]!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def iso(when: float | None) -> str | None:
    """Epoch seconds as an ISO 8601 UTC datetime (``None`` stays ``None``)."""
    return None if when is None else datetime.fromtimestamp(when, UTC).isoformat()
