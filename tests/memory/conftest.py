"""Fixtures for memory tests: a real server (uvicorn on loopback) and engines with hooks.

The MiniLM embedder is process-wide (``heed.memory.shared_minilm``), so every
server and engine of the test session shares one loaded model.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hindsight_client import Hindsight

from heed.api.app import create_app
from heed.memory import MemoryEngine, build_memory_engine
from heed.runtime import current_context
from heed.services import build_lanes
from heed.settings import Settings
from heed.storage import SqliteDatabase
from heed.storage.memory import SqlMemoryStore
from tests.support import LiveServer, live_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One server per test module, with its own data dir."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("memory-server"))
    with live_server(create_app(settings)) as srv:
        yield srv


@pytest.fixture
async def client(server: LiveServer) -> AsyncIterator[Hindsight]:
    c = Hindsight(base_url=server.url, timeout=30)
    try:
        yield c
    finally:
        await c.aclose()


@pytest.fixture
def bank_id() -> str:
    return "bank-" + uuid.uuid4().hex[:10]


def make_engine(tmp_path: Path, **overrides: Any) -> MemoryEngine:
    """An engine on a private database (lanes sized by *overrides*)."""
    settings = Settings(data_dir=tmp_path, **overrides)
    store = SqlMemoryStore(SqliteDatabase(tmp_path / "engine.db"))
    store.migrate()
    return build_memory_engine(settings, store, build_lanes(settings))


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[MemoryEngine]:
    eng = make_engine(tmp_path, recall_concurrency=1, recall_queue=4)
    yield eng


class StageGate:
    """A recall hook that holds one stage open until the request is cancelled.

    Runs in the worker thread. ``stubborn`` seconds of extra work after the
    cancel simulate a stage between two token checks.
    """

    def __init__(self, stage: str, stubborn: float = 0.0) -> None:
        self.stage = stage
        self.stubborn = stubborn
        self.calls: dict[str, int] = {}
        self.entered = threading.Event()
        self.cancel_seen_at: float | None = None
        self.left_at: float | None = None
        self.reason: str | None = None

    def __call__(self, stage: str) -> None:
        self.calls[stage] = self.calls.get(stage, 0) + 1
        if stage != self.stage or self.entered.is_set():
            return
        self.entered.set()
        token = current_context().token
        token.wait_sync(10.0)
        self.cancel_seen_at = time.monotonic()
        self.reason = token.reason
        end = time.monotonic() + self.stubborn
        while time.monotonic() < end:
            sum(i * i for i in range(500))
        self.left_at = time.monotonic()
