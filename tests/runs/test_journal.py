"""Journal reads: replay then tail with no gap and no duplicate at the seam; explicit gaps."""

from __future__ import annotations

import asyncio
import time

import pytest

from heed.runs.broker import InProcessBroker
from heed.runs.io import BlockingIO
from heed.runs.journal import Gap, Heartbeat, Journal
from heed.runs.model import Run, RunEvent, new_run_id
from heed.storage import SqlDatabase
from heed.storage.run_store import SqlRunStore


@pytest.fixture
def journal(sql_database: SqlDatabase) -> Journal:
    store = SqlRunStore(sql_database)
    store.migrate()
    return Journal(store, InProcessBroker(), BlockingIO(), poll_interval=0.2)


def make(journal: Journal) -> str:
    run = Run(id=new_run_id(), kind="turn", tenant="t", phase="running", created_at=time.time())
    journal.store.create(run)
    return run.id


async def collect(journal: Journal, run_id: str, after: int, heartbeat: float = 10.0) -> list:
    items = []
    async for item in journal.follow(run_id, after, heartbeat=heartbeat):
        if isinstance(item, list):
            items.extend(item)
        else:
            items.append(item)
    return items


async def test_replay_then_tail_has_no_gap_or_duplicate(journal: Journal) -> None:
    run_id = make(journal)
    for i in range(300):
        await journal.append(run_id, "text_delta", {"i": i})

    async def writer() -> None:
        for i in range(300, 600):
            await journal.append(run_id, "text_delta", {"i": i})
            if i % 50 == 0:
                await asyncio.sleep(0)
        await journal.append(run_id, "completed", {})

    readers = [asyncio.create_task(collect(journal, run_id, after)) for after in (0, 10, 299)]
    await writer()
    results = await asyncio.wait_for(asyncio.gather(*readers), 10)
    for after, events in zip((0, 10, 299), results, strict=True):
        seqs = [e.seq for e in events]
        assert seqs == list(range(after + 1, 602)), after
        assert events[-1].type == "completed"


async def test_lagging_subscriber_recovers_from_the_store(journal: Journal) -> None:
    run_id = make(journal)
    # A tiny broker queue forces drops; the reader must re-read, not skip.
    orig = journal.broker.subscribe
    journal.broker.subscribe = lambda topic, maxsize=4096: orig(topic, maxsize=2)  # type: ignore[method-assign]
    reader = asyncio.create_task(collect(journal, run_id, 0))
    await asyncio.sleep(0.05)
    journal.publish(
        await asyncio.to_thread(
            journal.store.append_events, run_id, [("text_delta", {"i": i}) for i in range(100)]
        )
    )
    await journal.append(run_id, "completed", {})
    events = await asyncio.wait_for(reader, 5)
    assert [e.seq for e in events] == list(range(1, 102))


async def test_old_cursor_gets_an_explicit_gap(journal: Journal) -> None:
    run_id = make(journal)
    for i in range(10):
        await journal.append(run_id, "text_delta", {"i": i})
    await journal.append(run_id, "completed", {})
    journal.store.trim_journal(run_id, 6)
    items = await asyncio.wait_for(collect(journal, run_id, 2), 5)
    assert isinstance(items[0], Gap) and items[0].first_retained == 6
    assert [e.seq for e in items[1:]] == [6, 7, 8, 9, 10, 11]
    # a cursor inside the retained range gets no gap
    items = await asyncio.wait_for(collect(journal, run_id, 7), 5)
    assert all(isinstance(i, RunEvent) for i in items)


async def test_cursor_beyond_end_waits_and_heartbeats(journal: Journal) -> None:
    run_id = make(journal)
    await journal.append(run_id, "text_delta", {"i": 0})
    got: list = []

    async def read() -> None:
        async for item in journal.follow(run_id, 5, heartbeat=0.1):
            got.append(item)
            if isinstance(item, list) and item[-1].is_terminal:
                return

    task = asyncio.create_task(read())
    await asyncio.sleep(0.35)
    assert any(isinstance(i, Heartbeat) for i in got)
    assert not any(isinstance(i, list) for i in got)
    for i in range(6):
        await journal.append(run_id, "text_delta", {"i": i})
    await journal.append(run_id, "completed", {})
    await asyncio.wait_for(task, 5)
    events = [e for i in got if isinstance(i, list) for e in i]
    assert [e.seq for e in events] == [6, 7, 8]


async def test_writer_in_another_process_is_seen_by_polling(journal: Journal) -> None:
    run_id = make(journal)
    reader = asyncio.create_task(collect(journal, run_id, 0))
    await asyncio.sleep(0.05)
    # written without publishing, as another process would
    await asyncio.to_thread(
        journal.store.append_events, run_id, [("text_delta", {}), ("completed", {})]
    )
    events = await asyncio.wait_for(reader, 5)
    assert [e.seq for e in events] == [1, 2]
