"""Idempotency-Key on retain: a retry after a partial or complete attempt duplicates nothing."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from heed.memory import MemoryEngine
from heed.memory.models import RetainItem
from heed.memory.retain.idempotency import IdempotencyConflict
from heed.memory.store import UnitFilter
from heed.runtime import OperationCancelled, RequestContext, use_context
from heed.storage.memory import SqlMemoryStore
from tests.support import LiveServer, wait_for


def _items(n: int = 3) -> list[RetainItem]:
    return [RetainItem(content=f"Alice planted tomato bed {i} in spring.") for i in range(n)]


async def _unit_count(engine: MemoryEngine, bank: Any) -> int:
    with use_context(RequestContext()):
        _units, total = await engine.list_units(bank, UnitFilter(), 1, 0)
    return total


async def test_retry_after_a_partial_attempt_writes_only_the_rest(
    engine: MemoryEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    with use_context(RequestContext()):
        bank = await engine.put_bank("idem", {})
    original = SqlMemoryStore.write_document
    written: list[str] = []
    first = RequestContext()

    def write_then_drop(self: SqlMemoryStore, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        written.append(args[1].document_id)
        if len(written) == 1:  # the connection "drops" after the first document committed
            first.token.cancel("client disconnected")
        return result

    monkeypatch.setattr(SqlMemoryStore, "write_document", write_then_drop)
    with use_context(first), pytest.raises(OperationCancelled):
        await engine.retain(bank, _items(), idempotency_key="k-1")
    assert len(written) == 1
    assert await _unit_count(engine, bank) == 1

    with use_context(RequestContext()):
        summary = await engine.retain(bank, _items(), idempotency_key="k-1")
    assert len(written) == 3  # the retry wrote the two missing documents only
    assert written[0] not in written[1:]
    assert summary.documents == 3 and summary.units == 3
    assert summary.document_ids[0] == written[0]  # the same ids as the first attempt
    assert await _unit_count(engine, bank) == 3

    with use_context(RequestContext()):
        again = await engine.retain(bank, _items(), idempotency_key="k-1")
    assert len(written) == 3  # a third attempt writes nothing
    assert again.document_ids == summary.document_ids and again.units == 3
    assert await _unit_count(engine, bank) == 3


async def test_same_key_with_another_body_is_refused(engine: MemoryEngine) -> None:
    with use_context(RequestContext()):
        bank = await engine.put_bank("idem2", {})
        await engine.retain(bank, _items(2), idempotency_key="k-2")
        with pytest.raises(IdempotencyConflict, match="different retain request"):
            await engine.retain(bank, _items(3), idempotency_key="k-2")
    assert await _unit_count(engine, bank) == 2


async def test_keys_are_per_bank_and_without_a_key_nothing_is_deduplicated(
    engine: MemoryEngine,
) -> None:
    with use_context(RequestContext()):
        one = await engine.put_bank("idem-a", {})
        two = await engine.put_bank("idem-b", {})
        await engine.retain(one, _items(1), idempotency_key="shared")
        await engine.retain(two, _items(1), idempotency_key="shared")
        await engine.retain(one, _items(1))
        await engine.retain(one, _items(1))
    assert await _unit_count(engine, two) == 1
    assert await _unit_count(engine, one) == 3


# -- over HTTP ----------------------------------------------------------------------------


def _retain(client: httpx.Client, bank: str, body: dict[str, Any], key: str | None) -> Any:
    assert client.put(f"/v1/default/banks/{bank}", json={}).status_code in (200, 201)
    headers = {"Idempotency-Key": key} if key is not None else {}
    return client.post(f"/v1/default/banks/{bank}/memories", json=body, headers=headers)


def test_http_retry_returns_the_same_documents(server: LiveServer) -> None:
    bank = "idem-" + uuid.uuid4().hex[:8]
    body = {"items": [{"content": "Bob fixed the fence."}, {"content": "Bob painted it."}]}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        first = _retain(client, bank, body, "retry-1")
        assert first.status_code == 200, first.text
        second = _retain(client, bank, body, "retry-1")
        assert second.status_code == 200
        assert second.json()["document_ids"] == first.json()["document_ids"]
        listed = client.get(f"/v1/default/banks/{bank}/memories/list").json()
        assert listed["total"] == 2

        other = _retain(client, bank, {"items": [{"content": "something else"}]}, "retry-1")
        assert other.status_code == 409
        assert "Idempotency-Key" in other.json()["detail"]

        for bad in ("has space", "x" * 256):
            refused = _retain(client, bank, body, bad)
            assert refused.status_code == 422, bad
        assert client.get(f"/v1/default/banks/{bank}/memories/list").json()["total"] == 2


def test_http_async_retry_returns_the_same_operation(server: LiveServer) -> None:
    bank = "idem-" + uuid.uuid4().hex[:8]
    body = {"async": True, "items": [{"content": "Carol baked bread."}]}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        first = _retain(client, bank, body, "async-1")
        assert first.status_code == 200, first.text
        op = first.json()["operation_id"]
        second = _retain(client, bank, body, "async-1")
        assert second.json()["operation_id"] == op
        changed = {"async": True, "items": [{"content": "Carol baked cake."}]}
        assert _retain(client, bank, changed, "async-1").status_code == 409

        def done() -> bool:
            r = client.get(f"/v1/default/banks/{bank}/operations/{op}")
            return bool(r.json().get("status") == "completed")

        wait_for(done, seconds=30)
        # the same key, synchronously now: the operation's ledger already holds the document
        sync = _retain(client, bank, {"items": body["items"]}, "async-1")
        assert sync.status_code == 200, sync.text
        assert client.get(f"/v1/default/banks/{bank}/memories/list").json()["total"] == 1
