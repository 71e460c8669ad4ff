"""Memory that learns, end to end over HTTP: facts extracted at retain with provenance, a
background consolidation into observations, recall of observations, and a consolidation
that stops when cancelled or when its bank is deleted, on SQLite and PostgreSQL.

Real server on a socket, the scripted provider answering the structured-output calls by
matching the prompt (extraction's numbered units, consolidation's "New facts:").
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hindsight_client import Hindsight

from heed.api.app import create_app
from heed.llm import ScriptedProvider
from heed.settings import Settings
from tests.pg_support import fresh_schema
from tests.support import LiveServer, live_server, wait_for

TURNS = [
    "Caroline: I adopted a puppy named Rex last week.",
    "Melanie: That's lovely! What breed is he?",
    "Caroline: A beagle. He loves the park near my flat in Lyon.",
]
EXTRACTION = {
    "when": "[0] (",
    "json": {
        "facts": [
            {
                "text": "Caroline adopted a beagle puppy named Rex.",
                "fact_type": "experience",
                "who": "Caroline",
                "entities": ["Caroline", "Rex"],
                "sources": [0, 2],
            },
            {
                "text": "Rex loves the park near Caroline's flat in Lyon.",
                "fact_type": "world",
                "where": "Lyon",
                "entities": ["Rex", "Lyon"],
                "sources": [2],
                "causes": [0],
            },
        ]
    },
}
CONSOLIDATION = {
    "when": "new facts:",
    "json": {
        "actions": [
            {"action": "create", "text": "Caroline owns a beagle called Rex.", "facts": [0, 1]}
        ]
    },
}


@pytest.fixture(params=["sqlite", "postgresql"], scope="module")
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    def settings(url: str | None) -> Settings:
        return Settings(
            data_dir=tmp_path_factory.mktemp("learning"),
            database_url=url,
            llm_provider="scripted",
            retain_extraction="concise",
            observations="on",
            consolidation_debounce_seconds=0.05,
            run_reaper_interval=0.2,
        )

    if request.param == "sqlite":
        with live_server(create_app(settings(None))) as srv:
            yield srv
        return
    with fresh_schema() as url, live_server(create_app(settings(url))) as srv:
        yield srv


def script(server: LiveServer, *replies: dict[str, Any]) -> ScriptedProvider:
    provider = ScriptedProvider({"replies": list(replies)})
    server.app.state.services.retain_provider.current = provider
    return provider


def new_bank(server: LiveServer, **fields: Any) -> str:
    bank = "learn-" + uuid.uuid4().hex[:8]
    response = httpx.put(f"{server.url}/v1/default/banks/{bank}", json=fields, timeout=30)
    response.raise_for_status()
    return bank


def memories(server: LiveServer, bank: str, **params: str) -> list[dict[str, Any]]:
    response = httpx.get(
        f"{server.url}/v1/default/banks/{bank}/memories/list", params=params, timeout=30
    )
    response.raise_for_status()
    items: list[dict[str, Any]] = response.json()["items"]
    return items


def test_retain_extracts_facts_with_provenance_and_consolidates_them(server: LiveServer) -> None:
    script(server, EXTRACTION, CONSOLIDATION)
    bank = new_bank(server)
    client = Hindsight(base_url=server.url, timeout=30)
    try:
        client.retain(bank, "\n".join(TURNS), context="chat")
        facts = {m["text"]: m for m in memories(server, bank) if m["source_memory_ids"]}
        assert set(facts) == {
            "Caroline adopted a beagle puppy named Rex.",
            "Rex loves the park near Caroline's flat in Lyon.",
        }
        turns = {m["id"]: m["text"] for m in memories(server, bank) if not m["source_memory_ids"]}
        adopted = facts["Caroline adopted a beagle puppy named Rex."]
        assert [turns[i] for i in adopted["source_memory_ids"]] == [TURNS[0], TURNS[2]]
        assert adopted["fact_type"] == "experience"
        assert "Rex" in adopted["entities"]

        observations = wait_for(lambda: memories(server, bank, type="observation"), seconds=30)
        [observation] = observations
        assert observation["text"] == "Caroline owns a beagle called Rex."
        # Consolidation took the facts, not the turns they were stated from, nor the turn
        # the extraction found no fact in (Melanie's question): it stays retrievable.
        done = memories(server, bank, consolidation_state="done")
        assert {m["text"] for m in done} == set(facts)
        assert TURNS[1] in {m["text"] for m in memories(server, bank)}
        assert memories(server, bank, consolidation_state="pending") == []
        assert len(observation["source_memory_ids"]) == 2
        assert set(observation["source_memory_ids"]) <= {m["id"] for m in done}
        assert observation["proof_count"] == 2

        # Recall returns the observation; prefer_observations drops the facts it rests on.
        both = client.recall(
            bank, "Caroline's dog Rex", types=["world", "experience", "observation"]
        )
        assert "observation" in {r.type for r in both.results}
        preferred = client.recall(
            bank,
            "Caroline's dog Rex",
            types=["world", "experience", "observation"],
            prefer_observations=True,
        )
        kept = {r.id for r in preferred.results}
        assert observation["id"] in kept
        assert not kept & set(observation["source_memory_ids"])

        operations = httpx.get(f"{server.url}/v1/default/banks/{bank}/operations", timeout=10)
        kinds = {o["operation_type"] for o in operations.json()["operations"]}
        assert kinds == {"consolidation"}  # the retain was synchronous
    finally:
        client.close()


def test_a_malformed_reply_keeps_the_chunk_verbatim_and_consolidates_the_turns(
    server: LiveServer,
) -> None:
    provider = script(
        server,
        {"when": "[0] (", "text": "not json at all"},
        {"when": "new facts:", "json": {"actions": []}},
    )
    bank = new_bank(server)
    response = httpx.post(
        f"{server.url}/v1/default/banks/{bank}/memories",
        json={"items": [{"content": "\n".join(TURNS)}]},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    assert response.json()["extraction"] == {"facts": 0, "chunks": 1, "failed_chunks": 1}
    units = memories(server, bank)
    assert {u["text"] for u in units} == set(TURNS)  # verbatim only, nothing lost
    extraction_calls = [r for r in provider.requests if r.json_schema is not None]
    assert len([r for r in extraction_calls if "[0] (" in r.messages[-1].content]) >= 1
    wait_for(lambda: memories(server, bank, consolidation_state="done"), seconds=30)
    assert memories(server, bank, type="observation") == []


def test_consolidation_is_cancelled_while_processing_and_frees_its_slot(
    server: LiveServer,
) -> None:
    slow = {"when": "new facts:", "latency": 60, "json": {"actions": []}}
    provider = script(server, EXTRACTION, slow)
    bank = new_bank(server)
    httpx.post(
        f"{server.url}/v1/default/banks/{bank}/memories",
        json={"items": [{"content": "\n".join(TURNS)}]},
        timeout=30,
    ).raise_for_status()
    lane = server.app.state.services.lanes["reflect"]

    def processing() -> str | None:
        ops = httpx.get(f"{server.url}/v1/default/banks/{bank}/operations", timeout=10).json()
        running = [o for o in ops["operations"] if o["operation_type"] == "consolidation"]
        busy = running and running[0]["status"] == "processing" and lane.stats().in_use
        return running[0]["id"] if busy else None

    run_id = wait_for(processing, seconds=30)
    started = time.monotonic()
    response = httpx.post(f"{server.url}/v1/runs/{run_id}/cancel", timeout=30)
    assert response.status_code in (200, 202), response.text

    def cancelled() -> bool:
        run = httpx.get(f"{server.url}/v1/runs/{run_id}", timeout=10).json()
        return bool(run["phase"] == "cancelled")

    wait_for(cancelled, seconds=10)
    assert time.monotonic() - started < 5  # not the 60 s the model would have taken
    assert lane.stats().in_use == 0
    assert memories(server, bank, type="observation") == []
    # its facts are still pending: nothing was lost, the next consolidation takes them
    assert len(memories(server, bank, consolidation_state="pending")) >= 2
    assert provider.requests


def test_deleting_a_bank_stops_its_consolidation_and_leaves_nothing(server: LiveServer) -> None:
    slow = {"when": "new facts:", "latency": 60, "json": {"actions": []}}
    script(server, EXTRACTION, slow)
    bank = new_bank(server)
    httpx.post(
        f"{server.url}/v1/default/banks/{bank}/memories",
        json={"items": [{"content": "\n".join(TURNS)}]},
        timeout=30,
    ).raise_for_status()
    lane = server.app.state.services.lanes["reflect"]
    wait_for(lambda: lane.stats().in_use, seconds=30)
    started = time.monotonic()
    response = httpx.delete(f"{server.url}/v1/default/banks/{bank}", timeout=30)
    assert response.status_code == 200, response.text
    assert time.monotonic() - started < 5
    assert lane.stats().in_use == 0
    # Recreated at once: empty, and nothing arrives later.
    new = httpx.put(f"{server.url}/v1/default/banks/{bank}", json={}, timeout=30)
    new.raise_for_status()
    time.sleep(0.5)
    assert memories(server, bank) == []


def test_clearing_observations_makes_their_facts_pending_again(server: LiveServer) -> None:
    script(server, EXTRACTION, CONSOLIDATION)
    bank = new_bank(server)
    httpx.post(
        f"{server.url}/v1/default/banks/{bank}/memories",
        json={"items": [{"content": "\n".join(TURNS)}]},
        timeout=30,
    ).raise_for_status()
    [observation] = wait_for(lambda: memories(server, bank, type="observation"), seconds=30)
    source = observation["source_memory_ids"][0]
    script(server, EXTRACTION, {"when": "new facts:", "latency": 60, "json": {"actions": []}})
    response = httpx.delete(
        f"{server.url}/v1/default/banks/{bank}/memories/{source}/observations", timeout=30
    )
    assert response.json() == {"deleted_count": 1}
    assert memories(server, bank, type="observation") == []
    assert len(memories(server, bank, consolidation_state="pending")) == 2
    missing = httpx.delete(
        f"{server.url}/v1/default/banks/{bank}/memories/no-such/observations", timeout=30
    )
    assert missing.status_code == 404
    httpx.delete(f"{server.url}/v1/default/banks/{bank}", timeout=30).raise_for_status()


def test_a_restart_resumes_consolidation_of_banks_with_pending_facts(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Facts left pending by a server that stopped (here: whose debounce never elapsed)
    are consolidated by the next server at start-up, with no retain to schedule it."""
    data_dir = tmp_path_factory.mktemp("resume")

    def settings(debounce: float) -> Settings:
        return Settings(
            data_dir=data_dir,
            llm_provider="scripted",
            retain_extraction="off",
            observations="on",
            consolidation_debounce_seconds=debounce,
        )

    with live_server(create_app(settings(3600))) as first:
        bank = new_bank(first)
        httpx.post(
            f"{first.url}/v1/default/banks/{bank}/memories",
            json={"items": [{"content": turn} for turn in TURNS]},
            timeout=30,
        ).raise_for_status()
        assert len(memories(first, bank, consolidation_state="pending")) == 3
    with live_server(create_app(settings(0.05))) as second:
        script(second, CONSOLIDATION)
        wait_for(lambda: memories(second, bank, type="observation"), seconds=30)
        assert memories(second, bank, consolidation_state="pending") == []


