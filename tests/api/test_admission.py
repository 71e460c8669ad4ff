"""Admission at the edge: the in-flight bound, per tenant, refused before the body is read.

A real server on a socket; requests are held in flight by a recall hook that blocks the
embedding stage until their token is cancelled.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from heed.api.admission import Admission
from heed.api.app import create_app
from heed.runtime import current_context
from heed.settings import Settings
from tests.support import LiveServer, live_server, wait_for

KEY_A, KEY_B = "key-a-" + "x" * 20, "key-b-" + "y" * 20
RECALL = "/v1/default/banks/{bank}/memories/recall"


class EmbeddingGate:
    """Holds every recall in its embedding stage until the request's token is cancelled."""

    def __init__(self) -> None:
        self.entered = threading.Semaphore(0)

    def __call__(self, stage: str) -> None:
        if stage == "embedding":
            self.entered.release()
            current_context().token.wait_sync(30.0)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    settings = Settings(
        data_dir=tmp_path,
        llm_provider="scripted",
        api_keys={KEY_A: "a", KEY_B: "b"},
        max_in_flight=3,
        tenant_max_in_flight=2,
        recall_concurrency=4,  # every held recall has a slot: only admission refuses
    )
    with live_server(create_app(settings)) as srv:
        for key in (KEY_A, KEY_B):
            headers = {"Authorization": f"Bearer {key}"}
            r = httpx.put(f"{srv.url}/v1/default/banks/b", json={"name": "b"}, headers=headers)
            assert r.status_code in (200, 201), r.text
        yield srv


def _client(server: LiveServer, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )


async def _held_recall(
    client: httpx.AsyncClient, gate: EmbeddingGate
) -> asyncio.Task[httpx.Response]:
    task = asyncio.create_task(client.post(RECALL.format(bank="b"), json={"query": "held"}))
    assert await asyncio.to_thread(gate.entered.acquire, True, 20)
    return task


def _raw_request_headers_only(server: LiveServer, key: str, declared: int) -> bytes:
    """Send a POST that declares a body and never sends it; the server's first answer."""
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(
            (
                f"POST {RECALL.format(bank='b')} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {declared}\r\n\r\n"
            ).encode()
        )
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
            chunk = sock.recv(65536)  # the body of a refusal is a small JSON object
            if not chunk:
                break
            answer += chunk
        return answer


async def test_past_the_tenant_bound_a_request_is_refused_before_its_body_is_read(
    server: LiveServer,
) -> None:
    gate = EmbeddingGate()
    server.app.state.services.memory.recall_deps.hooks = gate
    admission: Admission = server.app.state.admission
    async with _client(server, KEY_A) as a, _client(server, KEY_B) as b:
        held = [await _held_recall(a, gate), await _held_recall(a, gate)]
        assert admission.in_flight == 2
        # A third request of tenant a: 503 at once, without the body ever being sent.
        answer = await asyncio.to_thread(_raw_request_headers_only, server, KEY_A, 1000)
        assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
        assert b"retry-after: 1" in answer.lower()
        assert b"this tenant has 2 requests in progress" in answer
        # Tenant b still gets in: one tenant's load leaves room for the others.
        held.append(await _held_recall(b, gate))
        assert admission.in_flight == 3
        # Now the server is full for everybody...
        refused = await b.post(RECALL.format(bank="b"), json={"query": "x"})
        assert refused.status_code == 503
        assert "at capacity (3 requests in progress)" in refused.json()["detail"]
        # ...except what must always answer.
        assert (await b.get("/health")).status_code == 200
        for task in held:
            task.cancel()  # the clients leave: the tokens are cancelled, the places freed
        await asyncio.gather(*held, return_exceptions=True)
        wait_for(lambda: admission.in_flight == 0)
        server.app.state.services.memory.recall_deps.hooks = None
        assert (await a.post(RECALL.format(bank="b"), json={"query": "x"})).status_code == 200
    assert admission.refused_total == 2


async def test_a_stream_that_has_started_answering_holds_no_place(server: LiveServer) -> None:
    admission: Admission = server.app.state.admission
    async with _client(server, KEY_A) as a:
        session = (await a.post("/v1/sessions", json={})).json()["id"]
        streams = []
        for _ in range(4):  # more streams than the whole bound
            request = a.build_request("GET", f"/v1/sessions/{session}/events")
            response = await a.send(request, stream=True)
            assert response.status_code == 200
            streams.append(response)
        assert admission.in_flight == 0
        assert (await a.get(f"/v1/sessions/{session}")).status_code == 200
        for response in streams:
            await response.aclose()


def test_the_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="max_in_flight"):
        Admission(0)
    admission = Admission(8)
    assert admission.per_tenant == 6  # three quarters by default
    ticket = admission.enter("t")
    assert not isinstance(ticket, str)
    admission.leave(ticket)
    admission.leave(ticket)  # a second leave changes nothing
    assert admission.in_flight == 0
