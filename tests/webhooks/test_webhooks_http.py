"""Webhooks over a real server and a real receiver on loopback, on SQLite and PostgreSQL:
the client's webhooks API, signed run.completed / retain.completed deliveries, retries with
backoff then failed in the log, the SSRF allow-list, the outbox in the run's transaction,
a clean shutdown, and two instances delivering each event once."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hindsight_client import Hindsight
from hindsight_client_api.models.create_webhook_request import CreateWebhookRequest
from hindsight_client_api.models.update_webhook_request import UpdateWebhookRequest

from heed.api.app import create_app
from heed.runs.model import Phase, Run
from heed.settings import Settings
from heed.storage import SqliteDatabase
from heed.storage.webhook_store import SqlWebhookStore
from heed.webhooks import SIGNATURE_HEADER, verify
from heed.webhooks.targets import TargetRefused, check_target
from tests.pg_support import fresh_schema
from tests.support import LiveServer, live_server, wait_for
from tests.webhooks.receiver import Receiver, receiver


def _settings(data_dir: Path, url: str | None = None, **extra: Any) -> Settings:
    fields: dict[str, Any] = {
        "webhook_allow_private": True,
        "webhook_poll_seconds": 0.05,
        "webhook_backoff_seconds": 0.05,
        "webhook_max_attempts": 3,
        "llm_provider": "scripted",  # consolidations and mental-model refreshes: an echo
        **extra,
    }
    return Settings(data_dir=data_dir, database_url=url, **fields)


@pytest.fixture(params=["sqlite", "postgresql"], scope="module")
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    data = tmp_path_factory.mktemp("webhooks")
    if request.param == "sqlite":
        with live_server(create_app(_settings(data))) as srv:
            yield srv
        return
    with fresh_schema() as url, live_server(create_app(_settings(data, url))) as srv:
        yield srv


@pytest.fixture(scope="module")
def hook_receiver() -> Iterator[Receiver]:
    with receiver() as rec:
        yield rec


def new_bank(server: LiveServer) -> str:
    bank = "hooks-" + uuid.uuid4().hex[:8]
    httpx.put(f"{server.url}/v1/default/banks/{bank}", json={}, timeout=30).raise_for_status()
    return bank


def create_hook(server: LiveServer, bank: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/default/banks/{bank}/webhooks", json=body, timeout=30)


def async_retain(server: LiveServer, bank: str, text: str) -> str:
    r = httpx.post(
        f"{server.url}/v1/default/banks/{bank}/memories",
        json={"items": [{"content": text}], "async": True},
        timeout=30,
    )
    r.raise_for_status()
    return str(r.json()["operation_id"])


def deliveries(server: LiveServer, bank: str, webhook_id: str) -> list[dict[str, Any]]:
    r = httpx.get(
        f"{server.url}/v1/default/banks/{bank}/webhooks/{webhook_id}/deliveries", timeout=30
    )
    r.raise_for_status()
    return list(r.json()["items"])


async def test_the_clients_webhooks_api_round_trip(
    server: LiveServer, hook_receiver: Receiver
) -> None:
    bank = new_bank(server)
    client = Hindsight(base_url=server.url)
    try:
        created = await client.webhooks.create_webhook(
            bank,
            CreateWebhookRequest(
                url=f"{hook_receiver.url}/client",
                event_types=["retain.completed"],
                http_config={"timeout_seconds": 5, "headers": {"X-Team": "blue"}},
            ),
        )
        assert created.id and created.secret and created.secret.startswith("whsec_")
        assert created.bank_id == bank and created.enabled is True
        listed = await client.webhooks.list_webhooks(bank)
        assert listed.total == 1 and listed.items[0].id == created.id
        assert listed.items[0].secret is None  # shown once, when created
        updated = await client.webhooks.update_webhook(
            bank, created.id, UpdateWebhookRequest(enabled=False, event_types=["run.completed"])
        )
        assert updated.enabled is False and updated.event_types == ["run.completed"]
        assert updated.url == f"{hook_receiver.url}/client"
        log = await client.webhooks.list_webhook_deliveries(bank, created.id)
        assert log.items == [] and log.next_cursor is None
        deleted = await client.webhooks.delete_webhook(bank, created.id)
        assert deleted.success
        assert (await client.webhooks.list_webhooks(bank)).total == 0
    finally:
        await client.aclose()
    missing = httpx.get(f"{server.url}/v1/default/banks/{bank}/webhooks/{created.id}/deliveries")
    assert missing.status_code == 404


def test_a_retain_operation_is_delivered_signed(
    server: LiveServer, hook_receiver: Receiver
) -> None:
    bank = new_bank(server)
    path = f"/signed-{bank}"
    hook = create_hook(
        server,
        bank,
        url=f"{hook_receiver.url}{path}?team=blue",
        secret="s3cret-value",
        http_config={"params": {"source": "heed"}},
    ).json()
    operation = async_retain(server, bank, "Alice waters the ferns every Monday.")
    got = wait_for(lambda: len(hook_receiver.at(path)) >= 2 and hook_receiver.at(path), 20)
    by_type = {r.json["type"]: r for r in got}
    assert set(by_type) == {"run.completed", "retain.completed"}
    for event_type, request in by_type.items():
        assert verify("s3cret-value", request.body, request.headers[SIGNATURE_HEADER])
        assert not verify("another-secret", request.body, request.headers[SIGNATURE_HEADER])
        assert request.headers["X-Heed-Event"] == event_type
        assert request.headers["Content-Type"] == "application/json"
        assert "source=heed" in request.path
        body = request.json
        assert body["bank_id"] == bank and body["id"] == f"{operation}:{event_type}"
        assert body["data"]["operation_id"] == operation
        assert body["data"]["kind"] == "retain" and body["data"]["status"] == "completed"
        assert body["data"]["result"]["items_count"] == 1
    log = wait_for(
        lambda: (
            (d := deliveries(server, bank, hook["id"]))
            and all(x["status"] == "delivered" for x in d)
            and d
        ),
        10,
    )
    assert len(log) == 2
    for entry in log:
        assert entry["attempts"] == 1 and entry["last_response_status"] == 200
        assert entry["last_response_body"] == '{"ok": true}' and entry["next_retry_at"] is None
        assert entry["url"] == f"{hook_receiver.url}{path}?team=blue"


def test_only_the_subscribed_events_are_sent(server: LiveServer, hook_receiver: Receiver) -> None:
    bank = new_bank(server)
    path = f"/only-{bank}"
    create_hook(server, bank, url=f"{hook_receiver.url}{path}", event_types=["retain.completed"])
    disabled = f"/off-{bank}"
    create_hook(server, bank, url=f"{hook_receiver.url}{disabled}", enabled=False)
    async_retain(server, bank, "Bob repairs bicycles.")
    wait_for(lambda: hook_receiver.at(path), 20)
    time.sleep(0.5)
    assert [r.json["type"] for r in hook_receiver.at(path)] == ["retain.completed"]
    assert hook_receiver.at(disabled) == []


@pytest.mark.parametrize(
    ("kind_event", "start"),
    [
        ("consolidation.completed", lambda bank: ("/consolidate", {})),
        (
            "mental_model.refreshed",
            lambda bank: ("/mental-models", {"name": "pets", "source_query": "Who has pets?"}),
        ),
    ],
)
def test_each_kind_of_bank_run_has_its_event(
    server: LiveServer, hook_receiver: Receiver, kind_event: str, start: Any
) -> None:
    bank = new_bank(server)
    path = f"/kind-{bank}"
    create_hook(server, bank, url=f"{hook_receiver.url}{path}")
    async_retain(server, bank, "Gus has a tortoise named Flash.")
    route, body = start(bank)
    r = httpx.post(f"{server.url}/v1/default/banks/{bank}{route}", json=body, timeout=30)
    assert r.status_code in (200, 201), r.text
    got = wait_for(lambda: [x for x in hook_receiver.at(path) if x.json["type"] == kind_event], 30)
    [event] = got
    assert event.json["bank_id"] == bank and event.json["data"]["status"] == "completed"
    run_id = event.json["data"]["run_id"]
    completed = wait_for(
        lambda: [
            x
            for x in hook_receiver.at(path)
            if x.json["type"] == "run.completed" and x.json["data"]["run_id"] == run_id
        ],
        10,
    )
    assert len(completed) == 1


def test_a_failing_receiver_is_retried_with_backoff_then_failed(
    server: LiveServer, hook_receiver: Receiver
) -> None:
    bank = new_bank(server)
    path = f"/fail-{bank}"
    hook_receiver.answers[path] = (500, {})
    hook = create_hook(
        server, bank, url=f"{hook_receiver.url}{path}", event_types=["run.completed"]
    ).json()
    async_retain(server, bank, "Carol sings in a choir.")
    log = wait_for(
        lambda: (d := deliveries(server, bank, hook["id"])) and d[0]["status"] == "failed" and d,
        30,
    )
    [entry] = log
    assert entry["attempts"] == 3  # HEED_WEBHOOK_MAX_ATTEMPTS
    assert entry["last_error"] == "HTTP 500" and entry["last_response_status"] == 500
    assert entry["last_response_body"] == "receiver says no"
    tries = hook_receiver.at(path)
    assert len(tries) == 3
    assert len({r.headers["X-Heed-Delivery"] for r in tries}) == 1  # one delivery, retried
    assert len({r.body for r in tries}) == 1  # the same body (and signature) each time
    time.sleep(0.5)
    assert len(hook_receiver.at(path)) == 3  # never tried again


def test_a_redirect_is_followed_to_its_target(server: LiveServer, hook_receiver: Receiver) -> None:
    bank = new_bank(server)
    source, target = f"/moved-{bank}", f"/new-{bank}"
    hook_receiver.answers[source] = (307, {"Location": target})
    create_hook(server, bank, url=f"{hook_receiver.url}{source}", event_types=["run.completed"])
    async_retain(server, bank, "Dan collects stamps.")
    [arrived] = wait_for(lambda: hook_receiver.at(target), 20)
    assert arrived.json["type"] == "run.completed"


def test_deleting_the_bank_deletes_its_webhooks(
    server: LiveServer, hook_receiver: Receiver
) -> None:
    bank = new_bank(server)
    create_hook(server, bank, url=f"{hook_receiver.url}/gone")
    httpx.delete(f"{server.url}/v1/default/banks/{bank}", timeout=30).raise_for_status()
    httpx.put(f"{server.url}/v1/default/banks/{bank}", json={}, timeout=30).raise_for_status()
    listed = httpx.get(f"{server.url}/v1/default/banks/{bank}/webhooks").json()
    assert listed["total"] == 0


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"url": "ftp://example.com/x"}, ["must be http or https"]),
        ({"url": "http://user:pw@example.com/"}, ["user or password"]),
        (
            {"url": "https://h.example/", "event_types": ["memory_defense.triggered"]},
            ["'memory_defense.triggered' is not sent by heed"],
        ),
        ({"url": "https://h.example/", "event_types": ["nope"]}, ["'nope' is unknown"]),
        ({"url": "https://h.example/", "event_types": []}, ["event_types is empty"]),
        ({"url": "https://h.example/", "http_config": {"method": "GET"}}, ["heed sends POST"]),
        ({"url": "https://h.example/", "http_config": {"timeout_seconds": 600}}, ["1 to 60"]),
        (
            {"url": "https://h.example/", "http_config": {"headers": {"X-Heed-Signature": "x"}}},
            ["is set by heed"],
        ),
        ({"url": "https://h.example/", "http_config": {"retries": 3}}, ["http_config.retries"]),
        ({"url": "https://h.example/", "secret": "short"}, ["secret has 5 characters"]),
        ({"url": "https://h.example/", "format": "xml"}, ["format is not supported"]),
    ],
)
def test_bad_webhooks_are_refused_by_name(
    server: LiveServer, body: dict[str, Any], words: list[str]
) -> None:
    bank = new_bank(server)
    r = create_hook(server, bank, **body)
    assert r.status_code == 400, r.text
    for word in words:
        assert word in r.json()["detail"], (word, r.text)
    assert httpx.get(f"{server.url}/v1/default/banks/{bank}/webhooks").json()["total"] == 0


def test_the_outbox_row_commits_with_the_runs_transaction_or_not_at_all(
    server: LiveServer, hook_receiver: Receiver
) -> None:
    """The hook writes the run's events through the run store's open transaction: rolled
    back with it. Their deliveries are written afterwards, by the worker."""
    bank = new_bank(server)
    hook = create_hook(server, bank, url=f"{hook_receiver.url}/never").json()
    services = server.app.state.services
    webhooks = services.webhooks
    stored = services.webhook_store.get_by_id(hook["id"])
    assert stored is not None
    run = Run(
        id="run_" + uuid.uuid4().hex[:8],
        kind="retain",
        tenant=stored.tenant,
        phase=Phase.COMPLETED,
        created_at=time.time(),
        session_id=f"bank:{stored.bank_ref}",
    )

    def aborted() -> None:
        with services.run_store.transaction():
            webhooks.on_terminal(run)
            raise RuntimeError("the transition failed")

    with pytest.raises(RuntimeError):
        aborted()
    time.sleep(0.3)  # a few of the worker's passes
    assert deliveries(server, bank, hook["id"]) == []
    assert services.webhook_store.event_body(f"{run.id}:run.completed") is None

    def committed() -> None:
        with services.run_store.transaction():
            webhooks.on_terminal(run)

    committed()
    log = wait_for(lambda: len(d := deliveries(server, bank, hook["id"])) == 2 and d, 10)
    assert {d["event_type"] for d in log} == {"retain.completed", "run.completed"}


def test_private_targets_are_refused_without_the_setting(tmp_path: Path) -> None:
    with receiver() as rec, live_server(create_app(Settings(data_dir=tmp_path))) as srv:
        bank = new_bank(srv)
        for url, address in [
            (f"{rec.url}/x", "127.0.0.1"),
            ("http://localhost:9/x", "127.0.0.1"),
            ("http://10.1.2.3/x", "10.1.2.3"),
            ("http://192.168.0.10/x", "192.168.0.10"),
            ("http://169.254.169.254/latest/meta-data", "169.254.169.254"),
            ("http://[::1]:8080/x", "::1"),
            ("http://[::ffff:127.0.0.1]/x", "127.0.0.1"),
            ("http://0.0.0.0/x", "0.0.0.0"),
        ]:
            r = create_hook(srv, bank, url=url)
            assert r.status_code == 400, (url, r.text)
            detail = r.json()["detail"]
            assert repr(url) in detail and f"resolves to {address}" in detail, detail
            assert "HEED_WEBHOOK_ALLOW_PRIVATE" in detail
        unresolvable = create_hook(srv, bank, url="http://no-such-host.invalid/x")
        assert unresolvable.status_code == 400 and "does not resolve" in unresolvable.text
        assert httpx.get(f"{srv.url}/v1/default/banks/{bank}/webhooks").json()["total"] == 0
        assert rec.received == []


def test_check_target_refuses_every_private_answer() -> None:
    with pytest.raises(TargetRefused, match=r"resolves to 127\.0\.0\.1"):
        check_target("http://localhost/", allow_private=False)
    check_target("http://localhost/", allow_private=True)  # the setting lets it through
    with pytest.raises(TargetRefused, match="must be http"):
        check_target("file:///etc/passwd", allow_private=True)


def test_shutdown_stops_a_send_in_flight_and_gives_its_lease_back(tmp_path: Path) -> None:
    with receiver() as rec:
        path = "/slow"
        rec.delays[path] = 5.0
        app = create_app(_settings(tmp_path))
        with live_server(app) as srv:
            bank = new_bank(srv)
            hook = create_hook(
                srv, bank, url=f"{rec.url}{path}", event_types=["run.completed"]
            ).json()
            async_retain(srv, bank, "Eve knits scarves.")
            wait_for(lambda: rec.at(path), 20)
            started = time.monotonic()
        stopped_in = time.monotonic() - started
        assert stopped_in < 4.5  # did not wait for the receiver's 5 s
        # The server is gone: read its database afresh.
        store = SqlWebhookStore(SqliteDatabase(app.state.services.settings.database_path()))
        found = store.get_by_id(hook["id"])
        assert found is not None
        [delivery] = store.deliveries("default", found.bank_ref, hook["id"], 10, None)
        assert delivery.status == "pending" and delivery.attempts == 0
        assert delivery.lease_owner is None and delivery.lease_until is None


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_two_instances_deliver_each_event_once(tmp_path: Path, database: str) -> None:
    with receiver() as rec:
        path = "/once"

        def pair(url: str | None) -> Iterator[tuple[LiveServer, LiveServer]]:
            shared = tmp_path / "shared"
            a = create_app(_settings(shared, url, webhook_poll_seconds=0.02))
            b = create_app(_settings(shared, url, webhook_poll_seconds=0.02))
            with live_server(a) as srv_a, live_server(b) as srv_b:
                yield srv_a, srv_b

        def run(srv_a: LiveServer, srv_b: LiveServer) -> None:
            bank = new_bank(srv_a)
            hook = create_hook(srv_a, bank, url=f"{rec.url}{path}").json()
            operations = [
                async_retain(srv_a if i % 2 else srv_b, bank, f"Fact {i}: Finn owns {i} kites.")
                for i in range(8)
            ]
            expected = 2 * len(operations)
            log = wait_for(
                lambda: (
                    (d := _all_deliveries(srv_b, bank, hook["id"]))
                    and sum(x["status"] == "delivered" for x in d) == expected
                    and d
                ),
                60,
            )
            assert len(log) == expected
            time.sleep(0.5)
            arrived = Counter(r.headers["X-Heed-Delivery"] for r in rec.at(path))
            assert len(arrived) == expected
            assert set(arrived.values()) == {1}, arrived
            workers = [s.app.state.services.webhook_worker for s in (srv_a, srv_b)]
            assert sum(w.sent for w in workers) == expected

        if database == "sqlite":
            for srv_a, srv_b in pair(None):
                run(srv_a, srv_b)
        else:
            with fresh_schema() as url:
                for srv_a, srv_b in pair(url):
                    run(srv_a, srv_b)


def _all_deliveries(server: LiveServer, bank: str, webhook_id: str) -> list[dict[str, Any]]:
    r = httpx.get(
        f"{server.url}/v1/default/banks/{bank}/webhooks/{webhook_id}/deliveries",
        params={"limit": 200},
        timeout=30,
    )
    r.raise_for_status()
    return list(r.json()["items"])
