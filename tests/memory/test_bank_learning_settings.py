"""A bank's learning settings change what the LLM is asked, through the ``openai`` provider.

A real server on SQLite and on PostgreSQL, configured as an operator would
(``HEED_LLM_PROVIDER=openai``, ``HEED_RETAIN_LLM_MODEL``, base URL and key in the
environment, every learning setting at its default), talks to the fake OpenAI-compatible
upstream on loopback (:mod:`tests.llm.fake_upstream`), which streams structured replies in
chunks and records every request. Per bank:

- ``retain_extraction_mode``: ``off`` sends no extraction request; ``concise`` and
  ``verbose`` send one per chunk, with the numbered, dated units and their own instruction;
- ``retain_mission``: said in the extraction request's instruction, only when set;
- ``enable_observations``: ``false`` sends no consolidation request (nothing is marked for
  one); the default sends one with the F-numbered facts, and ``observations_mission`` is said
  in it.

Each test's content carries a marker of its own, so a request is matched to its bank.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hindsight_client import Hindsight

from heed.api.app import create_app
from heed.settings import Settings
from tests.llm.fake_upstream import (
    Behaviour,
    RunningUpstream,
    serve_fake_upstream,
    text_chunks,
    usage_chunk,
)
from tests.pg_support import fresh_schema
from tests.support import LiveServer, live_server, wait_for

RETAIN_MODEL = "fake-retain-model"
DAY = "2024-05-01"
CONCISE = "State only facts worth remembering"
VERBOSE = "State every fact"
MISSION_SAYS = "What this memory is for:"


def _streamed(value: dict[str, Any]) -> Behaviour:
    """A structured reply streamed in three chunks, as a real upstream sends it."""
    text = json.dumps(value)
    third = len(text) // 3
    pieces = [text[:third], text[third : 2 * third], text[2 * third :]]
    return Behaviour(chunks=[*text_chunks(pieces), usage_chunk(40, 20)])


def _user_text(body: dict[str, Any]) -> str:
    return str([m for m in body["messages"] if m["role"] == "user"][-1]["content"])


def _system_text(body: dict[str, Any]) -> str:
    return str(next(m for m in body["messages"] if m["role"] == "system")["content"])


def _marker_of(text: str) -> str:
    return next((word for word in text.split() if word.startswith("Zk")), "Zk?").strip(".:,")


def respond(body: dict[str, Any]) -> Behaviour | None:
    """Extraction: one fact from unit 0; consolidation: one observation from F0."""
    user = _user_text(body)
    marker = _marker_of(user)
    if user.startswith("[0] ("):
        fact = {
            "text": f"{marker} keeps bees on a roof in Lyon.",
            "fact_type": "world",
            "entities": ["Lyon"],
            "sources": [0],
            "occurred_start": DAY,
        }
        return _streamed({"facts": [fact]})
    if user.startswith("New facts:"):
        return _streamed(
            {"actions": [{"action": "create", "text": f"{marker} is a beekeeper.", "facts": [0]}]}
        )
    return None


@pytest.fixture(scope="module")
def upstream() -> Iterator[RunningUpstream]:
    with serve_fake_upstream() as running:
        running.app.responder = respond
        yield running


@pytest.fixture(params=["sqlite", "postgresql"], scope="module")
def server(
    request: pytest.FixtureRequest,
    upstream: RunningUpstream,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[LiveServer]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HEED_DATA_DIR", str(tmp_path_factory.mktemp("bank-learning")))
        env.setenv("HEED_LLM_PROVIDER", "openai")
        env.setenv("HEED_LLM_BASE_URL", upstream.base_url)
        env.setenv("HEED_LLM_MODEL", "fake-chat-model")
        env.setenv("HEED_LLM_API_KEY", "sk-test")
        env.setenv("HEED_RETAIN_LLM_MODEL", RETAIN_MODEL)
        env.setenv("HEED_CONSOLIDATION_DEBOUNCE_SECONDS", "0.05")
        for name in ("HEED_RETAIN_EXTRACTION", "HEED_OBSERVATIONS", "HEED_DATABASE_URL"):
            env.delenv(name, raising=False)
        if request.param == "sqlite":
            with live_server(create_app(Settings())) as srv:
                yield srv
            return
        with fresh_schema() as url:
            env.setenv("HEED_DATABASE_URL", url)
            with live_server(create_app(Settings())) as srv:
                yield srv


def requests_of(upstream: RunningUpstream, marker: str, kind: str) -> list[dict[str, Any]]:
    """The bodies of the upstream requests for *marker*'s content: ``extraction`` (numbered
    units) or ``consolidation`` (new facts)."""
    start = "[0] (" if kind == "extraction" else "New facts:"
    bodies = [record.body for record in list(upstream.app.records)]
    return [b for b in bodies if _user_text(b).startswith(start) and marker in _user_text(b)]


def new_bank(server: LiveServer, **config: Any) -> tuple[str, str]:
    """A bank created by the unmodified client with *config* (the extra fields its
    ``create_bank`` takes), and a marker for its content."""
    bank = "learn-" + uuid.uuid4().hex[:8]
    client = Hindsight(base_url=server.url, timeout=30)
    try:
        client.create_bank(bank, **config)
        overrides = client.get_bank_config(bank)["overrides"]
    finally:
        client.close()
    assert {k: overrides.get(k) for k in config} == config  # taken, not only echoed
    return bank, "Zk" + uuid.uuid4().hex[:8]


def retain(server: LiveServer, bank: str, marker: str) -> dict[str, Any]:
    response = httpx.post(
        f"{server.url}/v1/default/banks/{bank}/memories",
        json={
            "items": [
                {
                    "content": f"{marker}: I started keeping bees on my roof in Lyon.",
                    "timestamp": f"{DAY}T10:00:00Z",
                }
            ]
        },
        timeout=60,
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def memories(server: LiveServer, bank: str, **params: str) -> list[dict[str, Any]]:
    response = httpx.get(
        f"{server.url}/v1/default/banks/{bank}/memories/list", params=params, timeout=30
    )
    response.raise_for_status()
    items: list[dict[str, Any]] = response.json()["items"]
    return items


@pytest.mark.parametrize("mode", ["off", "concise", "verbose"])
def test_retain_extraction_mode_decides_the_extraction_request(
    server: LiveServer, upstream: RunningUpstream, mode: str
) -> None:
    bank, marker = new_bank(server, retain_extraction_mode=mode)
    retain(server, bank, marker)
    sent = requests_of(upstream, marker, "extraction")
    stored = [m for m in memories(server, bank) if m["fact_type"] != "observation"]
    facts = [m for m in stored if m["source_memory_ids"]]
    if mode == "off":
        assert sent == [] and facts == []
        return
    [request] = sent
    assert request["model"] == RETAIN_MODEL  # HEED_RETAIN_LLM_MODEL serves retain
    assert request["response_format"]["json_schema"]["name"] == "facts"
    said = f"{marker}: I started keeping bees on my roof in Lyon."
    assert _user_text(request) == f"[0] ({DAY}) {said}"  # numbered, dated units
    system = _system_text(request)
    assert (CONCISE in system, VERBOSE in system) == (mode == "concise", mode == "verbose")
    assert MISSION_SAYS not in system  # no retain_mission set
    [fact] = facts
    [turn] = [m for m in stored if not m["source_memory_ids"]]
    assert fact["text"] == f"{marker} keeps bees on a roof in Lyon."
    assert fact["source_memory_ids"] == [turn["id"]]


def test_retain_mission_is_said_to_the_extraction(
    server: LiveServer, upstream: RunningUpstream
) -> None:
    mission = "Remember what Alice grows and keeps."
    bank, marker = new_bank(server, retain_mission=mission)
    retain(server, bank, marker)
    [request] = requests_of(upstream, marker, "extraction")
    system = _system_text(request)
    assert system.endswith(f"{MISSION_SAYS} {mission}")
    assert CONCISE in system  # HEED_RETAIN_EXTRACTION=auto with an openai provider


def test_enable_observations_decides_whether_consolidation_asks(
    server: LiveServer, upstream: RunningUpstream
) -> None:
    quiet, quiet_marker = new_bank(server, enable_observations=False)
    learning, marker = new_bank(server, observations_mission="Track who keeps animals.")
    retain(server, quiet, quiet_marker)
    retain(server, learning, marker)
    assert memories(server, quiet, consolidation_state="pending") == []

    # The learning bank's consolidation asks, with the facts numbered and dated...
    [request] = wait_for(lambda: requests_of(upstream, marker, "consolidation"), seconds=30)
    assert request["model"] == RETAIN_MODEL
    assert request["response_format"]["json_schema"]["name"] == "observations"
    assert _user_text(request).splitlines() == [
        "New facts:",
        f"F0 ({DAY}): {marker} keeps bees on a roof in Lyon.",
        "Existing observations: none",
    ]
    assert _system_text(request).endswith("What to observe: Track who keeps animals.")
    [observation] = wait_for(lambda: memories(server, learning, type="observation"), seconds=30)
    [fact] = [m for m in memories(server, learning, type="world") if m["source_memory_ids"]]
    assert observation["text"] == f"{marker} is a beekeeper."
    assert observation["source_memory_ids"] == [fact["id"]]

    # ... and, given as long (its retain came first), the quiet bank's never did.
    time.sleep(0.5)
    assert requests_of(upstream, quiet_marker, "consolidation") == []
    operations = httpx.get(f"{server.url}/v1/default/banks/{quiet}/operations", timeout=30)
    assert [o["task_type"] for o in operations.json()["operations"]] == []
    assert requests_of(upstream, quiet_marker, "extraction")  # it does extract


def test_settings_changed_later_change_the_next_retain(
    server: LiveServer, upstream: RunningUpstream
) -> None:
    bank, before = new_bank(server, retain_extraction_mode="off", enable_observations=False)
    retain(server, bank, before)
    assert requests_of(upstream, before, "extraction") == []
    client = Hindsight(base_url=server.url, timeout=30)
    try:
        client.update_bank_config(
            bank,
            retain_extraction_mode="verbose",
            retain_mission="Note the hobbies.",
            enable_observations=True,
        )
    finally:
        client.close()
    after = "Zk" + uuid.uuid4().hex[:8]
    retain(server, bank, after)
    [request] = requests_of(upstream, after, "extraction")
    system = _system_text(request)
    assert VERBOSE in system and system.endswith(f"{MISSION_SAYS} Note the hobbies.")
    [consolidation] = wait_for(lambda: requests_of(upstream, after, "consolidation"), seconds=30)
    # Only what was retained since observations were switched on is consolidated.
    assert before not in _user_text(consolidation)
