"""Polling a bank's operations while its background work runs, over HTTP on SQLite and
PostgreSQL: every poll answers 200, and each operation's progress has Hindsight's shape
(``stage``, ``at``, ``processed`` / ``total`` when known, ``detail`` counters).

A consolidation has no total (it takes what is pending round by round), so its progress
says ``total: null`` with its counters in ``detail``; a mental model's refresh has two
stages. The scripted LLM is slow (``latency``) so both are caught ``processing``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hindsight_client_api.models.operation_response import OperationResponse
from hindsight_client_api.models.operation_status_response import OperationStatusResponse

from heed.api.app import create_app
from heed.llm import ScriptedProvider
from heed.settings import Settings
from tests.pg_support import fresh_schema
from tests.support import LiveServer, live_server, wait_for

FACTS = [
    "Alice has two cats named Tom and Jerry.",
    "Alice works as a nurse in Lyon.",
    "Alice's cats sleep on the balcony.",
]
SLOW = 1.0  # seconds each scripted LLM call takes


@pytest.fixture(params=["sqlite", "postgresql"], scope="module")
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    def settings(url: str | None) -> Settings:
        return Settings(
            data_dir=tmp_path_factory.mktemp("operations"),
            database_url=url,
            llm_provider="scripted",
            observations="on",
            consolidation_batch=1,  # a round a fact: progress between rounds
            consolidation_debounce_seconds=0.05,
            reflect_concurrency=4,  # the consolidation and the refresh side by side
            background_capacity=3,
            run_reaper_interval=0.2,
        )

    if request.param == "sqlite":
        with live_server(create_app(settings(None))) as srv:
            yield srv
        return
    with fresh_schema() as url, live_server(create_app(settings(url))) as srv:
        yield srv


def operations(server: LiveServer, bank: str, **params: str) -> dict[str, Any]:
    response = httpx.get(
        f"{server.url}/v1/default/banks/{bank}/operations", params=params, timeout=10
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_polling_while_a_consolidation_and_a_refresh_run_answers_their_progress(
    server: LiveServer,
) -> None:
    services = server.app.state.services
    services.retain_provider.current = ScriptedProvider(
        {"replies": [{"when": "new facts:", "latency": SLOW, "json": {"actions": []}}]}
    )
    services.reflect.provider = ScriptedProvider(
        {"replies": [{"when": "pets", "latency": 3 * SLOW, "text": "Two cats."}]}
    )
    bank = "ops-" + uuid.uuid4().hex[:8]
    base = f"{server.url}/v1/default/banks/{bank}"
    httpx.put(base, json={}, timeout=30).raise_for_status()
    retained = httpx.post(
        f"{base}/memories", json={"items": [{"content": f} for f in FACTS]}, timeout=30
    )
    retained.raise_for_status()
    created = httpx.post(
        f"{base}/mental-models",
        json={"name": "pets", "source_query": "What pets does Alice have?"},
        timeout=30,
    )
    created.raise_for_status()

    seen: dict[str, dict[str, Any]] = {}  # kind -> its progress while processing
    polls = 0
    deadline = time.monotonic() + 60
    while len(seen) < 2 and time.monotonic() < deadline:
        listed = operations(server, bank, status="processing")
        polls += 1
        for op in listed["operations"]:
            OperationResponse.from_dict(op)  # the client reads it
            one = httpx.get(f"{base}/operations/{op['id']}", timeout=10)
            assert one.status_code == 200, one.text
            OperationStatusResponse.from_dict(one.json())
            if op["progress"] is not None and op["status"] == "processing":
                seen.setdefault(op["task_type"], op["progress"])
        time.sleep(0.05)
    assert set(seen) == {"consolidation", "mental_model_refresh"}, (polls, seen)

    consolidating = seen["consolidation"]
    assert consolidating["stage"] == "consolidating"
    assert consolidating["total"] is None  # a consolidation does not know its total
    assert consolidating["processed"] >= 1
    assert consolidating["detail"]["rounds"] >= 1
    assert consolidating["detail"]["facts_consolidated"] == consolidating["processed"]
    refreshing = seen["mental_model_refresh"]
    assert (refreshing["stage"], refreshing["processed"], refreshing["total"]) == (
        "reflecting",
        0,
        2,
    )

    def both_completed() -> dict[str, Any] | None:
        done = operations(server, bank, status="completed")
        kinds = {op["task_type"]: op for op in done["operations"]}
        return kinds if {"consolidation", "mental_model_refresh"} <= set(kinds) else None

    completed = wait_for(both_completed, seconds=60, interval=0.1)
    final = completed["consolidation"]["progress"]
    assert final["total"] is None and final["processed"] == len(FACTS)
    assert final["detail"]["facts_consolidated"] == len(FACTS)
    assert completed["mental_model_refresh"]["progress"]["stage"] == "done"
