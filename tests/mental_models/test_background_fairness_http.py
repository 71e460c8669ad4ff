"""Background work is fair between tenants, end to end on SQLite and PostgreSQL (issue 37,
finding 8).

The reproduction: tenant A's 70 mental models with ``refresh_after_retain`` each queue a
refresh for the reflect lane's one background slot; with one global background queue of
64 (``HEED_BACKGROUND_MAX_QUEUE``), tenant B's refresh then failed at once ("too much
background work queued"). Now background waiters queue per tenant and are served round
robin: B's refresh runs after at most one of A's, and A's excess is deferred, not failed.

A real server on a socket with two keys; the reflect provider is the scripted one (an LLM
is outside heed).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from heed.api.app import create_app
from heed.llm import ScriptedProvider
from heed.settings import Settings
from tests.pg_support import fresh_schema
from tests.support import LiveServer, live_server, wait_for

KEY_A, KEY_B = "fair-key-a-0123456789", "fair-key-b-0123456789"
A = {"Authorization": f"Bearer {KEY_A}"}
B = {"Authorization": f"Bearer {KEY_B}"}
FLOOD = 70
TERMINAL = ("completed", "failed", "cancelled", "interrupted")


@pytest.fixture(params=["sqlite", "postgresql"], scope="module")
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    def settings(url: str | None) -> Settings:
        return Settings(
            data_dir=tmp_path_factory.mktemp("fair"),
            database_url=url,
            api_keys={KEY_A: "a", KEY_B: "b"},
            llm_provider="scripted",
            reflect_concurrency=2,  # one background slot (all but one)
            background_max_queue=64,  # the default the flood used to fill
            mental_model_refresh_debounce_seconds=0.05,
            run_reaper_interval=0.2,
        )

    if request.param == "sqlite":
        with live_server(create_app(settings(None))) as srv:
            yield srv
        return
    with fresh_schema() as url, live_server(create_app(settings(url))) as srv:
        yield srv


def _bank(server: LiveServer, headers: dict[str, str]) -> str:
    bank = "fair-" + uuid.uuid4().hex[:8]
    url = f"{server.url}/v1/default/banks/{bank}"
    httpx.put(url, json={}, headers=headers, timeout=30).raise_for_status()
    items = [{"content": "Alice has two cats, Tom and Jerry."}]
    httpx.post(
        f"{url}/memories", json={"items": items}, headers=headers, timeout=30
    ).raise_for_status()
    return bank


def _model(
    server: LiveServer, headers: dict[str, str], bank: str, query: str, **fields: Any
) -> str:
    response = httpx.post(
        f"{server.url}/v1/default/banks/{bank}/mental-models",
        json={"name": query, "source_query": query, **fields},
        headers=headers,
        timeout=30,
    )
    assert response.status_code == 200, response.text
    operation: str = response.json()["operation_id"]
    return operation


def _run(server: LiveServer, headers: dict[str, str], run_id: str) -> dict[str, Any]:
    response = httpx.get(f"{server.url}/v1/runs/{run_id}", headers=headers, timeout=10)
    response.raise_for_status()
    run: dict[str, Any] = response.json()
    return run


def test_one_tenants_flood_of_refreshes_neither_fails_nor_delays_anothers(
    server: LiveServer,
) -> None:
    server.app.state.services.reflect.provider = ScriptedProvider(
        {
            "replies": [
                {"when": "hold the slot", "latency": 60, "text": "never written"},
                {"when": "flood", "text": "A flood answer."},
                {"when": "pets", "text": "Alice has two cats."},
            ]
        }
    )
    lane = server.app.state.services.lanes["reflect"]
    assert lane.background_capacity == 1
    flood_bank = _bank(server, A)
    holder = _model(server, A, flood_bank, "hold the slot?")
    wait_for(lambda: lane.stats().background_in_use == 1, 30)
    flood = [
        _model(server, A, flood_bank, f"flood {i}?", trigger={"refresh_after_retain": True})
        for i in range(FLOOD)
    ]

    def waiting() -> int:
        stats = lane.stats()
        return stats.background_queued + getattr(stats, "background_deferred", 0)

    def ended(runs: list[str]) -> list[str]:
        return [p for run in runs if (p := _run(server, A, run)["phase"]) in TERMINAL]

    wait_for(lambda: waiting() + len(ended(flood)) >= FLOOD, 30)
    # Past its queue, A's excess is deferred: none of A's refreshes failed.
    assert ended(flood) == []
    assert lane.stats().background_deferred == FLOOD - 64

    other_bank = _bank(server, B)
    other = _model(server, B, other_bank, "What pets does Alice have?")
    wait_for(lambda: waiting() == FLOOD + 1, 30)
    assert _run(server, B, other)["phase"] not in TERMINAL  # it waits, it was not refused

    httpx.post(f"{server.url}/v1/runs/{holder}/cancel", headers=A, timeout=30).raise_for_status()
    done = wait_for(lambda: (r := _run(server, B, other))["phase"] in TERMINAL and r, 60)
    assert done["phase"] == "completed", done
    # B's refresh went after at most a turn of A's, not behind A's 70.
    assert waiting() >= FLOOD - 10, waiting()

    def all_finished() -> list[dict[str, Any]] | None:
        runs = [_run(server, A, run) for run in flood]
        return runs if all(r["phase"] in TERMINAL for r in runs) else None

    runs = wait_for(all_finished, 120, interval=0.5)
    assert [r["phase"] for r in runs] == ["completed"] * FLOOD
    stats = lane.stats()
    assert (stats.background_in_use, stats.background_queued, stats.background_deferred) == (
        0,
        0,
        0,
    )
