"""Webhooks under abuse (issue 37, findings 6, 7, 9 and 10), over a real server and real
receivers on loopback:

- a slow target (an answer that drips a byte a second) holds only its own share of the
  senders, and each try ends at its deadline, however slowly the answer drips;
- a bank holds at most ``HEED_WEBHOOK_MAX_PER_BANK`` webhooks; a run's event is stored once
  and small, whatever the number of webhooks and the size of the run's result, and its
  deliveries are written outside the run's transaction; the delivery log is cut by count
  and by age (both databases);
- an IPv6 address embedding an IPv4 one is checked as that IPv4 address;
- a try resolves the target once and connects to the address it checked (a name that
  rebinds meanwhile does not reach the other address), keeping the host name for the
  ``Host`` header and the TLS server name and certificate; a receiver's answer is kept
  only as a short excerpt.

And what held before, kept: a redirect to a refused address fails the delivery, secrets
are never shown after the answer that set them nor logged.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme

from heed.api.app import create_app
from heed.memory.models import InvalidInput
from heed.runs.model import Phase, Run
from heed.settings import Settings
from heed.transfer.sections.webhooks import MAX_WEBHOOKS
from heed.webhooks import targets
from heed.webhooks.events import MAX_BODY_BYTES
from heed.webhooks.models import HttpConfig, Webhook
from tests.pg_support import fresh_schema
from tests.support import LiveServer, live_server, wait_for
from tests.webhooks.receiver import receiver
from tests.webhooks.support import FakeDns

KEY_A, KEY_B = "hooks-key-a-0123456789", "hooks-key-b-0123456789"
SECRET = "whsec-never-shown-twice-0123"
TOKEN = "receiver-token-in-the-query"
HEADER = "receiver-token-in-a-header"


def _settings(data_dir: Path, url: str | None = None, **extra: Any) -> Settings:
    fields: dict[str, Any] = {
        "webhook_allow_private": True,
        "webhook_poll_seconds": 0.05,
        "webhook_backoff_seconds": 0.05,
        "webhook_max_attempts": 3,
        "llm_provider": "scripted",
        **extra,
    }
    return Settings(data_dir=data_dir, database_url=url, **fields)


@contextmanager
def _server(tmp_path: Path, database: str = "sqlite", **extra: Any) -> Iterator[LiveServer]:
    data = tmp_path / f"data-{uuid.uuid4().hex[:6]}"
    if database == "sqlite":
        with live_server(create_app(_settings(data, **extra))) as srv:
            yield srv
        return
    with fresh_schema() as url, live_server(create_app(_settings(data, url, **extra))) as srv:
        yield srv


@contextmanager
def _served(
    tmp_path: Path, database: str = "sqlite", **extra: Any
) -> Iterator[tuple[LiveServer, httpx.Client]]:
    with _server(tmp_path, database, **extra) as srv, _client(srv) as http:
        yield srv, http


def _client(server: LiveServer, key: str | None = None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=server.url, headers=headers, timeout=30)


def _bank(http: httpx.Client) -> str:
    bank = "hooks-" + uuid.uuid4().hex[:8]
    http.put(f"/v1/default/banks/{bank}", json={}).raise_for_status()
    return bank


def _hook(http: httpx.Client, bank: str, url: str, **body: Any) -> dict[str, Any]:
    r = http.post(f"/v1/default/banks/{bank}/webhooks", json={"url": url, **body})
    assert r.status_code == 201, r.text
    return dict(r.json())


def _retain(http: httpx.Client, bank: str, items: list[str]) -> str:
    r = http.post(
        f"/v1/default/banks/{bank}/memories",
        json={"items": [{"content": text} for text in items], "async": True},
    )
    r.raise_for_status()
    return str(r.json()["operation_id"])


def _log(http: httpx.Client, bank: str, hook_id: str) -> list[dict[str, Any]]:
    r = http.get(f"/v1/default/banks/{bank}/webhooks/{hook_id}/deliveries", params={"limit": 200})
    r.raise_for_status()
    return list(r.json()["items"])


def _count(server: LiveServer, sql: str, *args: Any) -> int:
    with server.app.state.services.database.read() as conn:
        return int(conn.execute(sql, args).fetchone()[0])


# -- finding 6: one slow target --------------------------------------------------------------


def test_a_slow_target_holds_only_its_share_and_never_delays_another_tenant(
    tmp_path: Path,
) -> None:
    """Tenant A's two webhooks point at a target that answers 200 with ``Content-Length:
    100000`` and then a byte a second; A's runs queue six deliveries to it. Tenant B's
    delivery, queued while they drip, arrives at once; A holds at most its share of the
    senders (one per webhook here, two for the tenant)."""
    with receiver() as slow, receiver() as fast:
        slow.drips["/drip"] = 1.0
        most_dripping = 0
        settings: dict[str, Any] = {
            "api_keys": {KEY_A: "a", KEY_B: "b"},
            "webhook_concurrency": 4,
            "webhook_concurrency_per_tenant": 2,
            "webhook_concurrency_per_webhook": 1,
        }
        with (
            _server(tmp_path, **settings) as srv,
            _client(srv, KEY_A) as a,
            _client(srv, KEY_B) as b,
        ):
            bank_a = _bank(a)
            for _ in range(2):
                _hook(
                    a,
                    bank_a,
                    f"{slow.url}/drip",
                    event_types=["run.completed"],
                    http_config={"timeout_seconds": 60},
                )
            for i in range(3):
                _retain(a, bank_a, [f"Ann planted {i} tulips."])
            wait_for(lambda: slow.dripping >= 2, 30)
            bank_b = _bank(b)
            _hook(b, bank_b, f"{fast.url}/b", event_types=["run.completed"])
            queued = time.monotonic()
            _retain(b, bank_b, ["Ben fixed the gate."])
            deadline = time.monotonic() + 30
            while not fast.at("/b") and time.monotonic() < deadline:
                most_dripping = max(most_dripping, slow.dripping)
                time.sleep(0.02)
            arrived = fast.at("/b")
            assert arrived, "tenant B's delivery waited behind tenant A's slow target"
            assert arrived[0].at - queued < 10  # a retain and a poll: well under a second
            most_dripping = max(most_dripping, slow.dripping)
            assert most_dripping <= 2  # A's share: one sender per webhook
            assert len(slow.at("/drip")) <= 2  # the other four wait their turn


def test_a_try_ends_at_its_deadline_however_slowly_the_answer_drips(tmp_path: Path) -> None:
    """httpx's timeout is per read, so a byte a second never trips it: the try has one
    deadline, ``timeout_seconds``, for all of it. The receiver answered 200, so the
    delivery is delivered, with what arrived of the body as its excerpt."""
    with receiver() as slow, _server(tmp_path) as srv, _client(srv) as http:
        slow.drips["/drip"] = 1.0
        bank = _bank(http)
        hook = _hook(
            http,
            bank,
            f"{slow.url}/drip",
            event_types=["run.completed"],
            http_config={"timeout_seconds": 2},
        )
        _retain(http, bank, ["Cleo paints lighthouses."])
        [arrived] = wait_for(lambda: slow.at("/drip"), 30)
        [entry] = wait_for(
            lambda: [d for d in _log(http, bank, hook["id"]) if d["status"] != "pending"], 15
        )
        recorded = time.monotonic() - arrived.at
        assert recorded < 10, recorded  # 2 s and a poll; the old try read for over an hour
        assert entry["status"] == "delivered" and entry["last_response_status"] == 200
        assert entry["attempts"] == 1
        assert set(entry["last_response_body"]) <= {"x"} and len(entry["last_response_body"]) < 10
        wait_for(lambda: slow.dripping == 0, 5)  # heed hung up: the drip stopped
        assert slow.dripped and max(slow.dripped) < 10


def test_a_try_that_gets_no_answer_fails_at_its_deadline(tmp_path: Path) -> None:
    with receiver() as silent, _server(tmp_path) as srv, _client(srv) as http:
        silent.delays["/silent"] = 8.0
        bank = _bank(http)
        hook = _hook(
            http,
            bank,
            f"{silent.url}/silent",
            event_types=["run.completed"],
            http_config={"timeout_seconds": 1},
        )
        _retain(http, bank, ["Dev keeps bees."])
        [arrived] = wait_for(lambda: silent.at("/silent"), 30)
        entry = wait_for(
            lambda: (d := _log(http, bank, hook["id"])) and d[0]["attempts"] >= 1 and d[0], 10
        )
        assert time.monotonic() - arrived.at < 5
        assert "no answer within 1 s (http_config.timeout_seconds)" in entry["last_error"]


# -- finding 7: fan-out ------------------------------------------------------------------------


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_a_bank_holds_at_most_the_webhook_cap(tmp_path: Path, database: str) -> None:
    with receiver() as rec, _served(tmp_path, database, webhook_max_per_bank=3) as (srv, http):
        bank = _bank(http)
        hooks = [_hook(http, bank, f"{rec.url}/cap/{i}") for i in range(3)]
        refused = http.post(f"/v1/default/banks/{bank}/webhooks", json={"url": rec.url})
        assert refused.status_code == 409, refused.text
        detail = refused.json()["detail"]
        assert "already has 3 webhooks" in detail
        assert "HEED_WEBHOOK_MAX_PER_BANK=3" in detail
        assert http.get(f"/v1/default/banks/{bank}/webhooks").json()["total"] == 3
        other = _bank(http)
        _hook(http, other, f"{rec.url}/other")  # another bank has its own count
        http.delete(f"/v1/default/banks/{bank}/webhooks/{hooks[0]['id']}").raise_for_status()
        _hook(http, bank, f"{rec.url}/again")
        # Creates at once cannot pass a count of limit - 1 together.
        racing = _bank(http)
        statuses: list[int] = []

        def create() -> None:
            with _client(srv) as c:
                statuses.append(
                    c.post(
                        f"/v1/default/banks/{racing}/webhooks", json={"url": rec.url}
                    ).status_code
                )

        threads = [threading.Thread(target=create) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(statuses) == [201] * 3 + [409] * 5
        assert http.get(f"/v1/default/banks/{racing}/webhooks").json()["total"] == 3


def test_an_import_carrying_more_webhooks_than_a_bank_may_have_is_refused(
    tmp_path: Path,
) -> None:
    """The check a bank archive's import (or a clone) runs before it writes anything."""
    rows = [
        Webhook(
            id=f"wh_{i}",
            tenant="",
            bank_ref="",
            bank_id="",
            url=f"https://hooks.example.com/{i}",
            secret=SECRET,
            event_types=["run.completed"],
            enabled=True,
            http_config=HttpConfig(method="POST", timeout_seconds=10),
            created_at=0.0,
            updated_at=0.0,
        )
        for i in range(3)
    ]
    with _server(tmp_path, webhook_max_per_bank=2) as srv:
        webhooks = srv.app.state.services.webhooks
        with pytest.raises(InvalidInput, match=r"3 webhooks; .*HEED_WEBHOOK_MAX_PER_BANK=2"):
            webhooks.check_carried(rows)
        webhooks.check_carried(rows[:2])


