"""Offline date parsing: absolute and relative dates in text, resolved against an anchor.

:func:`find_dates` returns the date ranges a text mentions. Absolute dates
("8 May 2023", "May 8, 2023", "2023-05-08", "May 2023", "in 2022") stand on
their own; relative ones ("yesterday", "last week", "3 days ago", "next
month", "last Saturday") are resolved against *anchor* (the item's timestamp
at retain, the query timestamp or now at recall). No network, no model.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

__all__ = ["DateRange", "find_dates", "parse_timestamp"]

_MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_name) if name} | {
    name.lower(): i for i, name in enumerate(calendar.month_abbr) if name
}
_MONTHS["sept"] = 9
_WEEKDAYS = {name.lower(): i for i, name in enumerate(calendar.day_name)}
_NUMBERS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
    "seven": 7, "eight": 8, "nine": 9, "ten": 10, "couple of": 2, "few": 3,
}  # fmt: skip

_MONTH_RE = (
    r"(?P<month>jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sept?(?:ember)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
_DAY_RE = r"(?P<day>[0-3]?\d)(?:st|nd|rd|th)?"
_YEAR_RE = r"(?P<year>(?:19|20)\d\d)"
_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("iso", re.compile(r"\b(?P<year>(?:19|20)\d\d)-(?P<m>[01]\d)-(?P<day>[0-3]\d)\b")),
    ("dmy", re.compile(rf"\b{_DAY_RE}\s+(?:of\s+)?{_MONTH_RE}\.?,?\s+{_YEAR_RE}\b", re.I)),
    ("mdy", re.compile(rf"\b{_MONTH_RE}\.?\s+{_DAY_RE},?\s+{_YEAR_RE}\b", re.I)),
    ("my", re.compile(rf"\b{_MONTH_RE}\.?,?\s+{_YEAR_RE}\b", re.I)),
    ("dm", re.compile(rf"\b{_DAY_RE}\s+(?:of\s+)?{_MONTH_RE}\b", re.I)),
    ("md", re.compile(rf"\b{_MONTH_RE}\s+{_DAY_RE}\b", re.I)),
    ("y", re.compile(r"\b(?:in|of|since|during|year)\s+(?P<year>(?:19|20)\d\d)\b", re.I)),
    ("rel_day", re.compile(r"\b(?P<w>yesterday|today|tonight|tomorrow)\b", re.I)),
    (
        "ago",
        re.compile(
            r"\b(?P<n>\d+|a|an|one|two|three|four|five|six|seven|eight|nine|ten|couple of|few)"
            r"\s+(?P<unit>day|week|month|year)s?\s+ago\b",
            re.I,
        ),
    ),
    (
        "lastnext",
        re.compile(r"\b(?P<dir>last|next|this|past)\s+(?P<unit>week|month|year|weekend)\b", re.I),
    ),
    (
        "weekday",
        re.compile(
            r"\b(?P<dir>last|next|this|on)\s+(?P<wd>monday|tuesday|wednesday|thursday|friday|"
            r"saturday|sunday)\b",
            re.I,
        ),
    ),
]


@dataclass(frozen=True, slots=True)
class DateRange:
    """An inclusive range of instants (UTC), and the text it came from."""

    start: datetime
    end: datetime
    text: str


def _day_range(d: date, text: str, days: int = 1) -> DateRange:
    start = datetime.combine(d, time.min, tzinfo=UTC)
    return DateRange(start, start + timedelta(days=days) - timedelta(microseconds=1), text)


def _month_range(year: int, month: int, text: str) -> DateRange:
    last = calendar.monthrange(year, month)[1]
    start = datetime(year, month, 1, tzinfo=UTC)
    end = datetime(year, month, last, 23, 59, 59, 999999, tzinfo=UTC)
    return DateRange(start, end, text)


def _year_range(year: int, text: str) -> DateRange:
    return DateRange(
        datetime(year, 1, 1, tzinfo=UTC),
        datetime(year, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        text,
    )


def _shift_months(d: date, months: int) -> date:
    total = d.year * 12 + d.month - 1 + months
    year, month = divmod(total, 12)
    return date(year, month + 1, min(d.day, calendar.monthrange(year, month + 1)[1]))


def _safe_date(year: int, month: int, day: int) -> date | None:
    try:
        return date(year, month, day)
    except ValueError:
        return None


def _resolve(kind: str, m: re.Match[str], anchor: date | None) -> DateRange | None:
    text = m.group(0)
    g = m.groupdict()
    if kind == "iso":
        d = _safe_date(int(g["year"]), int(g["m"]), int(g["day"]))
        return _day_range(d, text) if d else None
    if kind in ("dmy", "mdy"):
        d = _safe_date(int(g["year"]), _MONTHS[g["month"].lower()], int(g["day"]))
        return _day_range(d, text) if d else None
    if kind == "my":
        return _month_range(int(g["year"]), _MONTHS[g["month"].lower()], text)
    if kind == "y":
        return _year_range(int(g["year"]), text)
    if anchor is None:
        return None
    if kind in ("dm", "md"):
        d = _safe_date(anchor.year, _MONTHS[g["month"].lower()], int(g["day"]))
        return _day_range(d, text) if d else None
    if kind == "rel_day":
        offset = {"yesterday": -1, "today": 0, "tonight": 0, "tomorrow": 1}[g["w"].lower()]
        return _day_range(anchor + timedelta(days=offset), text)
    if kind == "ago":
        raw = g["n"].lower()
        n = int(raw) if raw.isdigit() else _NUMBERS.get(raw, 1)
        unit = g["unit"].lower()
        if unit == "day":
            return _day_range(anchor - timedelta(days=n), text)
        if unit == "week":
            start = anchor - timedelta(days=7 * n)
            return _day_range(start - timedelta(days=start.weekday()), text, days=7)
        if unit == "month":
            d = _shift_months(anchor, -n)
            return _month_range(d.year, d.month, text)
        return _year_range(anchor.year - n, text)
    if kind == "lastnext":
        direction = {"last": -1, "past": -1, "next": 1, "this": 0}[g["dir"].lower()]
        unit = g["unit"].lower()
        if unit in ("week", "weekend"):
            monday = anchor - timedelta(days=anchor.weekday()) + timedelta(days=7 * direction)
            if unit == "weekend":
                return _day_range(monday + timedelta(days=5), text, days=2)
            return _day_range(monday, text, days=7)
        if unit == "month":
            d = _shift_months(anchor, direction)
            return _month_range(d.year, d.month, text)
        return _year_range(anchor.year + direction, text)
    if kind == "weekday":
        target = _WEEKDAYS[g["wd"].lower()]
        which = g["dir"].lower()
        delta = target - anchor.weekday()
        if which == "last":
            delta = delta - 7 if delta >= 0 else delta
        elif which == "next":
            delta = delta + 7 if delta <= 0 else delta
        elif which == "on" and delta > 0:
            delta -= 7  # "on Saturday" in a past-tense account: the most recent one
        return _day_range(anchor + timedelta(days=delta), text)
    return None


def find_dates(text: str, anchor: datetime | None) -> list[DateRange]:
    """The date ranges *text* mentions, in order of appearance; overlapping matches dropped.

    Relative expressions need *anchor*; without it only absolute dates are found.
    """
    anchor_day = anchor.astimezone(UTC).date() if anchor is not None else None
    taken: list[tuple[int, int]] = []
    found: list[tuple[int, DateRange]] = []
    for kind, pattern in _PATTERNS:
        for m in pattern.finditer(text):
            span = m.span()
            if any(span[0] < end and start < span[1] for start, end in taken):
                continue
            if kind == "md" and g_is_may_verb(m):
                continue
            resolved = _resolve(kind, m, anchor_day)
            if resolved is not None:
                taken.append(span)
                found.append((span[0], resolved))
    return [r for _, r in sorted(found, key=lambda pair: pair[0])]


def g_is_may_verb(m: re.Match[str]) -> bool:
    """ "may 5" in "you may 5..." is rarely a date; require a capital M for May."""
    month = m.group("month")
    return month.lower() == "may" and month[0] == "m"


def parse_timestamp(value: str) -> datetime:
    """Parse an ISO 8601 (or similar) timestamp; naive values are taken as UTC.

    Raises ``ValueError`` naming the value when it cannot be parsed.
    """
    text = value.strip()
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        from dateutil import parser as date_parser

        try:
            parsed = date_parser.parse(text)
        except (ValueError, OverflowError) as exc:
            raise ValueError(f"invalid timestamp {value!r}: expected ISO 8601") from exc
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)
