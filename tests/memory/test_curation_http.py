"""Curation over a real server, on SQLite and PostgreSQL: a fact edited, invalidated and
reverted (``PATCH .../memories/{id}``), a bank's memories cleared (``DELETE .../memories``),
and derived data following: the observations citing a changed or deleted fact go, its other
facts are consolidated again, the bank's mental models become stale, and a cleared bank
keeps no unit, keyword, entity, link or shared value behind. Driven through the unmodified
``hindsight-client`` where it has the call."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest
from hindsight_client import Hindsight
from hindsight_client_api.models.update_memory_request import UpdateMemoryRequest

from heed.llm import ScriptedProvider
from tests.pg_support import DATABASES, heed_server
from tests.support import LiveServer, wait_for

FACTS = [
    "Ivy moved to Porto in March.",
    "Ivy works at a bakery on the river.",
    "Ivy's sister Mara teaches chemistry.",
]
#: Consolidation's first reply: one observation on facts 0 and 1, one on fact 0 alone,
#: one on fact 2.
OBSERVE = {
    "when": "new facts:",
    "json": {
        "actions": [
            {"action": "create", "text": "Ivy lives and works in Porto.", "facts": [0, 1]},
            {"action": "create", "text": "Ivy is new in Porto.", "facts": [0]},
            {"action": "create", "text": "Mara is a chemistry teacher.", "facts": [2]},
        ]
    },
}
#: Later consolidations create nothing, so what a test sees is what curation left.
QUIET = {"when": "new facts:", "json": {"actions": []}}
ANSWER = {"text": "Ivy lives in Porto."}


@pytest.fixture(params=DATABASES, scope="module")
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    with heed_server(
        request.param,
        tmp_path_factory.mktemp("curation"),
        llm_provider="scripted",
        retain_extraction="off",
        observations="on",
        consolidation_debounce_seconds=0.05,
        mental_model_min_refresh_interval_seconds=0,
    ) as srv:
        yield srv


def script(server: LiveServer, *replies: dict[str, Any]) -> ScriptedProvider:
    provider = ScriptedProvider({"replies": list(replies)})
    server.app.state.services.retain_provider.current = provider
    return provider


def url(server: LiveServer, bank: str, path: str = "") -> str:
    return f"{server.url}/v1/default/banks/{bank}{path}"


def memories(server: LiveServer, bank: str, **params: str) -> list[dict[str, Any]]:
    response = httpx.get(url(server, bank, "/memories/list"), params=params, timeout=30)
    response.raise_for_status()
    items: list[dict[str, Any]] = response.json()["items"]
    return items


def observed_bank(server: LiveServer) -> tuple[str, dict[str, str]]:
    """A bank holding :data:`FACTS` and the three observations :data:`OBSERVE` makes; the
    facts' ids by text. Later consolidations are :data:`QUIET`."""
    script(server, OBSERVE)
    bank = "cur-" + uuid.uuid4().hex[:8]
    httpx.put(url(server, bank), json={}, timeout=30).raise_for_status()
    httpx.post(
        url(server, bank, "/memories"),
        json={"items": [{"content": text, "fact_type": "world"} for text in FACTS]},
        timeout=60,
    ).raise_for_status()
    wait_for(lambda: len(memories(server, bank, type="observation")) == 3, seconds=30)
    wait_for(lambda: not memories(server, bank, consolidation_state="pending"), seconds=30)
    script(server, QUIET)
    ids = {m["text"]: m["id"] for m in memories(server, bank, type="world")}
    assert set(ids) == set(FACTS)
    return bank, ids


def with_client(server: LiveServer, call: Callable[[Hindsight], Awaitable[Any]]) -> Any:
    """*call* on the unmodified client (its low-level API is async), on a loop of its own."""

    async def run() -> Any:
        client = Hindsight(base_url=server.url, timeout=30)
        try:
            return await call(client)
        finally:
            await client.aclose()

    return asyncio.run(run())


def observation_texts(server: LiveServer, bank: str) -> set[str]:
    return {m["text"] for m in memories(server, bank, type="observation")}


def recall_texts(server: LiveServer, bank: str, query: str) -> list[str]:
    response = httpx.post(
        url(server, bank, "/memories/recall"),
        json={"query": query, "types": ["world"], "budget": "low"},
        timeout=30,
    )
    response.raise_for_status()
    return [r["text"] for r in response.json()["results"]]