def test_the_webhook_cap_is_what_an_archive_carries(tmp_path: Path) -> None:
    """A bank exported with as many webhooks as it may have imports again."""
    assert Settings(data_dir=tmp_path).webhook_max_per_bank == MAX_WEBHOOKS == 100
    with pytest.raises(ValueError, match="webhook_max_per_bank"):
        Settings(data_dir=tmp_path, webhook_max_per_bank=MAX_WEBHOOKS + 1)


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_an_event_is_stored_once_small_and_fanned_out_after_the_runs_transaction(
    tmp_path: Path, database: str
) -> None:
    """Twenty webhooks and a retain of 300 documents (a result of 300 document ids): each
    receiver gets a body of ids and counts, at most MAX_BODY_BYTES; the database holds one
    body per event (two rows), not one per delivery; inside the run's transaction only the
    event rows are written."""
    with receiver() as rec, _served(tmp_path, database, webhook_max_per_bank=25) as (srv, http):
        bank = _bank(http)
        hooks = [_hook(http, bank, f"{rec.url}/fan-{bank}/{i}") for i in range(20)]
        texts = [f"Fact {i}: Gil owns {i} marbles." for i in range(300)]
        operation = _retain(http, bank, texts)
        got = wait_for(
            lambda: (
                len(r := [x for x in rec.received if x.path.startswith(f"/fan-{bank}/")]) >= 40
                and r
            ),
            120,
        )
        assert len(got) == 40  # 20 webhooks x (retain.completed, run.completed)
        for request in got:
            assert len(request.body) <= MAX_BODY_BYTES
            data = request.json["data"]
            assert data["operation_id"] == operation
            assert data["result"]["items_count"] == 300
            assert data["result"]["documents"] == 300
            assert "document_ids" not in data["result"]  # the operation's GET has them
        events, stored = (
            _count(srv, f"SELECT {what} FROM webhook_events WHERE id LIKE ?", f"{operation}:%")
            for what in ("COUNT(*)", "COALESCE(SUM(LENGTH(body)), 0)")
        )
        assert events == 2 and stored <= 2 * MAX_BODY_BYTES
        with srv.app.state.services.database.read() as conn:
            columns = [
                d[0] for d in conn.execute("SELECT * FROM webhook_deliveries LIMIT 0").description
            ]
        assert "body" not in columns
        assert wait_for(
            lambda: all(
                {d["status"] for d in _log(http, bank, h["id"])} == {"delivered"} for h in hooks
            ),
            30,
        )

        # The run's transaction writes the events only; the worker writes the deliveries.
        services = srv.app.state.services
        stored_hook = services.webhook_store.get_by_id(hooks[0]["id"])
        assert stored_hook is not None
        run = Run(
            id="run_" + uuid.uuid4().hex[:8],
            kind="retain",
            tenant=stored_hook.tenant,
            phase=Phase.COMPLETED,
            created_at=time.time(),
            session_id=f"bank:{stored_hook.bank_ref}",
            result={"items_count": 1, "document_ids": ["d"] * 50_000},
        )
        inside: dict[str, int] = {}
        with services.run_store.transaction():
            services.webhooks.on_terminal(run)
            inside["events"] = _count(
                srv, "SELECT COUNT(*) FROM webhook_events WHERE id LIKE ?", f"{run.id}:%"
            )
            inside["deliveries"] = _count(
                srv,
                "SELECT COUNT(*) FROM webhook_deliveries WHERE event_id LIKE ?",
                f"{run.id}:%",
            )
            inside["bytes"] = _count(
                srv,
                "SELECT SUM(LENGTH(body)) FROM webhook_events WHERE id LIKE ?",
                f"{run.id}:%",
            )
        assert inside["events"] == 2 and inside["deliveries"] == 0
        assert inside["bytes"] <= 2 * MAX_BODY_BYTES
        wait_for(
            lambda: (
                _count(
                    srv,
                    "SELECT COUNT(*) FROM webhook_deliveries WHERE event_id LIKE ?",
                    f"{run.id}:%",
                )
                == 40
            ),
            30,
        )


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_the_delivery_log_keeps_the_newest_per_webhook(tmp_path: Path, database: str) -> None:
    with (
        receiver() as rec,
        _served(tmp_path, database, webhook_log_max_per_webhook=3) as (srv, http),
    ):
        bank = _bank(http)
        hook = _hook(http, bank, f"{rec.url}/kept", event_types=["run.completed"])
        operations = []
        for i in range(6):
            operations.append(_retain(http, bank, [f"Hana ran {i} km."]))
            wait_for(
                lambda n=i + 1: (
                    len(rec.at("/kept")) >= n
                    and all(d["status"] == "delivered" for d in _log(http, bank, hook["id"]))
                ),
                30,
            )
        log = _log(http, bank, hook["id"])
        assert len(log) == 3
        assert {d["event_id"] for d in log} == {f"{op}:run.completed" for op in operations[3:]}
        # The events of the deliveries that went are gone with them.
        assert (
            _count(srv, "SELECT COUNT(*) FROM webhook_events WHERE bank_ref = ?", _ref(srv, bank))
            == 3
        )


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_the_delivery_log_forgets_what_is_older_than_its_retention(
    tmp_path: Path, database: str
) -> None:
    extra = {"webhook_log_retention_seconds": 1.0, "webhook_prune_interval_seconds": 0.2}
    with receiver() as rec, _server(tmp_path, database, **extra) as srv, _client(srv) as http:
        bank = _bank(http)
        hook = _hook(http, bank, f"{rec.url}/aged")
        _retain(http, bank, ["Ivo reads maps."])
        wait_for(lambda: len(rec.at("/aged")) == 2, 30)
        wait_for(lambda: not _log(http, bank, hook["id"]), 10)
        ref = _ref(srv, bank)
        assert _count(srv, "SELECT COUNT(*) FROM webhook_events WHERE bank_ref = ?", ref) == 0


