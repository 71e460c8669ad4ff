"""The webhook store on SQLite and PostgreSQL: events stored once and fanned out to
deliveries, the log cut by count and by age, due deliveries without the tenants and webhooks
that hold their share, the cap per bank under concurrent creates, and the schema step that
moved each delivery's body into its event."""

from __future__ import annotations

import json
import threading
import time
import uuid

from heed.storage import SqlDatabase
from heed.storage.database import apply_migrations
from heed.storage.webhook_store import MIGRATIONS, SqlWebhookStore
from heed.webhooks.models import DELIVERED, PENDING, Event, HttpConfig, Webhook


def _store(db: SqlDatabase) -> SqlWebhookStore:
    store = SqlWebhookStore(db)
    store.migrate()
    return store


def _hook(
    store: SqlWebhookStore,
    tenant: str = "t",
    ref: str = "ref1",
    events: list[str] | None = None,
    enabled: bool = True,
    limit: int | None = None,
) -> tuple[Webhook, bool]:
    now = time.time()
    hook = Webhook(
        id="wh_" + uuid.uuid4().hex[:12],
        tenant=tenant,
        bank_ref=ref,
        bank_id="bank",
        url=f"https://hooks.example.com/{uuid.uuid4().hex[:6]}",
        secret="s3cret-value",
        event_types=events or ["retain.completed", "run.completed"],
        enabled=enabled,
        http_config=HttpConfig(),
        created_at=now,
        updated_at=now,
    )
    return hook, store.create(hook, limit)


def _event(tenant: str = "t", ref: str = "ref1", kind: str = "run.completed") -> Event:
    run = "run_" + uuid.uuid4().hex[:12]
    return Event(f"{run}:{kind}", tenant, ref, kind, json.dumps({"run": run}), time.time())


def _rows(db: SqlDatabase, sql: str, *args: object) -> list[tuple[object, ...]]:
    with db.read() as conn:
        return [tuple(r) for r in conn.execute(sql, args).fetchall()]


def _deliver(store: SqlWebhookStore, delivery_id: str, at: float) -> None:
    """Record *delivery_id* delivered by a try at *at*."""
    now = time.time()
    assert store.claim(delivery_id, "me", now, now + 60)
    fields = {"status": DELIVERED, "attempts": 1, "next_attempt_at": at, "updated_at": at}
    assert store.finish(delivery_id, "me", fields)


def test_an_event_is_fanned_out_once_to_its_subscribers(sql_database: SqlDatabase) -> None:
    store = _store(sql_database)
    both, _ = _hook(store)
    runs_only, _ = _hook(store, events=["run.completed"])
    _hook(store, events=["retain.completed"])  # not this event's type
    _hook(store, enabled=False)
    _hook(store, ref="ref2")  # another bank
    event = _event()
    store.add_events([event])
    store.add_events([event])  # the same event again: kept as it is
    assert [e.id for e in store.pending_events(4, 10)] == [event.id]
    assert store.fan_out(event.id, time.time(), keep=10) == 2
    assert store.fan_out(event.id, time.time(), keep=10) == 0  # done (another instance)
    assert store.pending_events(4, 10) == []
    due = store.due(time.time() + 1, 10)
    assert {d.webhook_id for d in due} == {both.id, runs_only.id}
    assert {d.event_id for d in due} == {event.id}
    assert store.event_body(event.id) == event.body
    assert _rows(sql_database, "SELECT COUNT(*) FROM webhook_events") == [(1,)]
    # An event nobody subscribes to is not kept.
    lonely = _event(ref="ref3")
    store.add_events([lonely])
    assert store.fan_out(lonely.id, time.time(), keep=10) == 0
    assert store.event_body(lonely.id) is None


def test_tenants_take_turns_in_the_fan_out(sql_database: SqlDatabase) -> None:
    store = _store(sql_database)
    busy = [_event(tenant="busy") for _ in range(6)]
    for event in busy:
        store.add_events([event])
        time.sleep(0.002)
    quiet = _event(tenant="quiet")
    store.add_events([quiet])
    turn = [e.id for e in store.pending_events(per_tenant=2, limit=3)]
    assert turn[:2] == [busy[0].id, quiet.id]  # the quiet tenant's one event comes second
    assert turn[2] == busy[1].id


def test_a_webhooks_log_keeps_its_newest_deliveries(sql_database: SqlDatabase) -> None:
    store = _store(sql_database)
    hook, _ = _hook(store, events=["run.completed"])
    events = []
    for _ in range(6):
        event = _event()
        events.append(event)
        store.add_events([event])
        store.fan_out(event.id, time.time(), keep=3)
        [delivery] = store.due(time.time() + 1, 10)
        _deliver(store, delivery.id, time.time())
    log = store.deliveries("t", "ref1", hook.id, 10, None)
    assert [d.event_id for d in log] == [e.id for e in reversed(events[-3:])]
    assert [d.seq for d in log] == [6, 5, 4]
    # The events of the deliveries that went are gone too.
    kept = {r[0] for r in _rows(sql_database, "SELECT id FROM webhook_events")}
    assert kept == {e.id for e in events[-3:]}
    # A pending delivery is never cut, however old.
    stuck = _event()
    store.add_events([stuck])
    store.fan_out(stuck.id, time.time(), keep=3)
    for _ in range(4):
        event = _event()
        store.add_events([event])
        store.fan_out(event.id, time.time(), keep=1)
    statuses = [d.status for d in store.deliveries("t", "ref1", hook.id, 20, None)]
    assert statuses.count(PENDING) == 5 and statuses.count(DELIVERED) == 0


