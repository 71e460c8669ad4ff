"""MCP sessions over HTTP belong to the key that opened them, are capped per tenant, and
their ids never reach a log: a real server on loopback, raw HTTP with several keys.

The raw requests are what any client (or anyone who learned a session id) can send: the
handshake-era ``initialize``, then requests carrying ``Mcp-Session-Id``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from heed.api.app import create_app
from heed.mcp.sessions import McpEndpoint
from heed.settings import Settings
from tests.mcp_api.test_mcp_server import (
    LONG,
    STOP_BOUND,
    connect,
    new_bank,
    reflect_lane_in_use,
    until,
    use_script,
)
from tests.support import LiveServer, live_server

PER_TENANT = 3
IDLE_SECONDS = 2.0
KEYS = {
    "key-alpha": "alpha",
    "key-alpha-2": "alpha",
    "key-beta": "beta",
    "key-gamma": "gamma",
    "key-delta": "delta",
    "key-epsilon": "epsilon",
}
VERSION = "2025-06-18"
ACCEPT = "application/json, text/event-stream"


def start(tmp_path_factory: pytest.TempPathFactory, **settings: Any) -> Iterator[LiveServer]:
    base = Settings(
        data_dir=tmp_path_factory.mktemp("mcp-sessions"),
        llm_provider="scripted",
        api_keys=KEYS,
        stream_heartbeat_seconds=0.5,
        stream_poll_seconds=0.2,
        mcp_sessions_per_tenant=PER_TENANT,
    )
    with live_server(create_app(base.model_copy(update=settings))) as srv:
        yield srv


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """Sessions never expire during a test here (the default idle time)."""
    yield from start(tmp_path_factory)


@pytest.fixture(scope="module")
def idle_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """Sessions expire after IDLE_SECONDS without a request."""
    yield from start(tmp_path_factory, mcp_session_idle_seconds=IDLE_SECONDS)


@asynccontextmanager
async def raw(server: LiveServer, key: str) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client authenticated with *key*, speaking MCP by hand."""
    headers = {"Authorization": f"Bearer {key}", "Accept": ACCEPT}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as http:
        yield http


def in_session(session_id: str) -> dict[str, str]:
    return {"mcp-session-id": session_id, "mcp-protocol-version": VERSION}


async def initialize(http: httpx.AsyncClient) -> httpx.Response:
    """The handshake-era ``initialize`` that opens a session."""
    return await http.post(
        "/mcp",
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": VERSION,
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"},
            },
        },
    )


async def open_session(http: httpx.AsyncClient) -> str:
    """A new, initialized session's id."""
    response = await initialize(http)
    assert response.status_code == 200, response.text
    session_id = response.headers["mcp-session-id"]
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    accepted = await http.post("/mcp", json=note, headers=in_session(session_id))
    assert accepted.status_code == 202, accepted.text
    return session_id


async def tools_list(http: httpx.AsyncClient, session_id: str) -> httpx.Response:
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    return await http.post("/mcp", json=call, headers=in_session(session_id))


async def delete(http: httpx.AsyncClient, session_id: str) -> httpx.Response:
    return await http.delete("/mcp", headers=in_session(session_id))


def refusal(response: httpx.Response) -> str:
    body: dict[str, Any] = response.json()
    return str(body["error"]["message"])


# -- ownership -------------------------------------------------------------------------


async def test_another_tenant_cannot_cancel_into_delete_or_read_a_session(
    server: LiveServer,
) -> None:
    async with connect(server, "key-alpha") as client:
        bank_id = await new_bank(client)
    provider = use_script(server, [{"text": LONG, "token_delay": 0.02}])
    async with raw(server, "key-alpha") as alpha, raw(server, "key-beta") as beta:
        session_id = await open_session(alpha)
        call = {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "tools/call",
            "params": {"name": "reflect", "arguments": {"bank_id": bank_id, "query": "Pets?"}},
        }
        async with alpha.stream("POST", "/mcp", json=call, headers=in_session(session_id)):
            await until(lambda: provider.last_token_at is not None)
            cancel = {
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": 7, "reason": "not yours"},
            }
            intruding = [
                await beta.post("/mcp", json=cancel, headers=in_session(session_id)),
                await beta.delete("/mcp", headers=in_session(session_id)),
                await beta.get("/mcp", headers=in_session(session_id)),
                await tools_list(beta, session_id),
            ]
            assert [r.status_code for r in intruding] == [404] * 4, [r.text for r in intruding]
            assert {refusal(r) for r in intruding} == {"Session not found"}
            # the reflect goes on, in a session that is still alpha's
            generated = provider.last_token_at
            await until(lambda: provider.last_token_at != generated)
            assert reflect_lane_in_use(server) == 1
            assert (await tools_list(alpha, session_id)).status_code == 200
            # the key names the owner: another key of the same tenant is not it either
            async with raw(server, "key-alpha-2") as alpha_2:
                assert (await delete(alpha_2, session_id)).status_code == 404
            assert (await delete(alpha, session_id)).status_code == 200
        await until(lambda: reflect_lane_in_use(server) == 0, STOP_BOUND)
        assert (await tools_list(alpha, session_id)).status_code == 404


