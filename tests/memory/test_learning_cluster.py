"""Consolidation across two instances sharing one database: a run on instance A, mid-LLM-call,
is cancelled through instance B, is stopped by a bank delete on B (and nothing is written
into the bank afterwards), and a bank consolidates once at a time whichever instance is
asked.

The instances are two real ``heed serve`` processes on loopback ports: on PostgreSQL (a
fresh schema) with Redis carrying the signals, each with its own data dir; and on one SQLite
data dir shared by both, without Redis (a cancel written by B reaches A's worker at A's next
lease renewal). The scripted provider answers the consolidation call after a latency chosen
by a marker word in the retained text (extraction is off: the verbatim units are what is
consolidated), and every consolidation is started with ``POST .../consolidate`` (the debounce
after a retain is longer than the tests), so its worker is on the instance that was asked.
What a process holds is read over HTTP: its lanes in ``/metrics``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, closing
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg
import pytest

from heed.memory.engine import BANK_CACHE_SECONDS
from tests.pg_support import fresh_schema
from tests.runs.http_support import server_process
from tests.support import free_port, metric_value, wait_for

pytestmark = pytest.mark.slow

REDIS_URL = os.environ.get("HEED_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

#: Marker words: the consolidation prompt holds the facts' text, so the scripted reply a
#: consolidation gets (and its latency) is chosen by the marker its bank's memories carry.
SLOW, BRIEF = "zqslowmarker", "zqbriefmarker"
SLOW_SECONDS = 30.0  # far longer than any bound below: a run that stops was stopped
BRIEF_SECONDS = 6.0  # short enough to wait past cheaply
OBSERVATION = "Caroline owns a beagle called Rex."
SCRIPT = {
    "replies": [
        {
            "when": marker,
            "latency": latency,
            "json": {"actions": [{"action": "create", "text": OBSERVATION, "facts": [0, 1]}]},
        }
        for marker, latency in ((SLOW, SLOW_SECONDS), (BRIEF, BRIEF_SECONDS))
    ]
}
FACTS = [
    "Caroline adopted a beagle puppy named Rex last week.",
    "Rex loves the park near Caroline's flat in Lyon.",
]


@dataclass(frozen=True)
class Cluster:
    """Two instances on one database: their base URLs, and how to read the database."""

    a: str
    b: str
    database: str  # "sqlite" or "postgresql"
    location: str  # the SQLite file, or the PostgreSQL URL (with its schema)

    def rows(self, bank_ref: str) -> dict[str, int]:
        """How many rows the database holds for the bank *bank_ref*, per table."""
        tables = {"memory_banks": "ref", "memory_units": "bank_ref", "memory_documents": "bank_ref"}
        counts: dict[str, int] = {}
        if self.database == "sqlite":
            with closing(sqlite3.connect(self.location, timeout=30)) as conn:
                for table, column in tables.items():
                    sql = f"SELECT COUNT(*) FROM {table} WHERE {column} = ?"
                    counts[table] = int(conn.execute(sql, (bank_ref,)).fetchone()[0])
            return counts
        with psycopg.connect(self.location, autocommit=True, connect_timeout=10) as conn:
            for table, column in tables.items():
                row = conn.execute(
                    f"SELECT COUNT(*) FROM {table} WHERE {column} = %s", (bank_ref,)
                ).fetchone()
                assert row is not None
                counts[table] = int(row[0])
        return counts


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("learning-cluster")
    env = {
        "HEED_LLM_SCRIPT": json.dumps(SCRIPT),
        "HEED_RETAIN_EXTRACTION": "off",
        "HEED_OBSERVATIONS": "on",
        "HEED_CONSOLIDATION_DEBOUNCE_SECONDS": "600",
    }
    with ExitStack() as stack:
        if request.param == "sqlite":
            data_dirs = [root / "data", root / "data"]  # one SQLite file, two processes
            location = str(root / "data" / "heed.db")
        else:
            location = stack.enter_context(fresh_schema())
            env |= {
                "HEED_DATABASE_URL": location,
                "HEED_REDIS_URL": REDIS_URL,
                "HEED_REDIS_PREFIX": f"heed-test-{uuid.uuid4().hex[:8]}:",
            }
            data_dirs = [root / "data-a", root / "data-b"]
        ports = [free_port(), free_port()]
        for data_dir, port in zip(data_dirs, ports, strict=True):
            stack.enter_context(server_process(data_dir, port, **env))
        a, b = (f"http://127.0.0.1:{port}" for port in ports)
        yield Cluster(a=a, b=b, database=request.param, location=location)


# -- over HTTP ---------------------------------------------------------------------------


def banks(url: str, bank: str) -> str:
    return f"{url}/v1/default/banks/{bank}"


def memories(url: str, bank: str, **params: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{banks(url, bank)}/memories/list", params=params, timeout=30)
    response.raise_for_status()
    items: list[dict[str, Any]] = response.json()["items"]
    return items


def recall(url: str, bank: str, query: str) -> list[dict[str, Any]]:
    response = httpx.post(
        f"{banks(url, bank)}/memories/recall",
        json={"query": query, "types": ["world", "experience", "observation"]},
        timeout=30,
    )
    response.raise_for_status()
    results: list[dict[str, Any]] = response.json()["results"]
    return results


def consolidations(url: str, bank: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{banks(url, bank)}/operations", timeout=30)
    response.raise_for_status()
    ops = response.json()["operations"]
    return [o for o in ops if o["operation_type"] == "consolidation"]


def run_of(url: str, run_id: str) -> dict[str, Any]:
    response = httpx.get(f"{url}/v1/runs/{run_id}", timeout=30)
    response.raise_for_status()
    run: dict[str, Any] = response.json()
    return run


def reflect_slots(url: str) -> float:
    """Slots the instance's reflect lane holds (consolidation's LLM calls take them)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return metric_value(text, "heed_lane_in_use", lane="reflect")


