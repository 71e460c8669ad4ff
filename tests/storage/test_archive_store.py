"""The archive store's contract (:class:`heed.memory.archive_store.ArchiveStore`), on both
databases: archives in parts, readable once complete, per tenant, until they expire."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator

import pytest

from heed.memory.archive_store import PART_BYTES, StoredArchive
from heed.runtime import CancellationToken, OperationCancelled, RequestContext, use_context
from heed.storage import SqlDatabase
from heed.storage.archive_store import SqlArchiveStore


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
