"""The outside probe's findings (issue 14), each against a real server on loopback.

Two servers: one with two API keys (tenants ``a`` and ``b``, scripted LLM), one
with no keys (the embedded default: loopback only, Host allow-list).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from heed.api.app import create_app
from heed.settings import Settings
from tests.support import LiveServer, live_server, wait_for

KEY_A, KEY_B, METRICS_KEY = "key-a-0123456789", "key-b-0123456789", "metrics-0123456789"
A = {"Authorization": f"Bearer {KEY_A}"}
B = {"Authorization": f"Bearer {KEY_B}"}
BIG = "9223372036854775808"  # 2**63
DOCS_MEMORIES = "/v1/default/banks/docs/memories"


def _json(body: str) -> dict[str, str]:
    return {**A, "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("keyed"),
        llm_provider="scripted",
        api_keys={KEY_A: "a", KEY_B: "b"},
        metrics_key=METRICS_KEY,
        auth_max_failures=0,  # these tests send wrong keys on purpose, many times
    )
    with live_server(create_app(settings)) as srv:
        yield srv


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = Settings(data_dir=tmp_path_factory.mktemp("open"), llm_provider="scripted")
    with live_server(create_app(settings)) as srv:
        yield srv


@pytest.fixture
def http(keyed: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=keyed.url, headers=A, timeout=30) as client:
        yield client


def _raw_post(client: httpx.Client, path: str, raw: str) -> httpx.Response:
    """POST a JSON text as written (so ``\\ud800`` escapes reach the server as sent)."""
    return client.post(path, content=raw.encode(), headers={"Content-Type": "application/json"})


def _bank(client: httpx.Client, bank: str) -> None:
    assert client.put(f"/v1/default/banks/{bank}", json={}).status_code == 200


# -- 1 and 10: response_schema -------------------------------------------------------------


class _SilentListener:
    """A TCP listener that records what it receives and never answers."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            conn.settimeout(1)
            with contextlib.suppress(TimeoutError):
                self.received.append(conn.recv(4096))

    def close(self) -> None:
        self._stop = True
        self._thread.join(2)
        self.sock.close()


@pytest.mark.parametrize(
    "ref",
    ["http://127.0.0.1:{port}/x.json", "file:///etc/passwd", "x.json", "#anchor"],
)
def test_response_schema_with_a_non_local_ref_is_refused_and_nothing_is_fetched(
    http: httpx.Client, ref: str
) -> None:
    _bank(http, "schema-ref")
    listener = _SilentListener()
    try:
        started = time.monotonic()
        r = http.post(
            "/v1/default/banks/schema-ref/reflect",
            json={"query": "q", "response_schema": {"$ref": ref.format(port=listener.port)}},
        )
        assert r.status_code == 400, r.text
        assert "$ref" in r.json()["detail"]
        assert time.monotonic() - started < 5
        time.sleep(0.2)
        assert listener.received == []
    finally:
        listener.close()


def test_remote_ref_nested_in_defs_is_refused(http: httpx.Client) -> None:
    _bank(http, "schema-ref")
    schema = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/x"}},
        "$defs": {"x": {"allOf": [{"$ref": "https://example.invalid/s.json"}]}},
    }
    r = http.post(
        "/v1/default/banks/schema-ref/reflect", json={"query": "q", "response_schema": schema}
    )
    assert r.status_code == 400 and "$ref" in r.json()["detail"], r.text


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#"},
        {"allOf": [{"$ref": "#/$defs/a"}], "$defs": {"a": {"anyOf": [{"$ref": "#"}]}}},
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    ],
)
def test_self_referencing_schema_is_refused(http: httpx.Client, schema: dict[str, Any]) -> None:
    _bank(http, "schema-ref")
    r = http.post(
        "/v1/default/banks/schema-ref/reflect", json={"query": "q", "response_schema": schema}
    )
    assert r.status_code == 400 and "itself" in r.json()["detail"], r.text