def test_the_log_is_pruned_by_age(sql_database: SqlDatabase) -> None:
    store = _store(sql_database)
    hook, _ = _hook(store, events=["run.completed"])
    old, new = _event(), _event()
    for event in (old, new):
        store.add_events([event])
        store.fan_out(event.id, time.time(), keep=100)
    first, second = sorted(store.due(time.time() + 1, 10), key=lambda d: d.event_id != old.id)
    _deliver(store, first.id, time.time() - 100)  # finished long ago
    assert store.prune(time.time() - 50, batch=100) == 1
    [left] = store.deliveries("t", "ref1", hook.id, 10, None)
    assert left.id == second.id and left.status == PENDING  # pending: kept
    assert store.event_body(old.id) is None and store.event_body(new.id) is not None
    # Deleting the webhook takes its deliveries and their events.
    assert store.delete("t", "ref1", hook.id)
    assert _rows(sql_database, "SELECT COUNT(*) FROM webhook_events") == [(0,)]


def test_due_leaves_out_the_tenants_and_webhooks_that_hold_their_share(
    sql_database: SqlDatabase,
) -> None:
    store = _store(sql_database)
    a1, _ = _hook(store, tenant="a", events=["run.completed"])
    a2, _ = _hook(store, tenant="a", events=["run.completed"])
    b1, _ = _hook(store, tenant="b", events=["run.completed"])
    for tenant in ("a", "a", "b"):
        event = _event(tenant=tenant)
        store.add_events([event])
        store.fan_out(event.id, time.time(), keep=10)
    later = time.time() + 1
    assert {d.webhook_id for d in store.due(later, 10)} == {a1.id, a2.id, b1.id}
    assert {d.tenant for d in store.due(later, 10, skip_tenants=["a"])} == {"b"}
    assert {d.webhook_id for d in store.due(later, 10, skip_webhooks=[a1.id, b1.id])} == {a2.id}


def test_a_bank_holds_at_most_its_limit_under_concurrent_creates(
    sql_database: SqlDatabase,
) -> None:
    store = _store(sql_database)
    results: list[bool] = []

    def create() -> None:
        results.append(_hook(store, ref="capped", limit=4)[1])

    threads = [threading.Thread(target=create) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 6 + [True] * 4
    assert store.list_bank("t", "capped", 100, 0)[1] == 4
    assert _hook(store, ref="other", limit=4)[1]  # another bank counts its own


def test_the_schema_step_moves_each_deliverys_body_into_its_event(
    sql_database: SqlDatabase,
) -> None:
    """A database at version 1 (a body per delivery) keeps its deliveries and their
    bodies, each once, when it is brought to version 2."""
    apply_migrations(sql_database, [m for m in MIGRATIONS if m.version == 1])
    now = time.time()
    with sql_database.write() as conn:
        for i, (event, hook) in enumerate([("e1", "w1"), ("e1", "w2"), ("e2", "w1")]):
            conn.execute(
                "INSERT INTO webhook_deliveries (id, tenant, bank_ref, webhook_id, event_id,"
                " event_type, url, body, status, attempts, next_attempt_at, created_at,"
                " updated_at) VALUES (?, 't', 'ref1', ?, ?, 'run.completed', 'https://x/',"
                " ?, 'pending', 0, ?, ?, ?)",
                (f"d{i}", hook, event, json.dumps({"event": event}), now, now + i, now),
            )
    store = _store(sql_database)
    assert store.event_body("e1") == json.dumps({"event": "e1"})
    assert store.event_body("e2") == json.dumps({"event": "e2"})
    assert _rows(sql_database, "SELECT COUNT(*) FROM webhook_events WHERE fanned_out = 1") == [(2,)]
    due = store.due(now + 10, 10)
    assert sorted(d.id for d in due) == ["d0", "d1", "d2"]
    assert {d.seq for d in due} == {0}


def test_claims_of_overlapping_deliveries_by_two_workers_are_disjoint(
    sql_database: SqlDatabase,
) -> None:
    store = _store(sql_database)
    for _ in range(8):
        _hook(store, events=["run.completed"])
    event = _event()
    store.add_events([event])
    store.fan_out(event.id, time.time(), keep=10)
    ids = sorted(d.id for d in store.due(time.time() + 1, 20))
    assert len(ids) == 8
    now = time.time() + 1
    claimed: dict[str, set[str]] = {}

    def claim(owner: str, wanted: list[str]) -> None:
        claimed[owner] = store.claim_many(wanted, owner, now, now + 60)

    threads = [
        threading.Thread(target=claim, args=("one", ids[:6])),
        threading.Thread(target=claim, args=("two", ids[2:])),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not claimed["one"] & claimed["two"]
    assert claimed["one"] | claimed["two"] == set(ids)
    assert store.claim_many(ids, "three", now, now + 60) == set()  # all leased
    assert store.claim_many([], "three", now, now + 60) == set()