def _ref(server: LiveServer, bank: str) -> str:
    with server.app.state.services.database.read() as conn:
        row = conn.execute("SELECT ref FROM memory_banks WHERE bank_id = ?", (bank,)).fetchone()
    return str(row[0])


# -- finding 9: IPv6 forms embedding IPv4 ------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("http://[::127.0.0.1]/x", "resolves to 127.0.0.1 (embedded in ::7f00:1)"),
        ("http://[64:ff9b::a9fe:a9fe]/x", "resolves to 169.254.169.254 (embedded in"),
        ("http://[2002:7f00:1::]/x", "resolves to 127.0.0.1 (embedded in 2002:7f00:1::)"),
        ("http://[fec0::1]/x", "resolves to fec0::1, a site-local address"),
        ("http://192.0.0.9/x", "resolves to 192.0.0.9, an IETF protocol assignment"),
        ("http://[64:ff9b:1::a9fe:a9fe]/x", "a local-use NAT64 address"),
    ],
)
def test_ipv6_forms_embedding_ipv4_are_checked_as_their_ipv4(
    tmp_path: Path, url: str, words: str
) -> None:
    with live_server(create_app(Settings(data_dir=tmp_path / "d"))) as srv, _client(srv) as http:
        bank = _bank(http)
        r = http.post(f"/v1/default/banks/{bank}/webhooks", json={"url": url})
        assert r.status_code == 400, (url, r.text)
        assert words in r.json()["detail"], r.text
        assert "HEED_WEBHOOK_ALLOW_PRIVATE" in r.json()["detail"]
        assert http.get(f"/v1/default/banks/{bank}/webhooks").json()["total"] == 0