def test_recursive_schema_that_descends_is_accepted(http: httpx.Client) -> None:
    _bank(http, "schema-ref")
    tree = {
        "type": "object",
        "properties": {"children": {"type": "array", "items": {"$ref": "#"}}},
        "$defs": {"unused": {"type": "string"}},
    }
    r = http.post(
        "/v1/default/banks/schema-ref/reflect", json={"query": "q", "response_schema": tree}
    )
    assert r.status_code == 200, r.text


def test_deeply_nested_schema_is_a_400_not_a_500(http: httpx.Client) -> None:
    _bank(http, "schema-ref")
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(100):
        schema = {"type": "object", "properties": {"p": schema}}
    r = http.post(
        "/v1/default/banks/schema-ref/reflect", json={"query": "q", "response_schema": schema}
    )
    assert r.status_code == 400 and "deeper" in r.json()["detail"], r.text


def test_oversized_schema_is_refused(http: httpx.Client) -> None:
    _bank(http, "schema-ref")
    schema = {"type": "object", "description": "x" * 40_000}
    r = http.post(
        "/v1/default/banks/schema-ref/reflect", json={"query": "q", "response_schema": schema}
    )
    assert r.status_code == 400 and "bytes" in r.json()["detail"], r.text


# -- 2 and 3: lone surrogates ----------------------------------------------------------------

SURROGATE = "\\ud800"


@pytest.mark.parametrize(
    "raw",
    [
        '{"items":[{"content":"ok","tags":["%s"]}]}',
        '{"items":[{"content":"ok","metadata":{"k":"%s"}}]}',
        '{"items":[{"content":"ok","metadata":{"%s":"v"}}]}',
        '{"items":[{"content":"ok"}],"document_tags":["%s"]}',
        '{"items":[{"content":"ok %s"}]}',
        '{"items":[{"content":"ok","context":"%s"}]}',
        '{"items":[{"content":"ok","document_id":"d%s"}]}',
        '{"items":[{"content":[{"type":"text","text":"%s"}]}]}',
    ],
)
def test_retain_with_a_lone_surrogate_is_refused_and_the_bank_stays_readable(
    http: httpx.Client, raw: str
) -> None:
    _bank(http, "poison")
    r = _raw_post(http, "/v1/default/banks/poison/memories", raw % SURROGATE)
    assert r.status_code == 400, r.text
    assert "surrogate" in r.json()["detail"]
    for path in ("/memories/list", "/documents"):
        assert http.get(f"/v1/default/banks/poison{path}").status_code == 200
    recall = http.post("/v1/default/banks/poison/memories/recall", json={"query": "ok"})
    assert recall.status_code == 200


def test_valid_surrogate_pairs_are_accepted(http: httpx.Client) -> None:
    _bank(http, "emoji")
    r = _raw_post(
        http,
        "/v1/default/banks/emoji/memories",
        '{"items":[{"content":"Alice loves cats \\ud83d\\ude3a","tags":["\\ud83d\\ude3a"]}]}',
    )
    assert r.status_code == 200, r.text
    items = http.get("/v1/default/banks/emoji/memories/list").json()["items"]
    assert any("\U0001f63a" in (i["tags"] or []) for i in items)