def new_bank(cluster: Cluster, marker: str) -> str:
    """A bank created and filled through A, its memories carrying *marker*."""
    bank = "learn-" + uuid.uuid4().hex[:8]
    httpx.put(banks(cluster.a, bank), json={}, timeout=30).raise_for_status()
    items = [{"content": f"{fact} ({marker})"} for fact in FACTS]
    response = httpx.post(f"{banks(cluster.a, bank)}/memories", json={"items": items}, timeout=60)
    assert response.status_code == 200, response.text
    assert len(memories(cluster.b, bank, consolidation_state="pending")) == len(FACTS)
    return bank


def consolidating_on_a(cluster: Cluster, marker: str) -> tuple[str, str]:
    """A new bank whose consolidation runs on A, mid-LLM-call: ``(bank, run_id)``."""
    assert reflect_slots(cluster.a) == 0 and reflect_slots(cluster.b) == 0
    bank = new_bank(cluster, marker)
    response = httpx.post(f"{banks(cluster.a, bank)}/consolidate", timeout=30)
    assert response.status_code == 200, response.text
    started = response.json()
    assert started["deduplicated"] is False and started["operation_id"]
    wait_for(lambda: reflect_slots(cluster.a) >= 1, seconds=30)  # A waits for the model
    assert reflect_slots(cluster.b) == 0  # and B runs nothing: what B does crosses over
    [op] = consolidations(cluster.b, bank)
    assert op["id"] == started["operation_id"] and op["status"] == "processing"
    return bank, started["operation_id"]


def cleanup(cluster: Cluster, bank: str) -> None:
    httpx.delete(banks(cluster.b, bank), timeout=60)


# -- tests -------------------------------------------------------------------------------


