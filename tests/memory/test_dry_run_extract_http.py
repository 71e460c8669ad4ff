"""``POST .../memories/dry-run-extract`` (the client's ``MemoryApi.dry_run_extract_memories``)
on a real server, on SQLite and PostgreSQL, the scripted provider playing the extraction
model: the candidate facts, the chunks and the provider's token usage, with the bank's
settings or the request's overrides, and nothing written; the fields heed does not
implement refused by name; a bank or server that does not extract refused naming why; a
client that leaves stops the LLM call and frees the retain slot.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
from hindsight_client_api.api.memory_api import MemoryApi
from hindsight_client_api.api_client import ApiClient
from hindsight_client_api.configuration import Configuration
from hindsight_client_api.models.dry_run_extract_request import DryRunExtractRequest
from hindsight_client_api.models.dry_run_extraction_result import DryRunExtractionResult

from heed.llm import ScriptedProvider
from tests.memory.test_learning_http import EXTRACTION, TURNS
from tests.pg_support import DATABASES, heed_server
from tests.support import LiveServer, wait_for


@pytest.fixture(params=DATABASES, scope="module")
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    with heed_server(
        request.param,
        tmp_path_factory.mktemp("dry-run"),
        llm_provider="scripted",
        retain_extraction="concise",
        observations="off",
    ) as srv:
        yield srv


def script(server: LiveServer, *replies: dict[str, Any]) -> ScriptedProvider:
    provider = ScriptedProvider({"replies": list(replies)})
    server.app.state.services.retain_provider.current = provider
    return provider


def new_bank(server: LiveServer, **fields: Any) -> str:
    bank = "dry-" + uuid.uuid4().hex[:8]
    httpx.put(f"{server.url}/v1/default/banks/{bank}", json=fields, timeout=30).raise_for_status()
    return bank


def dry_run(server: LiveServer, bank: str, **fields: Any) -> DryRunExtractionResult:
    async def call() -> DryRunExtractionResult:
        async with ApiClient(Configuration(host=server.url)) as api_client:
            request = DryRunExtractRequest.from_dict(fields)
            assert request is not None
            return await MemoryApi(api_client).dry_run_extract_memories(bank, request)

    return asyncio.run(call())


def post(server: LiveServer, bank: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/default/banks/{bank}/memories/dry-run-extract", json=body, timeout=30
    )


def stored(server: LiveServer, bank: str) -> tuple[int, int]:
    units = httpx.get(f"{server.url}/v1/default/banks/{bank}/memories/list", timeout=10).json()
    documents = httpx.get(f"{server.url}/v1/default/banks/{bank}/documents", timeout=10).json()
    return units["total"], documents["total"]


def test_facts_chunks_and_usage_are_previewed_and_nothing_is_written(server: LiveServer) -> None:
    provider = script(server, EXTRACTION)
    bank = new_bank(server, retain_mission="pets and places")
    # Long enough for two chunks of about 3,000 characters.
    filler = [
        f"Caroline: On day {i} I walked Rex in the park and we met friends." for i in range(60)
    ]
    found = dry_run(server, bank, content="\n".join([*TURNS, *filler]), context="chat")

    assert found.chunks is not None and len(found.chunks) == 2
    assert [c.fact_count for c in found.chunks] == [2, 2]
    assert found.chunks[0].text.startswith("[0] (")
    assert TURNS[0] in found.chunks[0].text
    facts = found.facts or []
    assert [f.chunk_index for f in facts] == [0, 0, 1, 1]
    adopted = facts[0]
    assert adopted.text == "Caroline adopted a beagle puppy named Rex."
    assert adopted.fact_type == "experience"
    assert {"Caroline", "Rex"} <= set(adopted.entities or [])
    assert adopted.occurred_start is not None  # the turn's date (the retain's time)

    extraction_calls = [r for r in provider.requests if r.json_schema is not None]
    assert len(extraction_calls) == 2
    assert all("pets and places" in r.messages[0].content for r in extraction_calls)
    prompt = sum(len(m.content.split()) for r in extraction_calls for m in r.messages)
    usage = found.usage
    assert usage is not None
    assert usage.input_tokens == prompt
    assert usage.output_tokens is not None and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert stored(server, bank) == (0, 0)


def test_the_request_overrides_the_banks_mode_and_mission(server: LiveServer) -> None:
    provider = script(server, EXTRACTION)
    bank = new_bank(server, retain_extraction_mode="off", retain_mission="pets")
    refused = post(server, bank, {"content": "\n".join(TURNS)})
    assert refused.status_code == 400
    assert "retain_extraction_mode is off" in refused.json()["detail"]
    assert len(provider.requests) == 0

    found = dry_run(
        server,
        bank,
        content="\n".join(TURNS),
        retain_extraction_mode="verbose",
        retain_mission="only dogs",
    )
    assert len(found.facts or []) == 2
    [call] = provider.requests
    assert "State every fact" in call.messages[0].content
    assert "only dogs" in call.messages[0].content and "pets" not in call.messages[0].content

    # "off" asked for explicitly calls no LLM: the chunks, no fact.
    off = post(server, bank, {"content": "\n".join(TURNS), "retain_extraction_mode": "off"})
    assert off.status_code == 200, off.text
    assert off.json()["facts"] == [] and len(off.json()["chunks"]) == 1
    assert len(provider.requests) == 1
    bad = post(server, bank, {"content": "x", "retain_extraction_mode": "everything"})
    assert bad.status_code == 400 and "retain_extraction_mode" in bad.json()["detail"]
    assert stored(server, bank) == (0, 0)


def test_a_malformed_reply_is_a_failed_chunk_whose_tokens_still_count(server: LiveServer) -> None:
    provider = script(server, {"when": "[0] (", "text": "not json at all"})
    bank = new_bank(server)
    response = post(server, bank, {"content": "\n".join(TURNS)})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["facts"] == [] and body["failed_chunks"] == 1
    assert [c["fact_count"] for c in body["chunks"]] == [0]
    assert len(provider.requests) == 2  # the call and its re-ask
    prompt = sum(len(m.content.split()) for r in provider.requests for m in r.messages)
    assert body["usage"]["input_tokens"] == prompt


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("strategy", "fast"),
        ("agent_name", "Ava"),
        ("retain_custom_instructions", "be brief"),
        ("retain_extract_causal_links", False),
        ("retain_chunk_size", 500),
        ("entity_labels", [{"key": "topic"}]),
        ("entities_allow_free_form", True),
        ("llm_output_language", "fr"),
    ],
)
def test_a_field_heed_does_not_implement_is_refused_by_name(
    server: LiveServer, field: str, value: Any
) -> None:
    provider = script(server, EXTRACTION)
    bank = new_bank(server)
    response = post(server, bank, {"content": "\n".join(TURNS), field: value})
    assert response.status_code == 400
    assert field in response.json()["detail"]
    assert len(provider.requests) == 0
    # null asks for the default: accepted (the client's model sends every unset field so).
    assert post(server, bank, {"content": TURNS[0], field: None}).status_code == 200


def test_no_provider_for_extraction_and_bad_content_are_refused(server: LiveServer) -> None:
    script(server, EXTRACTION)
    bank = new_bank(server)
    engine = server.app.state.services.memory
    learning = engine.learning
    engine.learning = replace(learning, extractor=None)
    try:
        response = post(server, bank, {"content": TURNS[0], "retain_extraction_mode": "concise"})
    finally:
        engine.learning = learning
    assert response.status_code == 400
    assert "no LLM provider for fact extraction" in response.json()["detail"]
    image = {"type": "image", "source": {"type": "url", "url": "http://x/a.png"}}
    blocks = post(server, bank, {"content": [{"type": "text", "text": "hi"}, image]})
    assert blocks.status_code == 400 and "content[1]" in blocks.json()["detail"]
    assert post(server, bank, {"content": "  "}).status_code == 400
    assert post(server, "no-such-bank", {"content": "hi"}).status_code == 404


async def test_a_client_that_leaves_stops_the_llm_call(server: LiveServer) -> None:
    provider = script(server, {**EXTRACTION, "latency": 60})
    bank = new_bank(server)
    lane = server.app.state.services.lanes["retain"]
    async with httpx.AsyncClient(base_url=server.url) as http:
        request = asyncio.create_task(
            http.post(
                f"/v1/default/banks/{bank}/memories/dry-run-extract",
                json={"content": "\n".join(TURNS)},
                timeout=90,
            )
        )
        await asyncio.to_thread(wait_for, lambda: provider.requests, 10)
        assert lane.stats().in_use == 1
        request.cancel()  # closes the connection: the server sees http.disconnect
        with pytest.raises(asyncio.CancelledError):
            await request
    await asyncio.to_thread(wait_for, lambda: lane.stats().in_use == 0, 5)
