"""The memory API through hindsight-client against a real uvicorn server."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from hindsight_client import Hindsight
from hindsight_client_api.exceptions import ApiException

from tests.support import LiveServer

TURNS = [
    ("Caroline: I went to a LGBTQ support group yesterday and it was so powerful.", "D1:1"),
    ("Melanie: That's great! I painted a sunset over the lake last weekend.", "D1:2"),
    ("Caroline: I'm thinking of studying counseling to help trans people.", "D1:3"),
    ("Melanie: My kids and I went camping in the mountains in June.", "D1:4"),
    ("Caroline: I adopted a golden retriever named Max.", "D1:5"),
]


async def _fill(client: Hindsight, bank_id: str) -> None:
    await client._acreate_bank(bank_id, name="Test bank")
    items = [
        {
            "content": text,
            "timestamp": "2023-05-08T13:56:00Z",
            "metadata": {"dia_id": dia},
            "document_id": "session-1",
            "tags": ["friends"] if i % 2 == 0 else [],
        }
        for i, (text, dia) in enumerate(TURNS)
    ]
    response = await client.aretain_batch(bank_id, items)
    assert response.success and response.items_count == len(TURNS) and not response.var_async


async def test_bank_lifecycle(client: Hindsight, bank_id: str) -> None:
    profile = await client._acreate_bank(bank_id, name="Alice", mission="remember")
    assert profile.bank_id == bank_id and profile.name == "Alice"
    updated = await client.banks.update_bank(bank_id, {"name": "Alice 2"})  # type: ignore[arg-type]
    assert updated.name == "Alice 2"
    banks = await client.banks.list_banks()
    assert bank_id in [b.bank_id for b in banks.banks]
    deleted = await client.adelete_bank(bank_id)
    assert deleted.success
    with pytest.raises(ApiException) as err:
        await client.banks.get_agent_stats(bank_id)
    assert err.value.status == 404


async def test_retain_then_recall(client: Hindsight, bank_id: str) -> None:
    await _fill(client, bank_id)
    result = await client.arecall(bank_id, "What did Melanie paint?", trace=True)
    assert result.results, "no results"
    assert "sunset" in result.results[0].text
    top = result.results[0]
    assert top.metadata == {"dia_id": "D1:2"}
    assert top.scores is not None and top.scores.final > 0
    stages = [s["stage"] for s in result.trace["stages"]]
    for stage in ("admission", "embedding", "retrieval", "fusion", "rerank", "enrichment"):
        assert stage in stages
    retrieval = next(s for s in result.trace["stages"] if s["stage"] == "retrieval")
    assert retrieval["arms"]["semantic"] > 0 and retrieval["arms"]["keyword"] > 0


async def test_recall_budget_max_tokens_types_include(client: Hindsight, bank_id: str) -> None:
    await _fill(client, bank_id)
    small = await client.arecall(bank_id, "What did Caroline do?", max_tokens=25, budget="low")
    assert 1 <= len(small.results) < len(TURNS)
    full = await client.arecall(
        bank_id,
        "What did Caroline do?",
        budget="high",
        types=["world"],
        include_entities=True,
        include_chunks=True,
    )
    assert len(full.results) == len(TURNS)
    assert full.entities and "Caroline" in full.entities
    assert full.chunks and all(c.text for c in full.chunks.values())
    none = await client.arecall(bank_id, "What did Caroline do?", types=["experience"])
    assert none.results == []
    tagged = await client.arecall(bank_id, "Caroline", tags=["friends"], tags_match="all_strict")
    assert tagged.results and all(r.tags == ["friends"] for r in tagged.results)


async def test_list_get_delete_memories_and_documents(client: Hindsight, bank_id: str) -> None:
    await _fill(client, bank_id)
    listing = await client.alist_memories(bank_id, limit=2)
    assert listing.total == len(TURNS) and len(listing.items) == 2
    memory_id = listing.items[0].id
    fetched = await client.memory.get_memory(bank_id, memory_id)
    assert fetched["id"] == memory_id
    docs = await client.documents.list_documents(bank_id)
    assert [d.id for d in docs.items] == ["session-1"]
    doc = await client.documents.get_document(bank_id, "session-1")
    assert doc.memory_unit_count == len(TURNS) and "sunset" in (doc.original_text or "")
    async with httpx.AsyncClient(base_url=client._base_url) as http:
        gone = await http.delete(f"/v1/default/banks/{bank_id}/memories/{memory_id}")
        assert gone.status_code == 200
        missing = await http.get(f"/v1/default/banks/{bank_id}/memories/{memory_id}")
        assert missing.status_code == 404
    deleted = await client.documents.delete_document(bank_id, "session-1")
    assert deleted.memory_units_deleted == len(TURNS) - 1
    after = await client.arecall(bank_id, "sunset")
    assert after.results == []


async def test_list_memories_by_tags_and_a_bad_tags_match(server: LiveServer, bank_id: str) -> None:
    """``?tags=a&tags=b`` and ``tags_match`` over HTTP (recall's rule, see
    tests/storage/test_memory_store.py for every mode); an unknown mode is a 400 naming
    ``tags_match`` and the modes; the document lists them."""
    path = f"/v1/default/banks/{bank_id}/memories/list"
    items = [
        {"content": TURNS[0][0], "document_id": "a", "tags": ["friends"]},
        {"content": TURNS[1][0], "document_id": "b", "tags": ["friends", "art"]},
        {"content": TURNS[2][0], "document_id": "c"},
    ]
    async with httpx.AsyncClient(base_url=server.url) as http:
        await http.put(f"/v1/default/banks/{bank_id}", json={})
        retained = await http.post(f"/v1/default/banks/{bank_id}/memories", json={"items": items})
        assert retained.status_code == 200, retained.text

        async def listed(params: Any) -> list[str]:
            response = await http.get(path, params=params)
            assert response.status_code == 200, response.text
            assert response.json()["total"] == len(response.json()["items"])
            return sorted(m["document_id"] for m in response.json()["items"])

        assert await listed({"tags": "friends"}) == ["a", "b", "c"]  # any: the untagged too
        assert await listed({"tags": "friends", "tags_match": "any_strict"}) == ["a", "b"]
        assert await listed([("tags", "art"), ("tags", "friends"), ("tags_match", "all")]) == [
            "b",
            "c",
        ]
        assert await listed({"tags": "friends", "tags_match": "exact"}) == ["a"]
        assert await listed({"tags_match": "exact"}) == ["c"]
        for bad in ("ANY", "some", ""):
            refused = await http.get(path, params={"tags": "friends", "tags_match": bad})
            assert refused.status_code == 400, refused.text
            detail = refused.json()["detail"]
            assert "tags_match must be one of any, all, any_strict, all_strict, exact" in detail
        too_many = await http.get(path, params=[("tags", f"t{i}") for i in range(65)])
        assert too_many.status_code == 422 and "tags" in too_many.text
        document = (await http.get("/openapi.json")).json()
    parameters = document["paths"]["/v1/default/banks/{bank_id}/memories/list"]["get"]["parameters"]
    [tags_match] = [p for p in parameters if p["name"] == "tags_match"]
    assert tags_match["schema"]["enum"] == ["any", "all", "any_strict", "all_strict", "exact"]


async def test_document_replace_and_append(client: Hindsight, bank_id: str) -> None:
    await client._acreate_bank(bank_id)
    await client.aretain(bank_id, "Alice likes tea.", document_id="doc")
    await client.aretain(bank_id, "Alice likes coffee.", document_id="doc")
    listing = await client.alist_memories(bank_id)
    assert [m.text for m in listing.items] == ["Alice likes coffee."]
    await client.aretain(bank_id, "Alice likes cocoa.", document_id="doc", update_mode="append")
    listing = await client.alist_memories(bank_id)
    assert sorted(m.text for m in listing.items) == ["Alice likes cocoa.", "Alice likes coffee."]


async def test_async_retain_operation(client: Hindsight, bank_id: str) -> None:
    await client._acreate_bank(bank_id)
    response = await client.aretain_batch(
        bank_id, [{"content": t} for t, _ in TURNS], retain_async=True
    )
    assert response.var_async and response.operation_id
    for _ in range(200):
        status = await client.operations.get_operation_status(bank_id, response.operation_id)
        if status.status in ("completed", "failed", "cancelled"):
            break
        await asyncio.sleep(0.05)
    assert status.status == "completed", status
    listing = await client.operations.list_operations(bank_id)
    assert [o.id for o in listing.operations] == [response.operation_id]
    memories = await client.alist_memories(bank_id)
    assert memories.total == len(TURNS)
    # Cancelling a finished operation changes nothing (terminal states are absorbing).
    cancel = await client.operations.cancel_operation(bank_id, response.operation_id)
    assert cancel.success
    status = await client.operations.get_operation_status(bank_id, response.operation_id)
    assert status.status == "completed"


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"query": ""}, "empty"),
        ({"query": "?!..."}, "no words"),
        ({"query": "word " * 600}, "tokens"),
        ({"query": "x", "types": ["opinion"]}, "opinion"),
        ({"query": "x", "budget": "huge"}, "budget"),
        ({"query": "x", "query_timestamp": "yesterday-ish"}, "query_timestamp"),
        ({"query": "x", "tag_groups": [{"tags": ["a"]}]}, "tag_groups"),
    ],
)
async def test_bad_recall_input_is_a_named_4xx(
    server: LiveServer, bank_id: str, body: dict[str, object], needle: str
) -> None:
    async with httpx.AsyncClient(base_url=server.url) as http:
        await http.put(f"/v1/default/banks/{bank_id}", json={})
        response = await http.post(f"/v1/default/banks/{bank_id}/memories/recall", json=body)
    assert 400 <= response.status_code < 500, response.text
    assert needle in response.text


@pytest.mark.parametrize(
    ("items", "needle"),
    [
        ([{"content": "x", "timestamp": "not a date"}], "items[0].timestamp"),
        ([{"content": "   "}], "items[0].content is empty"),
        ([{"content": "x" * 300_000}], "limit"),
        ([{"content": "x", "fact_type": "gossip"}], "gossip"),
        ([{"content": [{"type": "image", "source": {}}]}], "text only"),
        ([], "items is empty"),
    ],
)
async def test_bad_retain_input_is_a_named_4xx_and_writes_nothing(
    server: LiveServer, bank_id: str, items: list[object], needle: str
) -> None:
    async with httpx.AsyncClient(base_url=server.url) as http:
        await http.put(f"/v1/default/banks/{bank_id}", json={})
        good = {"content": "A perfectly fine item."}
        response = await http.post(
            f"/v1/default/banks/{bank_id}/memories", json={"items": [good, *items] if items else []}
        )
        assert 400 <= response.status_code < 500, response.text
        assert needle.replace("[0]", "[1]") in response.text or needle in response.text
        listing = await http.get(f"/v1/default/banks/{bank_id}/memories/list")
    assert listing.json()["total"] == 0


async def test_unknown_bank_unknown_fields_and_bad_utf8(server: LiveServer, bank_id: str) -> None:
    async with httpx.AsyncClient(base_url=server.url) as http:
        missing = await http.post(
            f"/v1/default/banks/{bank_id}/memories/recall", json={"query": "hello"}
        )
        assert missing.status_code == 404 and bank_id in missing.text
        # A bank setting heed does not know is refused by name (heed.memory.bank_config.settings).
        refused = await http.put(
            f"/v1/default/banks/{bank_id}", json={"name": "x", "some_new_field": 1}
        )
        assert refused.status_code == 400 and "'some_new_field'" in refused.text
        await http.put(f"/v1/default/banks/{bank_id}", json={"name": "x"})
        extra = await http.post(
            f"/v1/default/banks/{bank_id}/memories/recall",
            json={"query": "hello", "future_option": {"a": 1}},
        )
        assert extra.status_code == 200
        bad = await http.post(
            f"/v1/default/banks/{bank_id}/memories",
            content=b'{"items": [{"content": "caf\xe9"}]}',
            headers={"content-type": "application/json"},
        )
        assert bad.status_code == 400 and "not valid UTF-8" in bad.text, bad.text
        listing = await http.get(f"/v1/default/banks/{bank_id}/memories/list")
        assert listing.json()["total"] == 0


async def test_async_retain_with_operation_id_is_idempotent(
    client: Hindsight, bank_id: str
) -> None:
    await client._acreate_bank(bank_id)
    op = "5f0c8d6e-2b7a-4c1e-9a51-0d2f1f6b7c11"
    first = await client.aretain(bank_id, "Once only.", retain_async=True, operation_id=op)
    second = await client.aretain(bank_id, "Once only.", retain_async=True, operation_id=op)
    assert first.operation_id == second.operation_id
    listing = await client.operations.list_operations(bank_id)
    assert len(listing.operations) == 1