def test_an_edit_re_embeds_keeps_history_and_re_derives_what_cited_the_fact(
    server: LiveServer,
) -> None:
    bank, ids = observed_bank(server)
    moved = ids[FACTS[0]]
    provider = script(server, QUIET)
    edited = "Ivy moved to Lisbon in March."
    body = with_client(
        server,
        lambda client: client._memory_api.update_memory(
            bank, moved, UpdateMemoryRequest(text=edited, reason="she moved")
        ),
    )
    assert body["id"] == moved and body["text"] == edited and body["state"] == "valid"

    # Both observations citing the fact are gone; the one on another fact stays.
    assert observation_texts(server, bank) == {"Mara is a chemistry teacher."}
    # The edited fact and the other fact of the removed observation are consolidated again,
    # the edited one with its new text.
    wait_for(lambda: not memories(server, bank, consolidation_state="pending"), seconds=30)
    prompts = [r.messages[-1].content for r in provider.requests]
    assert any(edited in p and FACTS[1] in p for p in prompts), prompts
    assert not any(FACTS[0] in p for p in prompts)

    # Recall follows the new text, by keyword and by vector; the old text is history.
    assert recall_texts(server, bank, "Lisbon")[0] == edited
    assert FACTS[0] not in recall_texts(server, bank, "Porto March")
    history = httpx.get(url(server, bank, f"/memories/{moved}/history"), timeout=30).json()
    assert [(h["text"], h["reason"]) for h in history["history"]] == [(FACTS[0], "she moved")]