@pytest.mark.parametrize(
    ("method", "path", "raw"),
    [
        ("POST", "/v1/sessions", '{"title":"%s"}'),
        ("PUT", "/v1/default/banks/sur", '{"name":"%s"}'),
        ("PUT", "/v1/default/banks/sur", '{"mission":"%s"}'),
        ("PATCH", "/v1/default/banks/sur", '{"background":"%s"}'),
        ("POST", "/v1/default/banks/sur/memories/recall", '{"query":"%s"}'),
        ("POST", "/v1/default/banks/sur/reflect", '{"query":"%s"}'),
        ("POST", "/v1/sessions", '{"%s":1}'),
        ("POST", "/v1/default/banks/sur/memories", '{"items":[{"content":1, "x":"%s"}]}'),
    ],
)
def test_lone_surrogate_anywhere_is_a_400_and_the_connection_survives(
    http: httpx.Client, method: str, path: str, raw: str
) -> None:
    _bank(http, "sur")
    r = http.request(
        method,
        path,
        content=(raw % SURROGATE).encode(),
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 400, r.text
    assert "surrogate" in r.json()["detail"]
    assert http.get("/health").status_code == 200  # same keep-alive connection


def test_lone_surrogate_in_session_patch_and_turn(http: httpx.Client) -> None:
    session = http.post("/v1/sessions", json={"title": "t"}).json()
    sid = session["id"]
    for method, path, raw in (
        ("PATCH", f"/v1/sessions/{sid}", '{"title":"%s"}'),
        ("POST", f"/v1/sessions/{sid}/turns", '{"content":"%s"}'),
    ):
        r = http.request(
            method, path, content=(raw % SURROGATE).encode(), headers={"Content-Type": "x/json"}
        )
        assert r.status_code == 400, r.text
    assert http.get(f"/v1/sessions/{sid}").json()["title"] == "t"


def test_invalid_utf8_body_is_a_400_on_every_route(http: httpx.Client) -> None:
    for path in ("/v1/sessions", "/v1/default/banks/sur/memories/recall"):
        r = http.post(path, content=b'{"title":"\xff"}', headers={"Content-Type": "x/json"})
        assert r.status_code == 400 and "UTF-8" in r.json()["detail"], r.text


# -- 8, 9, 11: integers, cursors, ids ---------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/v1/default/banks?offset=" + BIG,
        "/v1/default/banks/ints/documents?offset=" + BIG,
        "/v1/default/banks/ints/memories/list?offset=" + BIG,
        "/v1/default/banks/ints/operations?offset=" + BIG,
        "/v1/default/banks/ints/memories/list?limit=" + BIG,
        "/v1/sessions?limit=" + BIG,
    ],
)
def test_huge_integers_in_the_query_are_422(http: httpx.Client, path: str) -> None:
    _bank(http, "ints")
    r = http.get(path)
    assert r.status_code == 422, r.text


@pytest.mark.parametrize(
    "body",
    [
        {"query": "q", "max_tokens": int(BIG)},
        {"query": "q", "include": {"chunks": {"max_tokens": int(BIG)}}},
    ],
)
def test_huge_integers_in_bodies_are_422(http: httpx.Client, body: dict[str, Any]) -> None:
    _bank(http, "ints")
    r = http.post("/v1/default/banks/ints/memories/recall", json=body)
    assert r.status_code == 422, r.text


def _finished_run(http: httpx.Client) -> str:
    sid = http.post("/v1/sessions", json={}).json()["id"]
    run_id = http.post(f"/v1/sessions/{sid}/turns", json={"content": "hi"}).json()["run_id"]
    wait_for(lambda: http.get(f"/v1/runs/{run_id}").json()["phase"] == "completed", 20)
    return str(run_id)


@pytest.mark.parametrize(
    ("query", "headers"),
    [
        ("?after=" + BIG, {}),
        ("", {"Last-Event-ID": BIG}),
        ("", {"Last-Event-ID": "-5"}),
        ("", {"Last-Event-ID": "nine"}),
        ("?after=" + "9" * 400, {}),
    ],
)
def test_stream_cursor_edge_values_end_the_stream_cleanly(
    http: httpx.Client, query: str, headers: dict[str, str]
) -> None:
    run_id = _finished_run(http)
    with http.stream("GET", f"/v1/runs/{run_id}/stream{query}", headers=headers) as r:
        assert r.status_code == 200
        body = r.read().decode()  # raises RemoteProtocolError if the body is cut off
    assert body.startswith("retry:")


