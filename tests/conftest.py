"""Shared fixtures. Servers in tests are real: uvicorn on a loopback port."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from heed.settings import Settings
from heed.storage import SqlDatabase, SqliteDatabase
from tests.pg_support import fresh_schema


@pytest.fixture
def make_settings(tmp_path: Path) -> Callable[..., Settings]:
    """Settings with a private data dir; keyword arguments override fields."""

    def make(**overrides: object) -> Settings:
        values: dict[str, object] = {"data_dir": tmp_path / "data"}
        values.update(overrides)
        return Settings(**values)  # type: ignore[arg-type]

    return make


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Iterator[Settings]:
    yield make_settings()


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlDatabase]:
    """Each SQL backend in turn: the embedded file, then a fresh PostgreSQL schema."""
    database: SqlDatabase
    if request.param == "sqlite":
        database = SqliteDatabase(tmp_path / "heed.db")
        yield database
        database.close()
        return
    from heed.storage.postgres import PostgresDatabase

    with fresh_schema() as url:
        database = PostgresDatabase(url, pool_size=8)
        try:
            yield database
        finally:
            database.close()
