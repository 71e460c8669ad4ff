"""A worker process for the kill -9 test of requeue and quarantine (``test_requeue.py``).

``python -m tests.runs.requeue_worker DATABASE DIR``: *DATABASE* is a SQLite file path or a
PostgreSQL URL. The process builds a run manager on it with the kind ``op``
(``max_attempts`` :data:`MAX_ATTEMPTS`) whose executor writes a ``progress`` event, appends
a line ``<pid> <run id> <attempts>`` to ``DIR/starts`` and then waits for its token forever;
it runs restart recovery (as a server does before serving), writes ``DIR/ready-<pid>``, and
keeps its reaper running (leases renewed) until it is killed.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from heed.runs.broker import InProcessBroker
from heed.runs.events import EventType
from heed.runs.kinds import KindSpec, RunContext
from heed.runs.manager import RunManager
from heed.runs.reaper import Reaper
from heed.runs.recovery import recover
from heed.storage import SqlDatabase, SqliteDatabase
from heed.storage.run_store import SqlRunStore

#: Worker deaths after which an ``op`` is quarantined.
MAX_ATTEMPTS = 3
KIND = "op"


def open_database(target: str) -> SqlDatabase:
    if target.startswith(("postgresql:", "postgres:")):
        from heed.storage.postgres import PostgresDatabase

        return PostgresDatabase(target, pool_size=4)
    return SqliteDatabase(Path(target))


async def main(target: str, directory: Path) -> None:
    store = SqlRunStore(open_database(target))
    store.migrate()
    # A long lease: a death is found by restart recovery (the worker's pid is gone), not by
    # the lease running out.
    manager = RunManager(store, InProcessBroker(), lease_seconds=60, reaper_interval=0.2)

    async def blocking(rc: RunContext) -> dict[str, Any]:
        await rc.emit(EventType.PROGRESS, {"attempt": rc.run.attempts + 1})
        line = f"{os.getpid()} {rc.run.id} {rc.run.attempts}\n"
        with (directory / "starts").open("a") as starts:
            starts.write(line)
            starts.flush()
            os.fsync(starts.fileno())
        await rc.token.wait()
        rc.token.raise_if_cancelled()
        return {}

    manager.register(KIND, KindSpec(execute=blocking, max_attempts=MAX_ATTEMPTS))
    await recover(manager)
    reaper = Reaper(manager)
    reaper.start()
    (directory / f"ready-{os.getpid()}").write_text("ready")
    try:
        await asyncio.Event().wait()
    finally:
        await reaper.stop()
        await manager.close(grace=1)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2])))