async def test_the_unmodified_client_drives_consolidation_and_observations(
    server: LiveServer,
) -> None:
    """``hindsight-client`` 1.1.0's own calls for part 1: consolidate, the operation's status
    and cancel, list by consolidation state, observation history, clear, recover."""
    script(server, EXTRACTION, CONSOLIDATION)
    bank = new_bank(server)
    client = Hindsight(base_url=server.url, timeout=30)
    try:
        await client.aretain(bank, "\n".join(TURNS), context="chat")
        listed = await client.memory.list_memories(bank, type="observation")
        for _ in range(300):
            if listed.items:
                break
            await asyncio.sleep(0.1)
            listed = await client.memory.list_memories(bank, type="observation")
        [observation] = listed.items
        assert observation.fact_type == "observation"
        assert len(observation.source_memory_ids or []) == 2 and observation.proof_count == 2
        history = await client.memory.get_observation_history(bank, observation.id)
        assert history is not None
        done = await client.memory.list_memories(bank, consolidation_state="done")
        assert len(done.items) == 2  # the two facts; the turns they came from stay as they are

        # A slow round: the client's consolidate starts it; its status is processing; the
        # client's cancel stops it mid-call.
        script(server, {"when": "new facts:", "latency": 60, "json": {"actions": []}})
        cleared = await client.banks.clear_observations(bank)
        assert cleared.deleted_count == 1
        started = await client.banks.trigger_consolidation(bank)
        operation_id = started.operation_id
        assert operation_id
        for _ in range(300):
            status = await client.operations.get_operation_status(bank, operation_id)
            if status.status == "processing":
                break
            await asyncio.sleep(0.1)
        assert status.status == "processing"
        again = await client.banks.trigger_consolidation(bank)
        assert again.deduplicated and again.operation_id == operation_id
        await client.operations.cancel_operation(bank, operation_id)
        for _ in range(100):
            status = await client.operations.get_operation_status(bank, operation_id)
            if status.status != "processing":
                break
            await asyncio.sleep(0.1)
        assert status.status in ("cancelled", "failed")
        pending = await client.memory.list_memories(bank, consolidation_state="pending")
        # nothing lost: the facts the cleared observation rested on wait for the next run
        assert len(pending.items) == 2
        assert {item.id for item in pending.items} == set(observation.source_memory_ids or [])
        recovered = await client.banks.recover_consolidation(bank)
        assert recovered.retried_count == 0  # nothing had failed
        gone = await client.memory.clear_memory_observations(bank, pending.items[0].id)
        assert gone.deleted_count == 0
    finally:
        await client.aclose()