@pytest.mark.parametrize(
    "url",
    [
        "http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/x",  # Teredo
        "http://[::ffff:10.0.0.1]/x",
        "http://[::ffff:169.254.169.254]/x",
        "http://100.64.0.1/x",
        "http://[fd00::1]/x",
        "http://[fe80::1]/x",
        "http://127.1/x",
        "http://2130706433/x",
    ],
)
def test_the_literal_forms_refused_before_still_are(tmp_path: Path, url: str) -> None:
    with live_server(create_app(Settings(data_dir=tmp_path / "d"))) as srv, _client(srv) as http:
        bank = _bank(http)
        r = http.post(f"/v1/default/banks/{bank}/webhooks", json={"url": url})
        assert r.status_code == 400, (url, r.text)
        assert "resolves to" in r.json()["detail"] and "HEED_WEBHOOK_ALLOW_PRIVATE" in r.text


def test_public_addresses_in_every_form_pass() -> None:
    import ipaddress

    for address in ["8.8.8.8", "2606:4700:4700::1111", "64:ff9b::808:808", "2002:808:808::"]:
        assert targets.refusal(ipaddress.ip_address(address)) is None, address
    for address in ["192.88.99.1", "3fff::1", "5f00::1", "ff02::1", "::", "::1", "100.64.0.1"]:
        assert targets.refusal(ipaddress.ip_address(address)) is not None, address


