"""``from_row``: a dataclass from a row of either database, by column name."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

import pytest

from heed.storage.database import from_row


@dataclass
class _Thing:
    id: str
    count: int
    tags: list[str] = field(default_factory=list)


def _row(sql: str) -> sqlite3.Row:
    conn = sqlite3.connect(":memory:")
    conn.row_factory = sqlite3.Row
    row: sqlite3.Row = conn.execute(sql).fetchone()
    return row


def test_columns_fill_fields_of_the_same_name_and_values_override() -> None:
    row = _row("SELECT 'a' AS id, 3 AS count, 'x' AS unrelated")
    assert from_row(_Thing, row) == _Thing("a", 3)
    assert from_row(_Thing, row, count=4, tags=["t"]) == _Thing("a", 4, ["t"])


def test_a_field_the_row_lacks_and_no_value_gives_is_refused() -> None:
    with pytest.raises(TypeError):
        from_row(_Thing, _row("SELECT 'a' AS id"))


@dataclass
class _Timed:
    count: int
    at: float | None


def test_ints_and_floats_take_their_columns_as_numbers_and_keep_null() -> None:
    row = _row("SELECT 2.0 AS count, 5 AS at")
    timed = from_row(_Timed, row, ints=("count",), floats=("at",))
    assert timed == _Timed(2, 5.0)
    assert type(timed.count) is int and type(timed.at) is float
    assert from_row(_Timed, _row("SELECT 1 AS count, NULL AS at"), floats=("at",)).at is None
    # A value given outright wins over the conversion.
    assert from_row(_Timed, row, ints=("count",), count=7).count == 7
