"""Shared fixtures. Servers in tests are real: uvicorn on a loopback port."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from heed.settings import Settings


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