def test_document_id_with_slashes_can_be_read_and_deleted(http: httpx.Client) -> None:
    _bank(http, "docs")
    r = http.post(
        "/v1/default/banks/docs/memories",
        json={"items": [{"content": "Alice likes tea.", "document_id": "dir/sub/doc"}]},
    )
    assert r.status_code == 200, r.text
    for path in ("dir/sub/doc", "dir%2Fsub%2Fdoc"):
        got = http.get(f"/v1/default/banks/docs/documents/{path}")
        assert got.status_code == 200 and got.json()["id"] == "dir/sub/doc", got.text
    assert http.delete("/v1/default/banks/docs/documents/dir%2Fsub%2Fdoc").status_code == 200
    assert http.get("/v1/default/banks/docs/documents/dir/sub/doc").status_code == 404


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        (
            "POST",
            "/v1/default/banks/docs/memories",
            {"items": [{"content": "x", "document_id": "d" * 600}]},
        ),
        (
            "POST",
            "/v1/default/banks/docs/memories",
            {"items": [{"content": "x", "tags": ["t" * 300]}]},
        ),
        ("POST", "/v1/sessions", {"title": "t" * 600}),
        ("POST", "/v1/sessions", {"bank_id": "b" * 600}),
        ("PUT", "/v1/default/banks/docs", {"name": "n" * 600}),
        ("PUT", "/v1/default/banks/" + "b" * 600, {}),
        ("GET", "/v1/default/banks/docs/documents/" + "d" * 600, None),
        ("POST", "/v1/runs/r/cancel?reason=" + "r" * 300, None),
    ],
)
def test_overlong_ids_and_names_are_422(
    http: httpx.Client, method: str, path: str, body: dict[str, Any] | None
) -> None:
    _bank(http, "docs")
    r = http.request(method, path, json=body)
    assert r.status_code == 422, r.text
    assert http.get("/v1/default/banks/docs/documents").json()["total"] == 0


# -- 4: the web UI with keys ------------------------------------------------------------------


def test_ui_and_health_are_public_and_health_reveals_nothing(keyed: LiveServer) -> None:
    with httpx.Client(base_url=keyed.url) as anon:
        assert anon.get("/").status_code == 200
        assert anon.get("/ui/app.js").status_code == 200
        health = anon.get("/health")
        assert health.status_code == 200 and health.json() == {"status": "healthy"}
        assert anon.get("/v1/sessions").status_code == 401
        assert anon.get("/v1/default/banks").status_code == 401
        session = anon.get("/v1/auth/session").json()
        assert session == {
            "keys_required": True,
            "authenticated": False,
            "tenant": None,
            "csrf_token": None,
        }


def test_login_sets_a_strict_httponly_cookie_and_csrf_guards_writes(keyed: LiveServer) -> None:
    with httpx.Client(base_url=keyed.url) as browser:
        assert browser.post("/v1/auth/login", json={"key": "nope"}).status_code == 401
        r = browser.post("/v1/auth/login", json={"key": KEY_A})
        assert r.status_code == 200, r.text
        cookies = r.headers.get_list("set-cookie")
        session_cookie = next(c for c in cookies if c.startswith("heed_session="))
        assert "HttpOnly" in session_cookie and "SameSite=strict" in session_cookie
        csrf = r.json()["csrf_token"]
        assert browser.get("/v1/auth/session").json()["tenant"] == "a"
        assert browser.get("/v1/sessions").status_code == 200
        # A write without the CSRF header is refused and creates nothing.
        assert browser.post("/v1/sessions", json={"title": "csrf"}).status_code == 403
        wrong = browser.post("/v1/sessions", json={"title": "x"}, headers={"X-Heed-CSRF": "0"})
        assert wrong.status_code == 403
        odd = browser.post(
            "/v1/sessions", json={"title": "x"}, headers={"X-Heed-CSRF": "\u00e9".encode("latin-1")}
        )
        assert odd.status_code == 403
        listed = browser.get("/v1/sessions").json()["sessions"]
        assert all(s["title"] not in {"csrf", "x"} for s in listed)
        made = browser.post("/v1/sessions", json={"title": "ok"}, headers={"X-Heed-CSRF": csrf})
        assert made.status_code == 201
        # The cookie belongs to tenant a: tenant b's view does not see the session.
        with httpx.Client(base_url=keyed.url, headers=B) as b:
            ids = {s["id"] for s in b.get("/v1/sessions").json()["sessions"]}
            assert made.json()["id"] not in ids
        browser.post("/v1/auth/logout", headers={"X-Heed-CSRF": csrf})
        assert browser.get("/v1/sessions").status_code == 401


def test_forged_or_foreign_cookie_is_refused(keyed: LiveServer) -> None:
    with httpx.Client(base_url=keyed.url) as browser:
        value = browser.post("/v1/auth/login", json={"key": KEY_A}).cookies["heed_session"]
        principal, _, rest = value.partition(".")
        forged = f"{principal}.{rest[:-2]}xx"
    with httpx.Client(base_url=keyed.url, headers={"Cookie": f"heed_session={forged}"}) as c:
        assert c.get("/v1/sessions").status_code == 401


