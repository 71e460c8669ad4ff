"""Ended UI sessions (component ``ui_revocations``), on SQLite or PostgreSQL.

A UI session cookie is signed and verifies without state (:mod:`heed.api.auth`); logging
out writes its session id here, so every process that shares the database refuses it
from then on. A row is kept until the cookie it names would have expired anyway.
"""

from __future__ import annotations

import time
from typing import Final

from heed.storage.database import Migration, SqlStore

__all__ = ["MIGRATIONS", "SqlRevocationStore"]

MIGRATIONS: Final = [
    Migration(
        "ui_revocations",
        1,
        "CREATE TABLE ui_revocations (session_id TEXT PRIMARY KEY, expires_at {real} NOT NULL);",
    )
]


class SqlRevocationStore(SqlStore):
    """Session ids logged out of, until they expire. Calls block (primary-key statements)."""

    migrations = MIGRATIONS

    def revoke(self, session_id: str, expires_at: float) -> None:
        """Refuse *session_id* from now on; forget ids whose cookies have expired."""
        with self.db.write() as conn:
            conn.execute("DELETE FROM ui_revocations WHERE expires_at < ?", (time.time(),))
            conn.execute(
                "INSERT INTO ui_revocations (session_id, expires_at) VALUES (?, ?)"
                " ON CONFLICT (session_id) DO NOTHING",
                (session_id, expires_at),
            )

    def is_revoked(self, session_id: str) -> bool:
        with self.db.read() as conn:
            row = conn.execute(
                "SELECT 1 FROM ui_revocations WHERE session_id = ?", (session_id,)
            ).fetchone()
        return row is not None
