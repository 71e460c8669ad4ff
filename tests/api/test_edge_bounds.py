"""Issue 28's edge findings: no single request, connection or client can stop the server.

Each test drives a real server on loopback: one with two API keys (tenants ``a`` and
``b``) and short connection timeouts, so a stalled client is seen to be dropped within
seconds.
"""

from __future__ import annotations

import contextlib
import json
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from heed.api.app import create_app
from heed.memory.models import RetainItem
from heed.memory.retain.prepare import plan_documents
from heed.settings import Settings
from tests.support import LiveServer, live_server, wait_for

KEY_A, KEY_B = "key-a-0123456789", "key-b-0123456789"
A = {"Authorization": f"Bearer {KEY_A}"}
B = {"Authorization": f"Bearer {KEY_B}"}
HEAD_TIMEOUT = 0.5
BODY_TIMEOUT = 0.5


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("edge"),
        llm_provider="scripted",
        api_keys={KEY_A: "a", KEY_B: "b"},
        head_timeout_seconds=HEAD_TIMEOUT,
        body_timeout_seconds=BODY_TIMEOUT,
        max_in_flight=8,
        public_max_in_flight=4,
        auth_max_failures=10,
    )
    with live_server(create_app(settings)) as srv:
        yield srv


@pytest.fixture
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers=A, timeout=30) as client:
        yield client


def _connect(server: LiveServer) -> socket.socket:
    sock = socket.create_connection((server.host, server.port), timeout=10)
    return sock


class CloseWatch:
    """Watches sockets from a thread, from its creation on: what the server sends each and
    when it closes it (end of stream or a reset), so a test tells a close from silence and
    knows when it happened, however long the test takes to look."""

    def __init__(self, socks: list[socket.socket]) -> None:
        self.data: dict[socket.socket, bytearray] = {sock: bytearray() for sock in socks}
        self.closed_at: dict[socket.socket, float] = {}
        self._selector = selectors.DefaultSelector()
        for sock in socks:
            self._selector.register(sock, selectors.EVENT_READ)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set() and len(self.closed_at) < len(self.data):
            for key, _ in self._selector.select(timeout=0.05):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    chunk = sock.recv(65536)
                except (ConnectionResetError, BrokenPipeError):
                    chunk = b""
                except BlockingIOError:
                    continue
                if chunk:
                    self.data[sock] += chunk
                else:
                    self.closed_at[sock] = time.monotonic()
                    self._selector.unregister(sock)

    def wait(self, seconds: float) -> None:
        """Until every socket closed, or *seconds* passed; then stop watching."""
        self._thread.join(seconds)
        self._stop.set()
        self._thread.join()
        self._selector.close()

    def closed_by(self, sock: socket.socket, deadline: float) -> bytes:
        """What *sock* received; fails unless the server closed it by *deadline*."""
        closed_at = self.closed_at.get(sock)
        assert closed_at is not None, "still open: the server never closed it"
        assert closed_at <= deadline, f"closed {closed_at - deadline:.2f} s past its limit"
        return bytes(self.data[sock])


def _health_seconds(server: LiveServer) -> float:
    started = time.perf_counter()
    response = httpx.get(f"{server.url}/health", timeout=10)
    assert response.status_code == 200
    return time.perf_counter() - started


# -- row 1: tags are merged in linear time ----------------------------------------------


def test_plan_documents_merges_many_tags_in_linear_time() -> None:
    # Before: a list scan per tag (20,000 tags: 1.8 s on the event loop; 40,000: ~7 s).
    items = [
        RetainItem(content=f"item {i}", document_id="doc", tags=[f"t{i}-{j}" for j in range(40)])
        for i in range(1_000)
    ]
    started = time.perf_counter()
    (plan,) = plan_documents(items, [f"d{k}" for k in range(64)])
    assert time.perf_counter() - started < 2.0
    assert len(plan.tags) == 64 + 40_000
    assert plan.tags[:2] == ["d0", "d1"] and plan.tags[64] == "t0-0"


