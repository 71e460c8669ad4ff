"""The archive store's contract (:class:`heed.transfer.store.ArchiveStore`), on both
databases: archives in parts, readable once complete, per tenant, until they expire."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from heed.runtime import CancellationToken, OperationCancelled, RequestContext, use_context
from heed.storage import SqlDatabase
from heed.storage.transfer.archives import QUOTA_LOCK, SqlArchiveStore
from heed.transfer.store import PART_BYTES, ExportQuota, ExportQuotaFull, StoredArchive


@pytest.fixture
def store(sql_database: SqlDatabase) -> Iterator[SqlArchiveStore]:
    s = SqlArchiveStore(sql_database)
    s.migrate()
    s.migrate()  # idempotent
    yield s


def _row(archive_id: str, tenant: str = "t", ttl: float = 60.0) -> StoredArchive:
    now = time.time()
    return StoredArchive(archive_id, tenant, "export", "bank", "bank.zip", 0, "", now, now + ttl)


def test_put_archive_get_archive_and_archive_parts(store: SqlArchiveStore) -> None:
    data = bytes(range(256)) * (PART_BYTES // 256) + b"tail" * 1000
    parts = [data[i : i + PART_BYTES] for i in range(0, len(data), PART_BYTES)]
    stored = store.put_archive(_row("a1"), parts)
    assert stored.byte_size == len(data)
    assert stored.sha256 == hashlib.sha256(data).hexdigest()
    got = store.get_archive("t", "a1")
    assert got is not None and (got.byte_size, got.sha256) == (stored.byte_size, stored.sha256)
    assert b"".join(store.archive_parts("a1")) == data
    assert store.get_archive("u", "a1") is None  # another tenant's
    assert store.get_archive("t", "missing") is None
    assert store.get_archive("t", "a\x001") is None
    with pytest.raises(ValueError, match="parts hold"):
        store.put_archive(_row("a2"), [b"x" * (PART_BYTES + 1)])


def test_an_incomplete_or_expired_archive_is_not_found_and_delete_expired_removes_it(
    store: SqlArchiveStore,
) -> None:
    token = CancellationToken()

    def parts() -> Iterator[bytes]:
        yield b"first"
        token.cancel("stop")
        yield b"second"

    with use_context(RequestContext(token=token)), pytest.raises(OperationCancelled):
        store.put_archive(_row("half"), parts())
    assert store.get_archive("t", "half") is None  # incomplete: never readable
    store.put_archive(_row("old", ttl=-1.0), [b"expired"])
    store.put_archive(_row("fresh"), [b"kept"])
    assert store.get_archive("t", "old") is None
    assert store.delete_expired(time.time()) == 1
    assert list(store.archive_parts("old")) == []
    assert store.delete_archive("half") is True
    assert store.delete_archive("half") is False
    assert b"".join(store.archive_parts("fresh")) == b"kept"


def _export(archive_id: str, size: int, tenant: str = "t", ttl: float = 60.0) -> StoredArchive:
    return replace(_row(archive_id, tenant, ttl), byte_size=size, reuse_key=f"k:{archive_id}")


def test_a_tenants_exports_are_counted_found_renewed_and_bounded(store: SqlArchiveStore) -> None:
    now = time.time()
    quota = ExportQuota(max_count=2, max_bytes=100)
    first = store.put_archive(_export("e1", 10), [b"x" * 10], quota=quota)
    assert first.reuse_key == "k:e1"
    store.put_archive(_export("old", 50, ttl=-1.0), [b"y" * 50], quota=quota)  # expired
    store.put_archive(_export("u1", 10, tenant="u"), [b"z" * 10], quota=quota)  # another's
    usage = store.export_usage("t", now)
    assert (usage.count, usage.byte_size) == (1, 10)  # the expired one does not count
    assert usage.oldest_expires_at == pytest.approx(first.expires_at)
    with pytest.raises(ExportQuotaFull) as caught:  # 10 + 95 bytes > 100
        store.put_archive(_export("big", 95), [b"b" * 95], quota=quota)
    assert caught.value.usage.byte_size == 10
    assert store.get_archive("t", "big") is None
    store.put_archive(_export("e2", 20), [b"w" * 20], quota=quota)
    with pytest.raises(ExportQuotaFull):  # two stored: the count
        store.put_archive(_export("e3", 1), [b"v"], quota=quota)
    found = store.bank_exports("t", "bank", now)
    assert [a.id for a in found] == ["e2", "e1"]  # newest first, complete and unexpired
    assert store.bank_exports("t", "other", now) == []
    renewed = store.renew_archive("e1", now + 3600)
    assert renewed is not None and renewed.expires_at == pytest.approx(now + 3600)
    assert store.renew_archive("old", now + 3600) is None  # expired: not brought back


def test_concurrent_exports_cannot_pass_the_quota_together(store: SqlArchiveStore) -> None:
    """The quota is read under the tenant's lock in the transaction that records the row:
    an export being recorded (its transaction still open) holds the other back, which then
    counts it and is refused."""
    quota = ExportQuota(max_count=1, max_bytes=10**9)
    outcome: list[str] = []

    def put() -> None:
        try:
            store.put_archive(_export("second", 4), [b"part"], quota=quota)
            outcome.append("stored")
        except ExportQuotaFull:
            outcome.append("refused")

    other = threading.Thread(target=put)
    now = time.time()
    with store.db.write() as conn:
        store.db.lock(conn, QUOTA_LOCK + "t")
        conn.execute(
            "INSERT INTO transfer_archives (id, tenant, kind, bank_id, filename, byte_size,"
            " sha256, complete, created_at, expires_at) VALUES (?,?,?,?,?,?,'',0,?,?)",
            ("first", "t", "export", "bank", "bank.zip", 4, now, now + 60),
        )
        other.start()
        time.sleep(0.3)
        assert outcome == []  # waiting for the lock
    other.join(10)
    assert outcome == ["refused"]
    assert store.export_usage("t", time.time()).count == 1