def test_dates_context_type_and_entities_are_edited_or_cleared(server: LiveServer) -> None:
    bank, ids = observed_bank(server)
    fact = ids[FACTS[2]]
    r = httpx.patch(
        url(server, bank, f"/memories/{fact}"),
        json={
            "context": "family",
            "occurred_start": "2024-05-01",
            "fact_type": "experience",
            "entities": ["Mara", "Ivy"],
        },
        timeout=30,
    )
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["context"] == "family" and got["fact_type"] == "experience"
    assert got["occurred_start"].startswith("2024-05-01")
    assert set(got["entities"].split(", ")) == {"Mara", "Ivy"}
    r = httpx.patch(
        url(server, bank, f"/memories/{fact}"),
        json={"context": None, "occurred_start": "", "entities": []},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["context"] == "" and got["occurred_start"] is None and got["entities"] == ""
    assert got["text"] == FACTS[2]


def test_invalidate_hides_the_fact_and_revert_brings_it_back(server: LiveServer) -> None:
    bank, ids = observed_bank(server)
    fact = ids[FACTS[1]]
    assert FACTS[1] in recall_texts(server, bank, "bakery river")
    r = httpx.patch(
        url(server, bank, f"/memories/{fact}"),
        json={"state": "invalidated", "reason": "she quit"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "invalidated"
    assert FACTS[1] not in recall_texts(server, bank, "bakery river")
    assert fact not in {m["id"] for m in memories(server, bank)}
    assert observation_texts(server, bank) == {
        "Ivy is new in Porto.",
        "Mara is a chemistry teacher.",
    }
    got = httpx.get(url(server, bank, f"/memories/{fact}"), timeout=30).json()
    assert got["state"] == "invalidated" and got["text"] == FACTS[1]
    # An invalidated fact is not edited until it is reverted.
    r = httpx.patch(url(server, bank, f"/memories/{fact}"), json={"text": "x"}, timeout=30)
    assert r.status_code == 400 and "revert" in r.json()["detail"]

    r = httpx.patch(url(server, bank, f"/memories/{fact}"), json={"state": "valid"}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "valid" and r.json()["id"] == fact
    assert FACTS[1] in recall_texts(server, bank, "bakery river")
    history = httpx.get(url(server, bank, f"/memories/{fact}/history"), timeout=30).json()
    assert [(h["state"], h["reason"]) for h in history["history"]] == [("invalidated", "she quit")]


def test_a_delete_of_a_fact_removes_what_cites_it(server: LiveServer) -> None:
    bank, ids = observed_bank(server)
    r = httpx.delete(url(server, bank, f"/memories/{ids[FACTS[2]]}"), timeout=30)
    assert r.status_code == 200, r.text
    assert observation_texts(server, bank) == {
        "Ivy lives and works in Porto.",
        "Ivy is new in Porto.",
    }


def test_a_curation_makes_the_banks_mental_models_stale(server: LiveServer) -> None:
    bank, ids = observed_bank(server)
    server.app.state.services.reflect.provider = ScriptedProvider(
        {"select": "turn", "replies": [ANSWER]}
    )
    created = httpx.post(
        url(server, bank, "/mental-models"),
        json={"name": "Ivy", "source_query": "Where does Ivy live?"},
        timeout=30,
    ).json()
    model = url(server, bank, f"/mental-models/{created['mental_model_id']}")

    def refreshed() -> bool:
        got = httpx.get(model, timeout=30).json()
        return bool(got["last_refreshed_at"]) and not got["is_stale"]

    wait_for(refreshed, seconds=30)
    r = httpx.patch(
        url(server, bank, f"/memories/{ids[FACTS[0]]}"),
        json={"state": "invalidated"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert httpx.get(model, timeout=30).json()["is_stale"] is True


def test_observations_and_bad_edits_are_refused_by_name(server: LiveServer) -> None:
    bank, ids = observed_bank(server)
    observation = memories(server, bank, type="observation")[0]["id"]
    fact = ids[FACTS[0]]
    cases: list[tuple[str, dict[str, Any], int, str]] = [
        (observation, {"text": "x"}, 400, "observation"),
        (fact, {}, 400, "at least one field"),
        (fact, {"occurred_start": "next week"}, 400, "occurred_start"),
        (fact, {"text": "  "}, 400, "text"),
        (fact, {"state": "deleted"}, 422, "state"),
        (fact, {"fact_type": "observation"}, 422, "fact_type"),
        ("no-such-memory", {"text": "x"}, 404, "no-such-memory"),
    ]
    for memory, body, status, named in cases:
        r = httpx.patch(url(server, bank, f"/memories/{memory}"), json=body, timeout=30)
        assert r.status_code == status, (body, r.text)
        assert named in r.text, (body, r.text)
    assert {m["text"] for m in memories(server, bank, type="world")} == set(FACTS)
    r = httpx.delete(url(server, bank, "/memories"), params={"type": "dream"}, timeout=30)
    assert r.status_code == 422 and "type" in r.text


def test_clearing_one_type_removes_its_facts_and_what_cites_them(server: LiveServer) -> None:
    bank, _ids = observed_bank(server)
    httpx.post(
        url(server, bank, "/memories"),
        json={"items": [{"content": "I met Ivy at the market.", "fact_type": "experience"}]},
        timeout=60,
    ).raise_for_status()
    deleted = with_client(
        server, lambda client: client._memory_api.clear_bank_memories(bank, type="world")
    )
    assert deleted.success and deleted.deleted_count == 3
    assert memories(server, bank, type="world") == []
    assert observation_texts(server, bank) == set()
    assert [m["text"] for m in memories(server, bank, type="experience")] == [
        "I met Ivy at the market."
    ]


def test_clearing_a_bank_leaves_no_row_behind(server: LiveServer) -> None:
    bank, ids = observed_bank(server)
    httpx.patch(
        url(server, bank, f"/memories/{ids[FACTS[0]]}"),
        json={"state": "invalidated"},
        timeout=30,
    ).raise_for_status()
    long_tags = [f"tag-{i}-" + "x" * 40 for i in range(4)]  # a shared value (memory_values)
    httpx.post(
        url(server, bank, "/memories"),
        json={"items": [{"content": "Ivy bakes rye bread.", "tags": long_tags}]},
        timeout=60,
    ).raise_for_status()
    r = httpx.delete(url(server, bank, "/memories"), timeout=30)
    assert r.status_code == 200, r.text
    # Live: 2 facts, the 1 observation not citing the invalidated fact, the new unit; and
    # the invalidated fact.
    assert r.json()["deleted_count"] == 5

    store = server.app.state.services.memory.store
    ref = store.get_bank("default", bank).ref
    with store.db.read() as conn:
        for table, where in (
            ("memory_units", "bank_ref = ?"),
            ("memory_invalidated_units", "bank_ref = ?"),
            ("memory_entities", "bank_ref = ?"),
            ("memory_documents", "bank_ref = ?"),
            ("memory_chunks", "bank_ref = ?"),
            ("memory_values", "bank_ref = ?"),
        ):
            count = conn.execute(f"SELECT COUNT(*) FROM {table} WHERE {where}", (ref,))
            assert count.fetchone()[0] == 0, table
    assert recall_texts(server, bank, "Ivy bread Porto bakery") == []
    assert httpx.get(url(server, bank, "/entities"), timeout=30).json()["items"] == []
    # The bank itself stays, and takes new memories.
    httpx.post(
        url(server, bank, "/memories"), json={"items": [{"content": "Ivy is back."}]}, timeout=60
    ).raise_for_status()
    assert [m["text"] for m in memories(server, bank)] == ["Ivy is back."]


def documents_call(server: LiveServer, call: Callable[[Any], Awaitable[Any]]) -> Any:
    """*call* on the client's documents API."""
    from hindsight_client_api.api.documents_api import DocumentsApi

    return with_client(server, lambda client: call(DocumentsApi(client._api_client)))


def test_a_documents_new_tags_reach_its_memories_and_re_derive_what_cites_them(
    server: LiveServer,
) -> None:
    from hindsight_client_api.models.update_document_request import UpdateDocumentRequest

    script(server, OBSERVE)
    bank = "cur-" + uuid.uuid4().hex[:8]
    httpx.put(url(server, bank), json={}, timeout=30).raise_for_status()
    httpx.post(
        url(server, bank, "/memories"),
        json={
            "items": [
                {"content": text, "document_id": "notes/ivy", "tags": ["old"]} for text in FACTS
            ]
        },
        timeout=60,
    ).raise_for_status()
    wait_for(lambda: len(memories(server, bank, type="observation")) == 3, seconds=30)
    provider = script(server, QUIET)

    done = documents_call(
        server,
        lambda api: api.update_document(bank, "notes/ivy", UpdateDocumentRequest(tags=["new"])),
    )
    assert done.success is True
    doc = httpx.get(url(server, bank, "/documents/notes/ivy"), timeout=30).json()
    assert doc["tags"] == ["new"]
    assert {tuple(m["tags"]) for m in memories(server, bank, type="world")} == {("new",)}
    assert observation_texts(server, bank) == set()  # all three cited the document's facts
    wait_for(lambda: not memories(server, bank, consolidation_state="pending"), seconds=30)
    assert any(all(f in r.messages[-1].content for f in FACTS) for r in provider.requests)

    for body, status, named in (
        ({"tags": ["x"], "observation_scopes": "shared"}, 400, "observation_scopes"),
        ({}, 400, "give tags"),
    ):
        r = httpx.patch(url(server, bank, "/documents/notes/ivy"), json=body, timeout=30)
        assert r.status_code == status and named in r.text, r.text
    r = httpx.patch(url(server, bank, "/documents/nope"), json={"tags": []}, timeout=30)
    assert r.status_code == 404 and "nope" in r.text
    assert httpx.get(url(server, bank, "/documents/notes/ivy")).json()["tags"] == ["new"]


def test_a_reprocessed_document_is_retained_again_with_the_banks_settings_now(
    server: LiveServer,
) -> None:
    bank = "cur-" + uuid.uuid4().hex[:8]
    httpx.put(url(server, bank), json={}, timeout=30).raise_for_status()
    httpx.post(
        url(server, bank, "/memories"),
        json={"items": [{"content": FACTS[0], "document_id": "d1", "tags": ["t"]}]},
        timeout=60,
    ).raise_for_status()
    [before] = memories(server, bank)
    assert not before["source_memory_ids"]  # stored verbatim: extraction is off
    # The bank now extracts facts: a reprocess retains the document under that setting.
    httpx.patch(
        url(server, bank, "/config"),
        json={"updates": {"retain_extraction_mode": "concise"}},
        timeout=30,
    ).raise_for_status()
    script(
        server,
        {
            "when": "[0] (",
            "json": {
                "facts": [{"text": "Ivy lives in Porto.", "fact_type": "world", "sources": [0]}]
            },
        },
        QUIET,
    )
    started = documents_call(server, lambda api: api.reprocess_document(bank, "d1"))
    assert started.success is True

    def ended() -> dict[str, Any] | None:
        run: dict[str, Any] = httpx.get(f"{server.url}/v1/runs/{started.operation_id}").json()
        return run if run["phase"] in ("completed", "failed", "cancelled") else None

    assert wait_for(ended, seconds=30)["phase"] == "completed"
    after = memories(server, bank)
    assert before["id"] not in {m["id"] for m in after}  # replaced, not appended
    fact = [m for m in after if m["source_memory_ids"]]
    assert [m["text"] for m in fact] == ["Ivy lives in Porto."]
    assert all(m["tags"] == ["t"] for m in after)
    assert httpx.post(url(server, bank, "/documents/nope/reprocess"), timeout=30).status_code == 404