def test_a_retain_with_60000_tags_is_refused_by_count_at_once(
    server: LiveServer, http: httpx.Client
) -> None:
    assert http.put("/v1/default/banks/tags", json={}).status_code == 200
    body = {"items": [{"content": "x", "tags": [f"tag-{i}" for i in range(60_000)]}]}
    response = http.post("/v1/default/banks/tags/memories", json=body)
    assert response.status_code == 422
    assert "tags" in response.text and "64" in response.text
    listed = http.get("/v1/default/banks/tags/memories/list").json()
    assert listed["total"] == 0  # nothing half-written
    assert _health_seconds(server) < 5


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("document_tags", [f"d{i}" for i in range(65)]),
        ("items", [{"content": "x"}] * 5_001),
    ],
)
def test_request_lists_past_their_count_are_422(
    http: httpx.Client, field: str, value: list[Any]
) -> None:
    assert http.put("/v1/default/banks/counts", json={}).status_code == 200
    body: dict[str, Any] = {"items": [{"content": "x"}], field: value}
    response = http.post("/v1/default/banks/counts/memories", json=body)
    assert response.status_code == 422, response.text
    assert field in response.text


@pytest.mark.parametrize(
    "item",
    [
        {"content": "x", "entities": [{"text": f"E{i}"} for i in range(257)]},
        {"content": "x", "metadata": {f"k{i}": "v" for i in range(65)}},
    ],
)
def test_item_lists_past_their_count_are_422(http: httpx.Client, item: dict[str, Any]) -> None:
    assert http.put("/v1/default/banks/counts", json={}).status_code == 200
    response = http.post("/v1/default/banks/counts/memories", json={"items": [item]})
    assert response.status_code == 422, response.text