# -- finding 10: one resolution, the checked address -------------------------------------------


@pytest.fixture
def public_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    """127.0.0.1 stands for a public address in these tests (the allow-list's own rules
    for everything else): a test can then reach a "public" target on loopback while
    127.0.0.2, ::1 and the rest stay refused."""
    real = targets.check_address

    def check(url: str, address: str) -> None:
        if address != "127.0.0.1":
            real(url, address)

    monkeypatch.setattr(targets, "check_address", check)


def test_a_rebinding_name_is_connected_at_the_address_that_was_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, public_loopback: None
) -> None:
    """``rebind.test`` answers the public address to the webhook's creation and to the
    try, then an internal one (127.0.0.2): a client that resolves again to connect would
    reach the internal service and show its answer in the log. The try connects to the
    address it checked, with the name in ``Host``."""
    with receiver("127.0.0.1") as public, receiver("127.0.0.2", public.port) as internal:
        internal.bodies["/hook"] = b"internal secret"
        dns = FakeDns(monkeypatch, {"rebind.test": ["127.0.0.1", "127.0.0.1", "127.0.0.2"]})
        settings = Settings(
            data_dir=tmp_path / "d", webhook_poll_seconds=0.05, llm_provider="scripted"
        )
        with live_server(create_app(settings)) as srv, _client(srv) as http:
            bank = _bank(http)
            url = f"http://rebind.test:{public.port}/hook"
            hook = _hook(http, bank, url, event_types=["run.completed"])
            _retain(http, bank, ["Jun tunes pianos."])
            [entry] = wait_for(
                lambda: [d for d in _log(http, bank, hook["id"]) if d["attempts"]], 30
            )
            assert internal.received == []
            [arrived] = public.at("/hook")
            assert arrived.headers["Host"] == f"rebind.test:{public.port}"
            assert entry["status"] == "delivered"
            assert "internal secret" not in str(entry)
            assert dns.calls["rebind.test"] == 2  # the creation's check, the try's one