@pytest.mark.parametrize("route", ["runs", "operations"])
def test_a_consolidation_on_a_is_cancelled_through_b_mid_call(cluster: Cluster, route: str) -> None:
    bank, run_id = consolidating_on_a(cluster, SLOW)
    try:
        sent = time.monotonic()
        if route == "runs":
            response = httpx.post(f"{cluster.b}/v1/runs/{run_id}/cancel", timeout=30)
        else:
            response = httpx.delete(f"{banks(cluster.b, bank)}/operations/{run_id}", timeout=30)
        assert response.status_code == 200, response.text

        # cancelled (written when A's worker stopped), in seconds, not the model's 30
        wait_for(lambda: run_of(cluster.b, run_id)["phase"] == "cancelled", seconds=15)
        took = time.monotonic() - sent
        assert took < 5, took
        # The worker stopped, so its slot is free on A: freed when the work stopped.
        assert reflect_slots(cluster.a) == 0
        run = run_of(cluster.a, run_id)
        assert run["cancel_reason"] == "cancelled by client"
        [op] = consolidations(cluster.a, bank)
        assert op["status"] == "cancelled"

        # Nothing was written; the facts wait, pending, for the next consolidation.
        for url in (cluster.a, cluster.b):
            assert memories(url, bank, type="observation") == []
            assert len(memories(url, bank, consolidation_state="pending")) == len(FACTS)
    finally:
        cleanup(cluster, bank)


@pytest.mark.parametrize("recreated_on", ["a", "b"])
def test_deleting_the_bank_on_b_stops_a_s_consolidation_and_the_recreated_bank_stays_empty(
    cluster: Cluster, recreated_on: str
) -> None:
    bank, run_id = consolidating_on_a(cluster, BRIEF)
    answered_by = time.monotonic() + BRIEF_SECONDS  # the model would have answered by then
    old_ref = run_of(cluster.a, run_id)["session_id"].removeprefix("bank:")
    assert cluster.rows(old_ref)["memory_units"] == len(FACTS)

    sent = time.monotonic()
    deleted = httpx.delete(banks(cluster.b, bank), timeout=60)
    took = time.monotonic() - sent
    assert deleted.status_code == 200, deleted.text
    # The delete waited until A's worker stopped, and that was at once: a delete that had
    # not reached the remote run would have waited for the model's answer.
    assert took < BRIEF_SECONDS / 2, took
    run = run_of(cluster.b, run_id)
    assert run["phase"] == "cancelled" and run["cancel_reason"] == "bank deleted"
    assert reflect_slots(cluster.a) == 0

    # Recreated at once, with the same id: empty.
    via = cluster.a if recreated_on == "a" else cluster.b
    created = httpx.put(banks(via, bank), json={}, timeout=30)
    assert created.status_code in (200, 201), created.text

    def empty(*urls: str) -> None:
        for url in urls:
            assert memories(url, bank) == []
            assert memories(url, bank, type="observation") == []
            assert recall(url, bank, "Caroline's beagle Rex") == []
            assert consolidations(url, bank) == []  # the old run was the old bank's
        assert cluster.rows(old_ref) == dict.fromkeys(cluster.rows(old_ref), 0)

    # Seen at once by the instance that recreated it and by the one that deleted it (A,
    # when B recreated it, may answer from the bank it looked up for up to a second).
    empty(*{via, cluster.b})
    # ... and nothing arrives after the model would have answered, seen by both.
    time.sleep(max(0.0, answered_by - time.monotonic(), BANK_CACHE_SECONDS) + 1.5)
    empty(cluster.a, cluster.b)
    assert run_of(cluster.a, run_id)["phase"] == "cancelled"
    assert reflect_slots(cluster.a) == 0 and reflect_slots(cluster.b) == 0
    httpx.delete(banks(via, bank), timeout=60).raise_for_status()