def _request_schemas(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            content = operation.get("requestBody", {}).get("content", {})
            for media in content.values():
                yield f"{method.upper()} {path}", media.get("schema", {})


def _unbounded(node: Any, spec: dict[str, Any], where: str, seen: set[str]) -> Iterator[str]:
    """Places in a request schema where a list or a map has no count limit."""
    if isinstance(node, list):
        for child in node:
            yield from _unbounded(child, spec, where, seen)
        return
    if not isinstance(node, dict):
        return
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
        name = ref.rsplit("/", 1)[1]
        if name not in seen:
            seen.add(name)
            yield from _unbounded(spec["components"]["schemas"][name], spec, name, seen)
        return
    if node.get("type") == "array" and "maxItems" not in node:
        yield f"{where}: an array without maxItems"
    extra = node.get("additionalProperties")
    if node.get("type") == "object" and extra not in (None, False) and "maxProperties" not in node:
        yield f"{where}: a map without maxProperties"
    for key, child in node.items():
        if key == "properties" and isinstance(child, dict):
            for prop, schema in child.items():
                yield from _unbounded(schema, spec, f"{where}.{prop}", seen)
        elif key != "properties":
            yield from _unbounded(child, spec, where, seen)


def test_every_list_and_map_a_client_sends_has_a_count_limit(http: httpx.Client) -> None:
    spec = http.get("/openapi.json").json()
    problems = [
        problem
        for operation, schema in _request_schemas(spec)
        for problem in _unbounded(schema, spec, operation, set())
    ]
    # response_schema is a JSON Schema: its own policy bounds it (heed.reflect.schema)
    problems = [p for p in problems if "response_schema" not in p]
    assert problems == []


def test_every_string_query_parameter_has_a_length_limit(http: httpx.Client) -> None:
    spec = http.get("/openapi.json").json()
    unbounded = []
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                if parameter["in"] != "query":
                    continue
                schema = parameter.get("schema", {})
                options = schema.get("anyOf", [schema])
                for option in options:
                    bounded = "maxLength" in option or "enum" in option or "const" in option
                    if option.get("type") == "string" and not bounded:
                        unbounded.append(f"{method.upper()} {path} ?{parameter['name']}")
    assert unbounded == []


# -- row 12: long query parameters ----------------------------------------------------------


@pytest.mark.parametrize(
    "query",
    ["memories/list?q=", "documents?q=", "memories/list?document_id=", "memories/list?entity_id="],
)
def test_overlong_query_parameters_are_422_not_500(http: httpx.Client, query: str) -> None:
    assert http.put("/v1/default/banks/queries", json={}).status_code == 200
    response = http.get(f"/v1/default/banks/queries/{query}" + "a" * 60_000)
    assert response.status_code == 422, response.text


# -- row 17: NUL refused at the edge --------------------------------------------------------


def test_nul_in_a_path_or_query_is_a_400(http: httpx.Client) -> None:
    for path in ("/v1/sessions/a%00b", "/v1/default/banks/x%00y", "/v1/runs?session_id=a%00"):
        response = http.get(path)
        assert response.status_code == 400, (path, response.text)
        assert "NUL" in response.json()["detail"]


def test_nul_in_a_body_is_a_400_naming_the_place(http: httpx.Client) -> None:
    assert http.put("/v1/default/banks/nul", json={}).status_code == 200
    raw = b'{"items": [{"content": "ok", "tags": ["a\\u0000b"]}]}'
    response = http.post(
        "/v1/default/banks/nul/memories",
        content=raw,
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 400
    assert "items[0].tags[0]" in response.json()["detail"]
    session = http.post("/v1/sessions", json={"title": "t\u0000"})
    assert session.status_code == 400
    # an escaped backslash followed by "u0000" is text, not NUL
    raw = b'{"items": [{"content": "a \\\\u0000 b"}]}'
    response = http.post(
        "/v1/default/banks/nul/memories", content=raw, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 200, response.text


# -- rows 2 and 9: the request head and idle connections -----------------------------------------


def test_an_oversized_header_is_431_and_buffers_nothing_more(server: LiveServer) -> None:
    # A small send buffer: what the client pushes is then what the server read, plus two
    # small kernel buffers (else loopback's autotuned buffers take megabytes at once).
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32 * 1024)
    sock.settimeout(10)
    sock.connect((server.host, server.port))
    with sock:
        watch = CloseWatch([sock])
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
        sent = 0
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            while sent < 4 * 1024 * 1024 and sock not in watch.closed_at:
                sock.sendall(b"a" * 16384)
                sent += 16384
        stopped = time.monotonic()
        watch.wait(5)
        assert sent < 1024 * 1024  # what the client could push before the close, 64 KiB read
        answer = watch.closed_by(sock, stopped + 1)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    assert _health_seconds(server) < 5


def test_idle_connections_are_closed_so_they_cannot_exhaust_the_server(
    server: LiveServer,
) -> None:
    opened = time.monotonic()
    idle = [_connect(server) for _ in range(50)]
    partial = _connect(server)
    partial.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finishes its head
    limit = time.monotonic() + HEAD_TIMEOUT + 1  # from the last connection's opening
    try:
        watch = CloseWatch([*idle, partial])
        watch.wait(10 * HEAD_TIMEOUT + 5)
        answers = [watch.closed_by(sock, limit) for sock in [*idle, partial]]
    finally:
        for sock in [*idle, partial]:
            sock.close()
    assert limit - opened < 5  # the connections opened together
    assert answers[-1].startswith(b"HTTP/1.1 408"), answers[-1][:100]
    assert all(a == b"" or a.startswith(b"HTTP/1.1 408") for a in answers[:-1])
    assert _health_seconds(server) < 5


# -- row 3: a body that never comes holds no admission place -----------------------------------


def _stalled_posts(server: LiveServer, path: str, headers: str, count: int) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        sock = _connect(server)
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n".encode()
        )
        socks.append(sock)
    return socks


def test_bodies_that_never_come_hold_no_place_and_are_dropped(
    server: LiveServer, http: httpx.Client
) -> None:
    anonymous = _stalled_posts(server, "/v1/auth/login", "", 12)  # 3x the public bound
    keyed = _stalled_posts(server, "/v1/sessions", f"Authorization: Bearer {KEY_A}\r\n", 12)
    limit = time.monotonic() + BODY_TIMEOUT + 1  # from the last head sent
    watch = CloseWatch([*anonymous, *keyed])
    try:
        time.sleep(0.2)  # all of them are waiting for their bodies now
        # every tenant is still served, and so is a login
        assert http.get("/v1/sessions").status_code == 200
        assert httpx.get(f"{server.url}/v1/sessions", headers=B, timeout=10).status_code == 200
        login = httpx.post(f"{server.url}/v1/auth/login", json={"key": KEY_A}, timeout=10)
        assert login.status_code == 200
        # and the stalled ones are dropped once their body stalls past the timeout
        watch.wait(10 * BODY_TIMEOUT + 5)
        for sock in [*anonymous, *keyed]:
            assert watch.closed_by(sock, limit) == b""
    finally:
        for sock in [*anonymous, *keyed]:
            sock.close()


# -- rows 21, 22, 23: headers, /docs, HEAD -----------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/health", "/ui/app.js", "/v1/auth/session"])
def test_every_response_forbids_framing_and_sniffing(server: LiveServer, path: str) -> None:
    response = httpx.get(f"{server.url}{path}", timeout=10)
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["x-content-type-options"] == "nosniff"
    policy = response.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in policy and "default-src 'self'" in policy


def test_no_docs_page_loads_anything_from_a_cdn(http: httpx.Client) -> None:
    for path in ("/docs", "/redoc"):
        response = http.get(path)
        assert "cdn." not in response.text
        assert response.status_code == 404
    assert http.get("/openapi.json").status_code == 200


def test_head_is_answered_on_get_routes(server: LiveServer, http: httpx.Client) -> None:
    health = httpx.head(f"{server.url}/health", timeout=10)
    assert health.status_code == 200 and health.content == b""
    assert httpx.head(f"{server.url}/", timeout=10).status_code == 200
    assert http.head("/v1/sessions").status_code == 200
    assert http.head("/v1/sessions/nope").status_code == 404


def test_head_of_a_stream_ends_it(http: httpx.Client) -> None:
    session = http.post("/v1/sessions", json={"title": "head"}).json()
    started = time.perf_counter()
    response = http.head(f"/v1/sessions/{session['id']}/events")
    assert response.status_code == 200
    assert time.perf_counter() - started < 10  # the stream did not hold the request open


# -- row 19: key guessing --------------------------------------------------------------------


def test_key_guessing_is_throttled_per_address(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path, llm_provider="scripted", api_keys={KEY_A: "a"}, auth_max_failures=5
    )
    with live_server(create_app(settings)) as srv:
        statuses = [
            httpx.post(f"{srv.url}/v1/auth/login", json={"key": f"guess-{i}"}, timeout=10)
            for i in range(8)
        ]
        assert [r.status_code for r in statuses[:5]] == [401] * 5
        assert {r.status_code for r in statuses[5:]} == {429}
        assert int(statuses[-1].headers["retry-after"]) > 0
        bearer = httpx.get(
            f"{srv.url}/v1/sessions", headers={"Authorization": "Bearer guess"}, timeout=10
        )
        assert bearer.status_code == 429
        # what does not try a key is not throttled
        assert httpx.get(f"{srv.url}/health", timeout=10).status_code == 200


# -- row 20: logout revokes the cookie ---------------------------------------------------------


def _login(url: str) -> httpx.Client:
    client = httpx.Client(base_url=url, timeout=10)
    response = client.post("/v1/auth/login", json={"key": KEY_A})
    assert response.status_code == 200
    client.headers["X-Heed-CSRF"] = response.json()["csrf_token"]
    return client


def test_logout_revokes_the_cookie_on_every_instance(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, llm_provider="scripted", api_keys={KEY_A: "a"})
    other = Settings(data_dir=tmp_path, llm_provider="scripted", api_keys={KEY_A: "a"})
    with live_server(create_app(settings)) as one, live_server(create_app(other)) as two:
        browser = _login(one.url)
        kept = browser.cookies.get("heed_session")
        assert browser.get("/v1/sessions").status_code == 200
        assert browser.post("/v1/auth/logout").status_code == 200
        for url in (one.url, two.url):
            reused = httpx.get(f"{url}/v1/sessions", cookies={"heed_session": kept}, timeout=10)
            assert reused.status_code == 401, url
        # another login of the same key is a new session, unaffected
        again = _login(two.url)
        assert again.get("/v1/sessions").status_code == 200
        browser.close()
        again.close()


# -- row 13: regular expressions in response_schema --------------------------------------------


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"type": "string", "pattern": "(" * 1000}}},
        {
            "type": "object",
            "properties": {"a": {"type": "string", "pattern": "(" * 600 + ")" * 600}},
        },
        {"type": "object", "patternProperties": {"(" * 1000: {}}},
    ],
)
def test_deeply_nested_patterns_are_a_400(http: httpx.Client, schema: dict[str, Any]) -> None:
    assert http.put("/v1/default/banks/patterns", json={}).status_code == 200
    response = http.post(
        "/v1/default/banks/patterns/reflect", json={"query": "q", "response_schema": schema}
    )
    assert response.status_code == 400, response.text
    assert "pattern" in response.json()["detail"]