def test_the_tls_server_name_and_certificate_are_the_urls_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The try connects to the resolved address, and TLS still names and verifies the URL's
    host: a certificate for ``hooks.test`` passes, one for another name does not."""
    ca = trustme.CA()
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)
    monkeypatch.setattr(httpx, "create_ssl_context", lambda *a, **k: trusting)
    FakeDns(monkeypatch, {"hooks.test": ["127.0.0.1"]})
    served: dict[str, ssl.SSLContext] = {}
    for name in ("hooks.test", "other.test"):
        served[name] = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert(name).configure_cert(served[name])
    with (
        receiver(tls=served["hooks.test"]) as good,
        receiver(tls=served["other.test"]) as bad,
        _served(tmp_path) as (_srv, http),
    ):
        bank = _bank(http)
        ok = _hook(http, bank, f"https://hooks.test:{good.port}/tls", event_types=["run.completed"])
        wrong = _hook(
            http, bank, f"https://hooks.test:{bad.port}/tls", event_types=["run.completed"]
        )
        _retain(http, bank, ["Kai restores clocks."])
        [entry] = wait_for(lambda: [d for d in _log(http, bank, ok["id"]) if d["attempts"]], 30)
        assert entry["status"] == "delivered", entry
        [arrived] = good.at("/tls")
        assert arrived.headers["Host"] == f"hooks.test:{good.port}"
        assert good.server_names == ["hooks.test"]
        [refused] = wait_for(
            lambda: [d for d in _log(http, bank, wrong["id"]) if d["attempts"]], 30
        )
        assert refused["status"] != "delivered"
        assert "certificate" in refused["last_error"].lower(), refused["last_error"]
        assert "hooks.test" in bad.server_names and bad.at("/tls") == []


def test_a_receivers_answer_is_kept_as_a_short_excerpt(tmp_path: Path) -> None:
    with receiver() as rec, _server(tmp_path) as srv, _client(srv) as http:
        rec.answers["/loud"] = (500, {})
        rec.bodies["/loud"] = b"E" * 10_000
        bank = _bank(http)
        hook = _hook(http, bank, f"{rec.url}/loud", event_types=["run.completed"])
        _retain(http, bank, ["Lia sews quilts."])
        entry = wait_for(
            lambda: (d := _log(http, bank, hook["id"])) and d[0]["attempts"] and d[0], 30
        )
        assert entry["last_response_status"] == 500
        assert entry["last_response_body"] == "E" * 256  # HEED_WEBHOOK_RESPONSE_EXCERPT_BYTES


# -- what held ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("location", "words"),
    [
        ("http://127.0.0.2:{port}/inside", "resolves to 127.0.0.2"),
        ("http://[::1]:{port}/inside", "resolves to ::1"),
        ("http://[::ffff:127.0.0.2]:{port}/inside", "resolves to 127.0.0.2"),
        ("file:///etc/passwd", "must be http or https"),
        ("http://user:pw@127.0.0.1:{port}/inside", "may not carry a user or password"),
    ],
)
def test_a_redirect_to_a_refused_target_fails_the_delivery(
    tmp_path: Path, public_loopback: None, location: str, words: str
) -> None:
    with receiver("127.0.0.1") as public, receiver("127.0.0.2", public.port) as internal:
        public.answers["/moved"] = (307, {"Location": location.format(port=public.port)})
        settings = Settings(
            data_dir=tmp_path / "d", webhook_poll_seconds=0.05, llm_provider="scripted"
        )
        with live_server(create_app(settings)) as srv, _client(srv) as http:
            bank = _bank(http)
            hook = _hook(http, bank, f"{public.url}/moved", event_types=["run.completed"])
            _retain(http, bank, ["Mo grows chillies."])
            [entry] = wait_for(
                lambda: [d for d in _log(http, bank, hook["id"]) if d["status"] == "failed"], 30
            )
            assert words in entry["last_error"], entry["last_error"]
            assert entry["attempts"] == 1  # refused: never tried again
            assert internal.received == [] and public.at("/inside") == []


def test_secrets_are_shown_once_and_never_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with receiver() as rec, _server(tmp_path) as srv, _client(srv) as http:
        rec.answers["/no"] = (500, {})
        bank = _bank(http)
        created = _hook(
            http,
            bank,
            f"{rec.url}/no?token={TOKEN}",
            secret=SECRET,
            http_config={"headers": {"Authorization": f"Bearer {HEADER}"}},
        )
        assert created["secret"] == SECRET  # the one answer that shows it
        hooks = f"/v1/default/banks/{bank}/webhooks"
        answers = [
            http.get(hooks),
            http.patch(f"{hooks}/{created['id']}", json={"enabled": True}),
            http.patch(f"{hooks}/{created['id']}", json={"url": f"{rec.url}/no?x=1&token={TOKEN}"}),
        ]
        _retain(http, bank, ["Nia climbs."])
        wait_for(
            lambda: (
                all(d["status"] == "failed" for d in _log(http, bank, created["id"]))
                and _log(http, bank, created["id"])
            ),
            30,
        )
        answers.append(http.get(f"{hooks}/{created['id']}/deliveries"))
        answers.append(http.get(f"/v1/default/banks/{bank}/operations"))
        for answer in answers:
            assert answer.status_code == 200, answer.text
            assert SECRET not in answer.text
        for request in rec.at("/no"):
            assert SECRET.encode() not in request.body
            assert all(SECRET not in value for value in request.headers.values())
            assert request.headers["Authorization"] == f"Bearer {HEADER}"
        assert rec.at("/no")  # it was sent, signed
        logged = "\n".join(r.getMessage() + str(r.args) for r in caplog.records)
        for secret in (SECRET, TOKEN, HEADER):  # nor the receiver's own, in its URL or headers
            assert secret not in logged, secret
