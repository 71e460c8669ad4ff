"""The archive check's memory (issue 37): ids kept as digests, found twice or missing by
sorting; a check of many long ids in bounded memory; a check past its process's limit."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from heed.api.app import create_app
from heed.settings import Settings
from heed.transfer.archive import ArchiveReader
from heed.transfer.check import check_archive
from heed.transfer.ids import IdDigests
from heed.transfer.records import InvalidArchive
from tests.memory import archive_support as arc
from tests.memory.test_transfer_http import _entities, _import
from tests.support import LiveServer, live_server


def test_digests_find_an_id_held_twice_and_one_missing() -> None:
    ids = IdDigests()
    for i in range(10_000):
        ids.add(f"memory-{i}")
    assert ids.seal() is None
    assert ids.missing([f"memory-{i}" for i in range(0, 10_000, 7)]) is None
    assert ids.missing(["memory-3", "memory-10000", "memory-4"]) == "memory-10000"
    ids.add("memory-5")
    twice = ids.seal()
    assert twice == ids.digest("memory-5")


def _peak_rss_kb() -> int:
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM")).split()[1])


def test_many_long_ids_are_checked_in_bounded_memory() -> None:
    """50,000 entities with ids of 500 and names of 1,900 characters: kept as strings (the
    old check) they cost about 130 MB; as digests, under 1 MB."""
    extra = [(f"{i:08d}-" + "i" * 490, f"{i:08d} " + "n" * 1890) for i in range(50_000)]
    extra.append(("last", extra[-1][1]))  # a duplicate name at the very end
    archive = _entities(arc.synthetic_archive(30, per_document=10), extra)
    Path("/proc/self/clear_refs").write_text("5")  # the peak resident size starts again
    before = _peak_rss_kb()
    with ArchiveReader(io.BytesIO(archive)) as reader, pytest.raises(InvalidArchive) as refused:
        check_archive(reader)
    grew_mb = (_peak_rss_kb() - before) / 1024
    assert "is in the archive twice" in str(refused.value)
    assert grew_mb < 40, f"the check grew the process by {grew_mb:.0f} MB"


@pytest.fixture
def hurried(tmp_path: Path) -> Iterator[LiveServer]:
    """A server that gives an archive's check a millisecond."""
    settings = Settings(data_dir=tmp_path, transfer_check_seconds=0.001)
    with live_server(create_app(settings)) as srv:
        yield srv


def test_a_check_past_its_limit_is_a_413_naming_the_setting(hurried: LiveServer) -> None:
    bank = "b-" + uuid.uuid4().hex[:6]
    httpx.put(f"{hurried.url}/v1/default/banks/{bank}", json={}, timeout=30).raise_for_status()
    response = _import(hurried, bank, arc.synthetic_archive(300), "new-" + uuid.uuid4().hex[:6])
    assert response.status_code == 413, response.text
    assert "HEED_TRANSFER_CHECK_SECONDS" in response.json()["detail"]
    services = hurried.app.state.services
    assert services.memory.retain_lane.stats().in_use == 0