# -- row 1 (load): the abusive retain does not stall /health -----------------------------------


def test_health_stays_responsive_during_an_abusive_retain(server: LiveServer) -> None:
    body = json.dumps(
        {"items": [{"content": "x", "tags": [f"tag-{i}" for i in range(60_000)]}]}
    ).encode()
    slowest: list[float] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            slowest.append(_health_seconds(server))

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        for _ in range(3):
            response = httpx.post(
                f"{server.url}/v1/default/banks/tags/memories",
                content=body,
                headers={**A, "Content-Type": "application/json"},
                timeout=30,
            )
            assert response.status_code in (404, 422)
    finally:
        stop.set()
        poller.join()
    assert slowest and max(slowest) < 2.0  # before: 11.8 s
    wait_for(lambda: _health_seconds(server) < 1)


# -- no work proportional to a body's size on the event loop -----------------------------------


def test_every_api_route_parses_large_json_bodies_off_the_loop(server: LiveServer) -> None:
    from fastapi.routing import APIRoute

    from heed.api.routing import HeedRoute

    try:  # FastAPI 0.165 keeps included routers nested; the contexts are every route
        from fastapi.routing import iter_route_contexts
    except ImportError:
        every = list(server.app.router.routes)
    else:
        every = [c.original_route for c in iter_route_contexts(server.app.router.routes)]
    routes = [r for r in every if isinstance(r, APIRoute)]
    assert len(routes) > 50, [r.path for r in routes]  # every route, not the app's own few
    assert all(isinstance(r, HeedRoute) for r in routes), [
        r.path for r in routes if not isinstance(r, HeedRoute)
    ]


