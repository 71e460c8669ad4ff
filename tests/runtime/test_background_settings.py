"""The background share of the lanes from settings: HEED_BACKGROUND_CAPACITY,
HEED_BACKGROUND_MAX_DEFER_SECONDS and HEED_BACKGROUND_MAX_QUEUE, validated (a bad value is
an error naming the setting), wired into every lane by ``build_lanes``, and shown in
/metrics with what background work holds and waits for."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from heed.api.app import create_app
from heed.runtime import Lane
from heed.services import build_lanes
from heed.settings import InvalidSettings, Settings, load_settings
from tests.support import metric_value


def test_defaults_leave_one_slot_free_wait_ten_seconds_and_queue_sixty_four(
    tmp_path: Path,
) -> None:
    settings = Settings(data_dir=tmp_path, recall_concurrency=4, reflect_concurrency=1)
    assert settings.background_capacity is None
    assert settings.background_max_defer_seconds == 10.0
    assert settings.background_max_queue == 64
    lanes = build_lanes(settings)
    assert lanes["recall"].background_capacity == 3  # all but one
    assert lanes["reflect"].background_capacity == 1  # at least one
    for lane in lanes.all():
        assert lane.background_max_defer == 10.0
        assert lane.background_max_queue == 64


def test_the_environment_sets_every_lane(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEED_BACKGROUND_CAPACITY", "2")
    monkeypatch.setenv("HEED_BACKGROUND_MAX_DEFER_SECONDS", "0.5")
    monkeypatch.setenv("HEED_BACKGROUND_MAX_QUEUE", "3")
    settings = load_settings(data_dir=tmp_path, recall_concurrency=4, reflect_concurrency=1)
    assert settings.background_capacity == 2
    lanes = build_lanes(settings)
    assert lanes["recall"].background_capacity == 2
    assert lanes["reflect"].background_capacity == 1  # never more than the lane's slots
    for lane in lanes.all():
        assert lane.background_max_defer == 0.5
        assert lane.background_max_queue == 3


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("HEED_BACKGROUND_CAPACITY", "0"),
        ("HEED_BACKGROUND_CAPACITY", "-1"),
        ("HEED_BACKGROUND_CAPACITY", "all"),
        ("HEED_BACKGROUND_MAX_DEFER_SECONDS", "-1"),
        ("HEED_BACKGROUND_MAX_DEFER_SECONDS", "soon"),
        ("HEED_BACKGROUND_MAX_QUEUE", "0"),
        ("HEED_BACKGROUND_MAX_QUEUE", "1.5"),
    ],
)
def test_a_bad_value_is_an_error_naming_the_setting(
    variable: str, value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(InvalidSettings) as caught:
        load_settings(data_dir=tmp_path)
    assert variable in str(caught.value)


async def hold(lane: Lane, got: asyncio.Event, release: asyncio.Event) -> None:
    async with lane.slot(background=True):
        got.set()
        await release.wait()


async def test_the_settings_bound_background_work_in_a_built_lane(tmp_path: Path) -> None:
    """What the settings change, seen in the lane's behaviour: one background slot of
    three (a second background acquire waits while two slots are free), and a queue of
    one per tenant (the next background acquire of the same tenant is deferred, not
    refused)."""
    lanes = build_lanes(
        Settings(
            data_dir=tmp_path,
            recall_concurrency=3,
            background_capacity=1,
            background_max_queue=1,
        )
    )
    lane = lanes["recall"]
    got = [asyncio.Event(), asyncio.Event(), asyncio.Event()]
    release = asyncio.Event()
    first = asyncio.create_task(hold(lane, got[0], release))
    await asyncio.wait_for(got[0].wait(), 5)
    second = asyncio.create_task(hold(lane, got[1], release))
    third = asyncio.create_task(hold(lane, got[2], release))
    await asyncio.sleep(0.05)
    stats = lane.stats()
    assert (stats.in_use, stats.background_in_use, stats.background_queued) == (1, 1, 1)
    assert stats.background_deferred == 1 and stats.rejected_total == 0
    assert not got[1].is_set()  # two slots free, but the background share is taken
    release.set()
    await asyncio.wait_for(asyncio.gather(first, second, third), 5)
    assert got[1].is_set() and got[2].is_set()
    assert lane.stats().in_use == 0


async def test_metrics_show_the_background_share_of_each_lane(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path, recall_concurrency=4, reflect_concurrency=1, background_capacity=2
    )
    app = create_app(settings)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5000))
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
        text = (await client.get("/metrics")).text
    assert metric_value(text, "heed_lane_background_capacity", lane="recall") == 2
    assert metric_value(text, "heed_lane_background_capacity", lane="reflect") == 1  # capped
    for lane in ("recall", "reflect", "retain", "turn"):
        assert f'heed_lane_background_in_use{{lane="{lane}"}} 0.0' in text
        assert f'heed_lane_background_queued{{lane="{lane}"}} 0.0' in text
        assert f'heed_lane_background_deferred{{lane="{lane}"}} 0.0' in text
    # the consolidation kind has max_attempts: its requeue and quarantine series exist
    assert 'heed_runs_requeued_total{kind="consolidation"} 0.0' in text
    assert 'heed_runs_quarantined_total{kind="consolidation"} 0.0' in text
