"""Fixtures for run-manager tests: a real store on each SQL backend and a manager with
test kinds."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from heed.runs.broker import InProcessBroker
from heed.runs.events import EventType
from heed.runs.kinds import KindSpec, RunContext
from heed.runs.manager import RunManager
from heed.storage import SqlDatabase, SqliteDatabase
from heed.storage.run_store import SqlRunStore


class Gate:
    """Lets a test hold workers until it opens the gate."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()


async def echo_work(rc: RunContext) -> dict[str, Any]:
    """Emits `n` tokens (default 3) with a small delay, checking the token."""
    n = int(rc.payload.get("n", 3))
    delay = float(rc.payload.get("delay", 0.01))
    for i in range(n):
        rc.token.raise_if_cancelled()
        await rc.emit(EventType.TEXT_DELTA, {"text": f"t{i} "})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(rc.token.wait(), delay)
    rc.token.raise_if_cancelled()
    return {"n": n}


WEDGE_RELEASE = threading.Event()


async def wedged_work(rc: RunContext) -> dict[str, Any]:
    """Ignores its token until WEDGE_RELEASE is set (a worker stuck in a thread)."""
    await rc.emit(EventType.TEXT_DELTA, {"text": "stuck"})
    await asyncio.to_thread(WEDGE_RELEASE.wait, 30)
    return {}


def build_manager(database: Path | SqlDatabase, **kwargs: Any) -> RunManager:
    """A manager on *database* (a path: a SQLite file), with the test kinds registered."""
    store = SqlRunStore(SqliteDatabase(database) if isinstance(database, Path) else database)
    store.migrate()
    options: dict[str, Any] = {
        "unwind_window": 1.0,
        "lease_seconds": 1.0,
        "reaper_interval": 0.1,
        "poll_interval": 0.1,
    }
    options.update(kwargs)
    manager = RunManager(store, InProcessBroker(), **options)
    manager.register("turn", KindSpec(execute=echo_work, exclusive=True))
    manager.register("wedge", KindSpec(execute=wedged_work, exclusive=True))
    manager.register("task", KindSpec(execute=echo_work))
    return manager


@pytest.fixture
async def manager(sql_database: SqlDatabase) -> AsyncIterator[RunManager]:
    WEDGE_RELEASE.clear()
    m = build_manager(sql_database)
    yield m
    WEDGE_RELEASE.set()
    await m.close(grace=2)
