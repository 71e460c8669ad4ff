"""Ended UI sessions (issue 28 row 20) on both databases: a logout is seen by every process
that shares the database, and rows go once their cookies would have expired."""

from __future__ import annotations

import time

from heed.storage import SqlDatabase
from heed.storage.revocation_store import SqlRevocationStore


def test_a_revoked_session_is_refused_and_others_are_not(sql_database: SqlDatabase) -> None:
    store = SqlRevocationStore(sql_database)
    store.migrate()
    store.migrate()  # idempotent: every process migrates at start
    assert not store.is_revoked("s1")
    store.revoke("s1", time.time() + 3600)
    store.revoke("s1", time.time() + 3600)  # a second logout of the same session
    assert store.is_revoked("s1")
    assert not store.is_revoked("s2")
    # another store over the same database (another process) sees it
    assert SqlRevocationStore(sql_database).is_revoked("s1")


def test_expired_revocations_are_forgotten(sql_database: SqlDatabase) -> None:
    store = SqlRevocationStore(sql_database)
    store.migrate()
    store.revoke("old", time.time() - 1)  # its cookie has expired: nothing to refuse
    store.revoke("new", time.time() + 3600)  # each logout clears what has expired
    assert not store.is_revoked("old")
    assert store.is_revoked("new")