def test_a_login_ends_when_its_key_is_revoked(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, llm_provider="scripted", api_keys={KEY_A: "a"})
    with live_server(create_app(settings)) as srv, httpx.Client(base_url=srv.url) as browser:
        browser.post("/v1/auth/login", json={"key": KEY_A})
        cookie = browser.cookies["heed_session"]
    settings = Settings(data_dir=tmp_path, llm_provider="scripted", api_keys={KEY_B: "a"})
    with (
        live_server(create_app(settings)) as srv,
        httpx.Client(base_url=srv.url, headers={"Cookie": f"heed_session={cookie}"}) as browser,
    ):
        assert browser.get("/v1/sessions").status_code == 401
        # ...and the stale cookie does not lock the browser out of the page or a new login
        assert browser.get("/").status_code == 200
        assert browser.get("/v1/auth/session").json()["authenticated"] is False
        assert browser.post("/v1/auth/login", json={"key": KEY_B}).status_code == 200


# -- 5: Host allow-list ------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:80", "127.0.0.2.nip.io"])
def test_no_keys_mode_refuses_foreign_host_headers(open_server: LiveServer, host: str) -> None:
    r = httpx.get(f"{open_server.url}/v1/sessions", headers={"Host": host})
    assert r.status_code == 400 and "HEED_ALLOWED_HOSTS" in r.json()["detail"], r.text
    r = httpx.get(f"{open_server.url}/health", headers={"Host": host})
    assert r.status_code == 400


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "[::1]:8700", "LOCALHOST:1"])
def test_no_keys_mode_answers_loopback_host_names(open_server: LiveServer, host: str) -> None:
    r = httpx.get(f"{open_server.url}/v1/sessions", headers={"Host": host})
    assert r.status_code == 200, r.text


def test_allowed_hosts_is_settable(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, llm_provider="scripted", allowed_hosts="heed.lan")
    with live_server(create_app(settings)) as srv:
        assert httpx.get(f"{srv.url}/health", headers={"Host": "heed.lan:1"}).status_code == 200
        assert httpx.get(f"{srv.url}/health", headers={"Host": "localhost"}).status_code == 400


# -- 7 and 12: metrics -------------------------------------------------------------------------


def _metrics(keyed: LiveServer) -> str:
    r = httpx.get(f"{keyed.url}/metrics", headers={"Authorization": f"Bearer {METRICS_KEY}"})
    assert r.status_code == 200
    return r.text


def test_random_methods_and_paths_do_not_grow_metrics(keyed: LiveServer) -> None:
    with httpx.Client(base_url=keyed.url) as anon:
        for i in range(40):
            # httptools refuses a method it does not know before the app sees it; one it
            # knows but heed does not use (PURGE) reaches the app and folds to "other".
            anon.request(f"M{i}X", f"/random/{i}")
            anon.request("PURGE", f"/random/{i}")
            anon.post(f"/v1/runs/r{i}/cancel", params={"reason": f"r{i}"}, headers=A)
    text = _metrics(keyed)
    assert "M1X" not in text and "/random/" not in text
    assert 'method="other"' in text
    reasons = {
        line.split('reason="')[1].split('"')[0]
        for line in text.splitlines()
        if "heed_cancellations_total{reason=" in line
    }
    assert len(reasons) <= 33


def test_metrics_need_the_metrics_key(keyed: LiveServer) -> None:
    for headers in ({}, A, B, {"Authorization": "Bearer wrong"}):
        r = httpx.get(f"{keyed.url}/metrics", headers=headers)
        assert r.status_code in (401, 403), r.text
        assert "heed_http_requests" not in r.text
    assert "heed_http_requests" in _metrics(keyed)


def test_error_answers_echo_nothing_unencodable(http: httpx.Client) -> None:
    # A 422 for a wrong type echoes the input; it must still be valid JSON.
    r = http.post("/v1/sessions", json={"title": ["not", "a", "string"]})
    assert r.status_code == 422
    json.loads(r.text)
