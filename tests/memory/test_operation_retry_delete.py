"""Retrying and deleting a bank's operations over HTTP, on SQLite and PostgreSQL, through the
unmodified client's ``OperationsApi`` (``retry_operation``, ``delete_operation``).

A retain is held by a slow extraction and cancelled; its retry is a new operation with the
same input, which writes what the first would have. A pending/running or completed operation
cannot be retried (409 naming why), a running one cannot be deleted (409); a finished one is
deleted with its record (then 404), and its journal and payload are gone from the run store.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hindsight_client_api.api.operations_api import OperationsApi
from hindsight_client_api.api_client import ApiClient
from hindsight_client_api.configuration import Configuration
from hindsight_client_api.exceptions import ApiException

from heed.api.app import create_app
from heed.llm import ScriptedProvider
from heed.settings import Settings
from tests.pg_support import fresh_schema
from tests.support import LiveServer, live_server, wait_for

CONTENT = "Alice has two cats named Tom and Jerry."
FACT = {
    "text": "Alice has two cats, Tom and Jerry.",
    "fact_type": "world",
    "who": "Alice",
    "entities": ["Alice", "Tom", "Jerry"],
    "sources": [0],
}


@pytest.fixture(params=["sqlite", "postgresql"], scope="module")
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    def settings(url: str | None) -> Settings:
        return Settings(
            data_dir=tmp_path_factory.mktemp("ops-retry"),
            database_url=url,
            llm_provider="scripted",
            retain_extraction="concise",
            observations="off",
            run_reaper_interval=0.2,
        )

    if request.param == "sqlite":
        with live_server(create_app(settings(None))) as srv:
            yield srv
        return
    with fresh_schema() as url, live_server(create_app(settings(url))) as srv:
        yield srv


def _script(server: LiveServer, reply: dict[str, Any]) -> None:
    server.app.state.services.retain_provider.current = ScriptedProvider({"replies": [reply]})


def _status(server: LiveServer, bank: str, operation_id: str) -> dict[str, Any]:
    response = httpx.get(
        f"{server.url}/v1/default/banks/{bank}/operations/{operation_id}", timeout=10
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _submit(server: LiveServer, bank: str) -> str:
    response = httpx.post(
        f"{server.url}/v1/default/banks/{bank}/memories",
        json={"items": [{"content": CONTENT, "document_id": "pets"}], "async": True},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return str(response.json()["operation_id"])


def _texts(server: LiveServer, bank: str) -> list[str]:
    response = httpx.get(f"{server.url}/v1/default/banks/{bank}/memories/list", timeout=10)
    assert response.status_code == 200, response.text
    return [item["text"] for item in response.json()["items"]]


def _conflict(exc: pytest.ExceptionInfo[ApiException], *words: str) -> None:
    assert exc.value.status == 409, exc.value
    body = str(exc.value.body)
    assert all(word in body for word in words), body


def test_a_cancelled_retain_is_retried_and_finished_ones_are_deleted(server: LiveServer) -> None:
    bank = "ops-" + uuid.uuid4().hex[:8]
    httpx.put(f"{server.url}/v1/default/banks/{bank}", json={}, timeout=10).raise_for_status()
    _script(server, {"when": "", "latency": 60, "json": {"facts": [FACT]}})
    first = _submit(server, bank)
    wait_for(lambda: _status(server, bank, first)["status"] == "processing", 20)

    async def drive() -> None:
        config = Configuration(host=server.url)
        async with ApiClient(config) as api_client:
            api = OperationsApi(api_client)
            with pytest.raises(ApiException) as running:
                await api.retry_operation(bank, first)
            _conflict(running, first, "processing", "failed or cancelled")
            with pytest.raises(ApiException) as busy:
                await api.delete_operation(bank, first)
            _conflict(busy, first, "processing", "finished")

            await api.cancel_operation(bank, first)
            for _ in range(200):
                if _status(server, bank, first)["status"] == "cancelled":
                    break
                await asyncio.sleep(0.05)
            assert _status(server, bank, first)["status"] == "cancelled"
            assert _texts(server, bank) == []  # the cancelled retain wrote nothing

            _script(server, {"when": "", "json": {"facts": [FACT]}})
            retried = await api.retry_operation(bank, first)
            assert retried.success and retried.operation_id != first
            assert first in retried.message and retried.operation_id in retried.message
            for _ in range(200):
                if _status(server, bank, retried.operation_id)["status"] == "completed":
                    break
                await asyncio.sleep(0.05)
            done = _status(server, bank, retried.operation_id)
            assert done["status"] == "completed", done
            kept = _texts(server, bank)
            assert FACT["text"] in kept, kept  # the same input, retained now

            with pytest.raises(ApiException) as completed:
                await api.retry_operation(bank, retried.operation_id)
            _conflict(completed, "completed")

            store = server.app.state.services.manager.store
            assert store.payload(first) is not None
            for operation_id in (first, retried.operation_id):
                deleted = await api.delete_operation(bank, operation_id)
                assert deleted.success and deleted.operation_id == operation_id
                gone = httpx.get(
                    f"{server.url}/v1/default/banks/{bank}/operations/{operation_id}",
                    timeout=10,
                )
                assert gone.status_code == 404, gone.text
            assert store.payload(first) is None and store.get(first) is None
            assert store.events_after(first, 0) == []
            listed = httpx.get(f"{server.url}/v1/default/banks/{bank}/operations", timeout=10)
            assert listed.json()["total"] == 0
            assert _texts(server, bank) == kept  # the memories stay

            with pytest.raises(ApiException) as missing:
                await api.delete_operation(bank, first)
            assert missing.value.status == 404

    asyncio.run(drive())


def test_another_banks_operation_is_not_found(server: LiveServer) -> None:
    bank, other = ("ops-" + uuid.uuid4().hex[:8] for _ in range(2))
    for name in (bank, other):
        httpx.put(f"{server.url}/v1/default/banks/{name}", json={}, timeout=10).raise_for_status()
    _script(server, {"when": "", "json": {"facts": [FACT]}})
    operation_id = _submit(server, bank)
    wait_for(lambda: _status(server, bank, operation_id)["status"] == "completed", 20)
    base = f"{server.url}/v1/default/banks/{other}/operations/{operation_id}"
    assert httpx.post(f"{base}/retry", timeout=10).status_code == 404
    assert httpx.delete(f"{base}/delete", timeout=10).status_code == 404
    assert _status(server, bank, operation_id)["status"] == "completed"  # still there
