"""Stats periods (``1d``, ``7d``, ``30d``), their time buckets, and ISO datetime filters.

A period covers the last day, week or month up to now, in UTC buckets of an hour (``1d``)
or a day (``7d``, ``30d``): the ``trunc`` the answer names. Hindsight buckets every period
by day; heed gives the one-day period hourly buckets, where a day bucket would say nothing.
Another period is a 400 naming it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Final

from pydantic import BeforeValidator, WithJsonSchema

from heed.errors import HeedError

__all__ = [
    "PERIODS",
    "BadFilter",
    "IsoDateTime",
    "Period",
    "instant",
    "iso",
    "period_of",
]

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


_ISO_DATE: Final = re.compile(r"\d{4}-\d{2}-\d{2}")


#: The longest ISO 8601 datetime text taken (``2026-01-31T12:00:00.123456+05:30`` is 32).
_ISO_MAX_CHARS: Final = 64


def _iso_text(value: Any) -> Any:
    """Only ISO 8601 text is a datetime here (pydantic alone also takes epoch numbers)."""
    if isinstance(value, str) and (len(value) > _ISO_MAX_CHARS or not _ISO_DATE.match(value)):
        raise ValueError("an ISO 8601 datetime, e.g. 2026-01-31T12:00:00Z")
    return value


IsoDateTime = Annotated[
    datetime,
    BeforeValidator(_iso_text),
    WithJsonSchema({"type": "string", "format": "date-time", "maxLength": _ISO_MAX_CHARS}),
]
"""A query parameter that is an ISO 8601 datetime (a 422 naming it otherwise)."""


def instant(moment: datetime | None) -> float | None:
    """*moment* as epoch seconds (UTC when it names no zone); ``None`` stays ``None``."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def iso(when: float | None) -> str | None:
    """Epoch seconds as an ISO 8601 UTC datetime (``None`` stays ``None``)."""
    return None if when is None else datetime.fromtimestamp(when, UTC).isoformat()