def test_observation_scopes_and_per_scope_missions(server: LiveServer) -> None:
    """The bank's default scopes split facts by user and by topic, each scope with its own
    mission; a consolidate's ``observation_scopes`` overrides them for its run."""
    provider = script(server, CONSOLIDATION)
    bank = new_bank(
        server,
        retain_extraction_mode="off",
        observations_mission="Note what matters.",
        default_observation_scopes=[["user:*"], ["topic:*"]],
        consolidation_strategies=[
            {"scopes": [{"tags": ["user:*"]}], "observations_mission": "Track each user."}
        ],
    )
    items = [
        {"content": "Alice likes green tea.", "tags": ["user:alice", "topic:drinks"]},
        {"content": "Bob likes black coffee.", "tags": ["user:bob", "topic:drinks"]},
    ]
    httpx.post(
        f"{server.url}/v1/default/banks/{bank}/memories", json={"items": items}, timeout=30
    ).raise_for_status()

    def three() -> list[dict[str, Any]] | None:
        found = memories(server, bank, type="observation")
        return found if len(found) == 3 else None

    observations = wait_for(three, seconds=30)
    assert sorted(tuple(o["tags"]) for o in observations) == [
        ("topic:drinks",),
        ("user:alice",),
        ("user:bob",),
    ]
    calls = [r for r in provider.requests if "new facts:" in r.messages[-1].content.lower()]
    missions = {
        ("Alice" in c.messages[-1].content, "Bob" in c.messages[-1].content): c.messages[0].content
        for c in calls
    }
    assert "Track each user." in missions[(True, False)]
    assert "Track each user." in missions[(False, True)]
    assert "Note what matters." in missions[(True, True)]  # the topic scope: the bank's

    cleared = httpx.delete(f"{server.url}/v1/default/banks/{bank}/observations", timeout=30)
    assert cleared.json()["deleted_count"] == 3
    started = httpx.post(
        f"{server.url}/v1/default/banks/{bank}/consolidate",
        json={"observation_scopes": "shared"},
        timeout=30,
    )
    assert started.status_code == 200, started.text
    [shared] = wait_for(lambda: memories(server, bank, type="observation"), seconds=30)
    assert shared["tags"] == []
    refused = httpx.put(
        f"{server.url}/v1/default/banks/{bank}",
        json={"consolidation_strategies": [{"max_observations_per_scope": 3}]},
        timeout=30,
    )
    assert refused.status_code in (400, 422) and "max_observations_per_scope" in refused.text
    bad_mode = httpx.post(
        f"{server.url}/v1/default/banks/{bank}/consolidate",
        json={"observation_scopes": "everything"},
        timeout=30,
    )
    assert bad_mode.status_code in (400, 422) and "observation_scopes" in bad_mode.text
