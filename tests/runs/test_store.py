"""The run store on each SQL backend: guarded transitions, gap-free journal, atomic admission."""

from __future__ import annotations

import threading
import time

import pytest

from heed.runs.model import Phase, Run, new_run_id
from heed.runs.state import is_lifecycle_busy
from heed.storage import SqlDatabase
from heed.storage.run_store import SqlRunStore


@pytest.fixture
def store(sql_database: SqlDatabase) -> SqlRunStore:
    s = SqlRunStore(sql_database)
    s.migrate()
    return s


def new_run(session_id: str | None = "s1", kind: str = "turn") -> Run:
    return Run(
        id=new_run_id(),
        kind=kind,
        tenant="t",
        phase="queued",
        created_at=time.time(),
        session_id=session_id,
    )


def test_terminal_phases_are_absorbing(store: SqlRunStore) -> None:
    run = store.create(new_run())
    assert store.transition(run.id, Phase.COMPLETED) is None  # queued -> completed refused
    assert store.transition(run.id, Phase.CANCELLED, fields={"finished_at": 1.0}) is not None
    for target in Phase:
        assert store.transition(run.id, target) is None
    got = store.get(run.id)
    assert got is not None and got.phase == "cancelled"


def test_transition_appends_terminal_event_atomically(store: SqlRunStore) -> None:
    run = store.create(new_run())
    claimed = store.claim(
        run.id,
        worker_id="w",
        lease_seconds=10,
        may_start=lambda r, s: True,
        scope_kinds=["turn"],
    )
    assert claimed is not None
    assert claimed[1].seq == 1 and claimed[1].type == "started"
    store.append_events(run.id, [("text_delta", {"text": "a"}), ("text_delta", {"text": "b"})])
    done = store.transition(run.id, Phase.CANCELLING, event=("cancelled", {"reason": "x"}))
    assert done is not None and done.event is not None and done.event.seq == 4
    # the journal is closed: nothing more is appended, not even by the worker
    assert store.append_events(run.id, [("text_delta", {"text": "late"})]) == []
    later = store.transition(run.id, Phase.CANCELLED, event=("cancelled", {}))
    assert later is not None and later.event is None
    seqs = [e.seq for e in store.events_after(run.id, 0)]
    assert seqs == [1, 2, 3, 4]


def test_worker_guard_refuses_another_worker(store: SqlRunStore) -> None:
    run = store.create(new_run())
    store.claim(
        run.id,
        worker_id="w1",
        lease_seconds=10,
        may_start=lambda r, s: True,
        scope_kinds=["turn"],
    )
    assert store.transition(run.id, Phase.COMPLETED, worker_id="w2") is None
    assert store.transition(run.id, Phase.COMPLETED, worker_id="w1") is not None


def test_journal_seq_is_gap_free_under_concurrent_appends(store: SqlRunStore) -> None:
    run = store.create(new_run())

    def writer() -> None:
        for i in range(50):
            store.append_events(run.id, [("text_delta", {"i": i})])

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seqs = [e.seq for e in store.events_after(run.id, 0, limit=1000)]
    assert seqs == list(range(1, 201))


def test_trim_moves_first_seq(store: SqlRunStore) -> None:
    run = store.create(new_run())
    store.append_events(run.id, [("text_delta", {"i": i}) for i in range(10)])
    assert store.trim_journal(run.id, 6) == 5
    got = store.get(run.id)
    assert got is not None and got.first_seq == 6
    assert [e.seq for e in store.events_after(run.id, 0)] == [6, 7, 8, 9, 10]


def test_last_event_finds_the_newest_of_its_type_behind_others(store: SqlRunStore) -> None:
    run = store.create(new_run())
    assert store.last_event(run.id, "progress") is None
    store.append_events(run.id, [("progress", {"processed": 1}), ("progress", {"processed": 2})])
    store.append_events(run.id, [("text_delta", {"i": i}) for i in range(20)])
    last = store.last_event(run.id, "progress")
    assert last is not None and (last.seq, last.data) == (2, {"processed": 2})
    assert store.last_event("no-such-run", "progress") is None


def test_admission_is_atomic_across_threads(store: SqlRunStore) -> None:
    results: list[Run | None] = []
    lock = threading.Lock()
    barrier = threading.Barrier(20)

    def blocking(siblings: object) -> Run | None:
        time.sleep(0.02)  # a slow check widens the window a missing lock would leave open
        for r in siblings:  # type: ignore[attr-defined]
            if is_lifecycle_busy(r, time.time()):
                return r  # type: ignore[no-any-return]
        return None

    def start() -> None:
        barrier.wait()
        admitted, _ = store.admit(new_run(), blocking, scope_kinds=["turn"])
        with lock:
            results.append(admitted)

    threads = [threading.Thread(target=start) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(1 for r in results if r is not None) == 1
    assert len(store.list_runs(session_id="s1")) == 1


def test_non_terminal_listing_includes_unknown_phases(store: SqlRunStore) -> None:
    odd = store.create(
        Run(id="run_odd", kind="turn", tenant="t", phase="", created_at=1.0, session_id="s1")
    )
    store.create(
        Run(
            id="run_done",
            kind="turn",
            tenant="t",
            phase="completed",
            created_at=2.0,
            session_id="s1",
        )
    )
    ids = [r.id for r in store.list_runs(session_id="s1", non_terminal=True)]
    assert ids == [odd.id]


def test_event_json_round_trips_without_reencoding(store: SqlRunStore) -> None:
    import json

    run = store.create(new_run())
    payloads = [{"text": 'quote " and \\ and \n newline'}, {"text": "héllo ✓"}, {}]
    written = store.append_events(run.id, [("text_delta", p) for p in payloads])
    read = store.events_after(run.id, 0)
    for fresh, stored, payload in zip(written, read, payloads, strict=True):
        assert stored.data == payload
        assert json.loads(stored.to_json()) == stored.to_public() == fresh.to_public()
        assert "\n" not in stored.to_json()  # one SSE data line


def test_an_unreachable_postgresql_is_named_at_start_without_its_password() -> None:
    from heed.storage.postgres import DatabaseUnavailable, PostgresDatabase

    with pytest.raises(DatabaseUnavailable) as caught:
        PostgresDatabase("postgresql://heed:s3cret@127.0.0.1:1/heed", connect_timeout=2)
    assert "127.0.0.1:1/heed" in str(caught.value)
    assert "s3cret" not in str(caught.value)


def test_delete_terminal_removes_an_ended_run_with_its_journal_and_payload(
    store: SqlRunStore,
) -> None:
    running = store.create(new_run(), payload={"items": [1]})
    ended = store.create(new_run(), payload={"items": [2]})
    for run in (running, ended):
        assert store.claim(
            run.id,
            worker_id="w",
            lease_seconds=10,
            may_start=lambda r, s: True,
            scope_kinds=["turn"],
        )
    store.append_events(ended.id, [("text_delta", {"text": "a"})])
    assert store.transition(ended.id, Phase.FAILED, fields={"finished_at": 1.0}) is not None
    assert store.delete_terminal(running.id) is False  # not ended: kept whole
    assert store.get(running.id) is not None and store.payload(running.id) == {"items": [1]}
    assert store.events_after(ended.id, 0)
    assert store.delete_terminal(ended.id) is True
    assert store.get(ended.id) is None and store.payload(ended.id) is None
    assert store.events_after(ended.id, 0) == []
    assert store.delete_terminal(ended.id) is False  # gone already
    assert store.events_after(running.id, 0)  # the other run's journal is untouched