def test_a_bank_recreated_through_b_is_retained_into_and_listed_through_a_at_once(
    cluster: Cluster,
) -> None:
    """B deletes a bank and creates it again while A still holds the old bank's row (A
    looked it up less than ``BANK_CACHE_SECONDS`` ago): a retain through A at once succeeds,
    into the new bank, and a list through A at once shows the new bank's memories, not
    nothing. Each part is tried again (at most three times) until it ran inside A's cache
    window, so the test shows the stale row was met, not waited out."""

    def retain(url: str, bank: str, text: str) -> httpx.Response:
        items = [{"content": text}]
        return httpx.post(f"{banks(url, bank)}/memories", json={"items": items}, timeout=60)

    def texts(url: str, bank: str) -> list[str]:
        return sorted(m["text"] for m in memories(url, bank))

    def recreate_on_b(bank: str) -> None:
        httpx.delete(banks(cluster.b, bank), timeout=60).raise_for_status()
        httpx.put(banks(cluster.b, bank), json={}, timeout=30).raise_for_status()

    bank = "recreated-" + uuid.uuid4().hex[:8]
    try:
        written_within = listed_within = False
        for _ in range(3):
            httpx.put(banks(cluster.a, bank), json={}, timeout=30).raise_for_status()
            looked = time.monotonic()
            assert retain(cluster.a, bank, "Old bank: Dora keeps bees.").status_code == 200
            assert texts(cluster.a, bank) == ["Old bank: Dora keeps bees."]  # A holds the row
            recreate_on_b(bank)
            response = retain(cluster.a, bank, "New bank: Ottoline keeps tabby cats.")
            written_within = time.monotonic() - looked < BANK_CACHE_SECONDS
            assert response.status_code == 200, response.text
            assert response.json()["items_count"] == 1
            for url in (cluster.b, cluster.a):  # in the new bank, the old one's gone
                assert texts(url, bank) == ["New bank: Ottoline keeps tabby cats."]

            looked = time.monotonic()  # A read the new bank again for that retain
            recreate_on_b(bank)
            assert retain(cluster.b, bank, "Newer bank: Bruno runs.").status_code == 200
            listed = texts(cluster.a, bank)
            listed_within = time.monotonic() - looked < BANK_CACHE_SECONDS
            assert listed == ["Newer bank: Bruno runs."]
            if written_within and listed_within:
                break
            httpx.delete(banks(cluster.b, bank), timeout=60).raise_for_status()
        assert written_within and listed_within, "never inside A's bank cache window"
    finally:
        cleanup(cluster, bank)


async def test_a_bank_consolidates_once_at_a_time_whichever_instance_is_asked(
    cluster: Cluster,
) -> None:
    bank = new_bank(cluster, SLOW)
    try:
        async with httpx.AsyncClient(timeout=30) as http:

            async def consolidate_on_both(n: int) -> list[dict[str, Any]]:
                urls = [(cluster.a, cluster.b)[i % 2] for i in range(n)]
                responses = await asyncio.gather(
                    *(http.post(f"{banks(url, bank)}/consolidate") for url in urls)
                )
                assert [r.status_code for r in responses] == [200] * n, responses
                return [r.json() for r in responses]

            first = await consolidate_on_both(16)
            [run_id] = {r["operation_id"] for r in first}  # every answer names one run
            assert run_id
            assert [r["deduplicated"] for r in first].count(False) == 1, first

            # One worker, on one instance, in one model call.
            wait_for(lambda: reflect_slots(cluster.a) + reflect_slots(cluster.b) >= 1)
            time.sleep(0.5)  # a second worker would be in its call by now too
            assert reflect_slots(cluster.a) + reflect_slots(cluster.b) == 1
            for url in (cluster.a, cluster.b):
                [op] = consolidations(url, bank)
                assert op["id"] == run_id and op["status"] == "processing"

            # Asked again while it runs: the busy run, from either instance.
            again = await consolidate_on_both(4)
            assert {(r["operation_id"], r["deduplicated"]) for r in again} == {(run_id, True)}

        cancelled = httpx.post(f"{cluster.a}/v1/runs/{run_id}/cancel?wait=true", timeout=30)
        assert cancelled.json()["phase"] == "cancelled"
        assert reflect_slots(cluster.a) == 0 and reflect_slots(cluster.b) == 0
        # Once it stopped, the bank may consolidate again (and does not answer the old run).
        response = httpx.post(f"{banks(cluster.b, bank)}/consolidate", timeout=30)
        assert response.json()["deduplicated"] is False
        assert response.json()["operation_id"] != run_id
    finally:
        cleanup(cluster, bank)