# -- the per-tenant cap --------------------------------------------------------------


async def test_sessions_are_capped_per_tenant_and_others_still_open_theirs(
    server: LiveServer,
) -> None:
    async with raw(server, "key-gamma") as gamma, raw(server, "key-delta") as delta:
        opened = [await open_session(gamma) for _ in range(PER_TENANT)]
        refused = await initialize(gamma)
        assert refused.status_code == 429, refused.text
        message = refusal(refused)
        assert f"{PER_TENANT} open MCP sessions" in message
        assert "HEED_MCP_SESSIONS_PER_TENANT" in message
        assert "mcp-session-id" not in refused.headers
        # the sessions gamma has keep working, and another tenant is not affected
        assert (await tools_list(gamma, opened[0])).status_code == 200
        theirs = await open_session(delta)
        # an opening request that fails leaves no place taken
        assert (await delete(gamma, opened.pop())).status_code == 200
        broken = await gamma.post(
            "/mcp", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert broken.status_code == 400, broken.text
        opened.append(await open_session(gamma))
        assert (await initialize(gamma)).status_code == 429
        for session_id in opened:
            assert (await delete(gamma, session_id)).status_code == 200
        assert (await delete(delta, theirs)).status_code == 200
        # all places are free again
        opened = [await open_session(gamma) for _ in range(PER_TENANT)]
        for session_id in opened:
            assert (await delete(gamma, session_id)).status_code == 200


async def test_the_cap_holds_when_opening_requests_race(server: LiveServer) -> None:
    async with raw(server, "key-epsilon") as epsilon:
        answers = await asyncio.gather(*(initialize(epsilon) for _ in range(4 * PER_TENANT)))
        statuses = sorted(r.status_code for r in answers)
        assert statuses == [200] * PER_TENANT + [429] * (3 * PER_TENANT), statuses
        for answer in answers:
            if answer.status_code == 200:
                await delete(epsilon, answer.headers["mcp-session-id"])
        again = await initialize(epsilon)
        assert again.status_code == 200, again.text
        assert (await delete(epsilon, again.headers["mcp-session-id"])).status_code == 200


async def test_an_idle_session_expires_and_frees_its_place(idle_server: LiveServer) -> None:
    async with raw(idle_server, "key-beta") as beta:
        opened = [await open_session(beta) for _ in range(PER_TENANT)]
        assert (await initialize(beta)).status_code == 429
        # wait without touching the sessions (a request would keep them alive)
        deadline = time.monotonic() + IDLE_SECONDS + 10
        while (fresh := await initialize(beta)).status_code != 200:
            assert fresh.status_code == 429, fresh.text
            assert time.monotonic() < deadline, "no idle session expired"
            await asyncio.sleep(0.2)
        assert (await delete(beta, fresh.headers["mcp-session-id"])).status_code == 200
        for session_id in opened:
            assert (await tools_list(beta, session_id)).status_code == 404


# -- logs ------------------------------------------------------------------------------


async def test_no_session_id_reaches_the_logs(
    idle_server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with raw(idle_server, "key-delta") as delta, raw(idle_server, "key-gamma") as gamma:
        session_ids = [await open_session(delta) for _ in range(3)]
        assert (await tools_list(delta, session_ids[0])).status_code == 200
        assert (await delete(delta, session_ids[0])).status_code == 200  # terminated
        assert (await tools_list(delta, session_ids[0])).status_code == 404  # unknown id
        await delete(gamma, session_ids[2])  # not the owner: refused
        await delete(delta, session_ids[2])
        # session_ids[1] is left alone until it expires
        await until(lambda: "idle timeout" in caplog.text, IDLE_SECONDS + 10)
        assert (await tools_list(delta, session_ids[1])).status_code == 404
    # the server's records; the test's own HTTP client logs the headers it received
    server_side = [r for r in caplog.records if not r.name.startswith(("httpx", "httpcore"))]
    for record in server_side:
        logged = record.getMessage() + (caplog.handler.format(record) if record.exc_info else "")
        for session_id in session_ids:
            assert session_id not in logged, logged
    # the records are there (so this test could see an id), with the id redacted
    messages = [r.getMessage() for r in server_side if r.name.startswith("mcp.server.")]
    for expected in (
        "Created new transport",
        "Rejecting request",
        "Terminating session",
        "unknown or expired session ID",
        "idle timeout",
    ):
        assert any(expected in m and "<session id>" in m for m in messages), (expected, messages)


async def test_a_request_without_heed_identity_is_refused_not_served_as_nobody() -> None:
    """The endpoint mounted outside heed's lifecycle middleware: 401, the SDK never runs."""

    class Unreachable:
        async def handle_request(self, *args: Any) -> None:
            raise AssertionError("the SDK was reached")

    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": [], "state": {}}
    await McpEndpoint(Unreachable())(scope, receive, send)
    assert sent[0]["status"] == 401
    assert b"carries no identity" in sent[1]["body"]
