"""``GET .../stats/memories-timeseries`` (the client's ``BanksApi.get_memories_timeseries``)
over HTTP, on SQLite and PostgreSQL: every bucket of the period, oldest first, the bank's
memories counted by fact type in the bucket of their time (stored time, or event time with
``time_field``); an unknown period is a 422 naming the known ones.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import httpx
import pytest
from hindsight_client_api.api.banks_api import BanksApi
from hindsight_client_api.api_client import ApiClient
from hindsight_client_api.configuration import Configuration
from hindsight_client_api.models.memories_timeseries_response import (
    MemoriesTimeseriesResponse,
)

from heed.api.app import create_app
from heed.settings import Settings
from tests.pg_support import fresh_schema
from tests.support import LiveServer, live_server


@pytest.fixture(params=["sqlite", "postgresql"], scope="module")
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    def settings(url: str | None) -> Settings:
        return Settings(
            data_dir=tmp_path_factory.mktemp("timeseries"),
            database_url=url,
            retain_extraction="off",
            observations="off",
        )

    if request.param == "sqlite":
        with live_server(create_app(settings(None))) as srv:
            yield srv
        return
    with fresh_schema() as url, live_server(create_app(settings(url))) as srv:
        yield srv


def _series(server: LiveServer, bank: str, **params: str) -> MemoriesTimeseriesResponse:
    async def call() -> MemoriesTimeseriesResponse:
        async with ApiClient(Configuration(host=server.url)) as api_client:
            return await BanksApi(api_client).get_memories_timeseries(bank, **params)

    return asyncio.run(call())


def _totals(series: MemoriesTimeseriesResponse) -> tuple[int, int, int]:
    buckets = series.buckets or []
    return (
        sum(b.world or 0 for b in buckets),
        sum(b.experience or 0 for b in buckets),
        sum(b.observation or 0 for b in buckets),
    )


def test_memories_are_counted_in_their_buckets(server: LiveServer) -> None:
    bank = "series-" + uuid.uuid4().hex[:8]
    httpx.put(f"{server.url}/v1/default/banks/{bank}", json={}).raise_for_status()
    before = _series(server, bank, period="1h")
    assert _totals(before) == (0, 0, 0)
    days_ago = datetime.now(UTC) - timedelta(days=3)
    items = [
        {"content": "Alice has two cats.", "fact_type": "world"},
        {"content": "Bob skis in the Alps.", "fact_type": "world"},
        {
            "content": "I went sailing to Brest.",
            "fact_type": "experience",
            "timestamp": days_ago.isoformat(),
        },
    ]
    response = httpx.post(
        f"{server.url}/v1/default/banks/{bank}/memories", json={"items": items}, timeout=30
    )
    assert response.status_code == 200, response.text
    now = datetime.now(UTC)

    hour = _series(server, bank, period="1h")
    assert (hour.bank_id, hour.period, hour.trunc, hour.time_field) == (
        bank,
        "1h",
        "minute",
        "created_at",
    )
    starts = [datetime.fromisoformat(b.time) for b in hour.buckets or []]
    assert len(starts) == 60
    assert all(b - a == timedelta(minutes=1) for a, b in pairwise(starts))
    assert starts[-1] <= now < starts[-1] + timedelta(minutes=2)
    assert _totals(hour) == (2, 1, 0)  # all stored just now, whatever their event time
    assert sum(_totals(hour)) == sum(
        (b.world or 0) + (b.experience or 0) for b in (hour.buckets or [])[-2:]
    )

    week = _series(server, bank, period="7d", time_field="mentioned_at")
    assert (week.trunc, week.time_field) == ("day", "mentioned_at")
    days = {b.time[:10]: b for b in week.buckets or []}
    assert len(days) == 7 and list(days) == sorted(days)
    assert days[days_ago.date().isoformat()].experience == 1  # by its event time
    assert _totals(week) == (2, 1, 0)

    stored = _series(server, bank, period="7d")
    assert stored.time_field == "created_at"
    stored_days = {b.time[:10]: b for b in stored.buckets or []}
    assert stored_days[days_ago.date().isoformat()].experience == 0  # stored today, not then
    assert _totals(stored) == (2, 1, 0)
    assert _series(server, bank, period="7d", time_field="nonsense").time_field == "created_at"

    bad = httpx.get(
        f"{server.url}/v1/default/banks/{bank}/stats/memories-timeseries", params={"period": "2w"}
    )
    assert bad.status_code == 422 and "'30d'" in bad.text and "2w" in bad.text, bad.text
    missing = httpx.get(f"{server.url}/v1/default/banks/no-{bank}/stats/memories-timeseries")
    assert missing.status_code == 404