async def test_a_large_json_body_is_parsed_in_a_worker_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from heed.api import routing
    from heed.api.input_rules import OFFLOAD_BODY_BYTES

    threads: list[int] = []

    async def recording(fn: Any, *args: Any) -> Any:
        threads.append(len(args[0]))
        return fn(*args)

    monkeypatch.setattr(routing, "run_in_thread", recording)

    def request_of(body: bytes) -> routing.OffloadedJsonRequest:
        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        return routing.OffloadedJsonRequest({"type": "http", "method": "POST"}, receive)

    small = json.dumps({"x": "a"}).encode()
    large = json.dumps({"x": "a" * OFFLOAD_BODY_BYTES}).encode()
    assert await request_of(small).json() == {"x": "a"}
    assert (await request_of(large).json())["x"] == "a" * OFFLOAD_BODY_BYTES
    assert threads == [len(large)]


async def test_a_client_leaving_during_a_large_parse_is_a_cancellation_not_a_400(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fastapi import FastAPI
    from pydantic import BaseModel

    from heed.api import routing
    from heed.api.input_rules import OFFLOAD_BODY_BYTES
    from heed.runtime import OperationCancelled

    async def cancelled(fn: Any, *args: Any) -> Any:
        raise OperationCancelled("client disconnected")

    monkeypatch.setattr(routing, "run_in_thread", cancelled)

    class Body(BaseModel):
        x: str

    app = FastAPI()
    app.router.route_class = routing.HeedRoute

    @app.post("/x")
    async def endpoint(body: Body) -> dict[str, str]:
        return {"x": body.x}

    route = next(r for r in app.router.routes if getattr(r, "path", "") == "/x")
    assert isinstance(route, routing.HeedRoute)
    body = json.dumps({"x": "a" * OFFLOAD_BODY_BYTES}).encode()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/x",
        "headers": [(b"content-type", b"application/json")],
        "query_string": b"",
    }
    request = routing.OffloadedJsonRequest(scope, receive)
    with pytest.raises(OperationCancelled):  # FastAPI's own parse would have made it a 400
        await route.get_route_handler()(request)


def test_a_large_malformed_body_is_a_422_naming_the_position(http: httpx.Client) -> None:
    from heed.api.input_rules import OFFLOAD_BODY_BYTES

    assert http.put("/v1/default/banks/malformed", json={}).status_code == 200
    raw = b'{"items": [{"content": "' + b"a" * OFFLOAD_BODY_BYTES + b'"}'  # no closing brace
    response = http.post(
        "/v1/default/banks/malformed/memories",
        content=raw,
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["type"] == "json_invalid"
