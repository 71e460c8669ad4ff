"""The SQL implementation of :class:`heed.sessions.store.SessionStore` (component
``sessions``), on SQLite or PostgreSQL (any :class:`~heed.storage.database.SqlDatabase`).

A message's ``idx`` is the session's next one, read and written under the session's
transcript lock, so two processes appending to one transcript never take the same idx.

NUL (see :class:`heed.errors.InvalidText`), alike on both databases: a session id
holding it names no session (``None``, nothing, ``False``), and a title or message
holding it is refused before anything is written.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Final

from heed.errors import NUL, refuse_nul
from heed.sessions.store import Message, Session, Wakeup
from heed.storage.database import Migration, SqlStore, from_row

__all__ = ["MIGRATIONS", "SqlSessionStore"]

#: Timestamps are epoch seconds (``{real}``: a double on both databases).
MIGRATIONS: Final = [
    Migration(
        "sessions",
        1,
        """
        CREATE TABLE sessions (
            id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            title TEXT NOT NULL DEFAULT '',
            bank_id TEXT,
            created_at {real} NOT NULL,
            updated_at {real} NOT NULL
        );
        CREATE INDEX sessions_tenant ON sessions (tenant, updated_at);
        CREATE TABLE session_messages (
            id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL,
            idx INTEGER NOT NULL,
            role TEXT NOT NULL,
            content TEXT NOT NULL,
            created_at {real} NOT NULL,
            run_id TEXT,
            status TEXT NOT NULL DEFAULT 'complete',
            source TEXT,
            tool_calls TEXT NOT NULL DEFAULT '[]',
            tool_call_id TEXT,
            name TEXT,
            UNIQUE (session_id, idx)
        );
        CREATE TABLE session_wakeups (
            id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL,
            task_run_id TEXT NOT NULL UNIQUE,
            summary TEXT NOT NULL,
            created_at {real} NOT NULL,
            delivered_run_id TEXT
        );
        CREATE INDEX session_wakeups_pending ON session_wakeups (session_id, delivered_run_id);
        """,
    ),
    Migration(
        "sessions",
        2,
        "ALTER TABLE sessions ADD COLUMN remember_messages INTEGER NOT NULL DEFAULT 0;",
    ),
]


def _session(row: Any) -> Session:
    return from_row(Session, row, remember_messages=bool(row["remember_messages"]))


def _message(row: Any) -> Message:
    return from_row(Message, row, tool_calls=json.loads(row["tool_calls"]))


def _wakeup(row: Any) -> Wakeup:
    return from_row(Wakeup, row, summary=json.loads(row["summary"]))


class SqlSessionStore(SqlStore):
    """Sessions, transcripts and wakeups on a :class:`~heed.storage.database.SqlDatabase`."""

    migrations = MIGRATIONS

    def create(self, session: Session) -> Session:
        refuse_nul(session.id, "the session id")
        refuse_nul(session.tenant, "the tenant")
        refuse_nul(session.title, "the session title")
        refuse_nul(session.bank_id, "bank_id")
        with self.db.write() as conn:
            conn.execute(
                "INSERT INTO sessions (id, tenant, title, bank_id, created_at, updated_at,"
                " remember_messages) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    session.id,
                    session.tenant,
                    session.title,
                    session.bank_id,
                    session.created_at,
                    session.updated_at,
                    int(session.remember_messages),
                ),
            )
        return session

    def get(self, session_id: str) -> Session | None:
        if NUL in session_id:
            return None
        with self.db.read() as conn:
            row = conn.execute("SELECT * FROM sessions WHERE id = ?", (session_id,)).fetchone()
        return None if row is None else _session(row)

    def list_sessions(self, tenant: str, limit: int = 100) -> list[Session]:
        if NUL in tenant:
            return []
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT * FROM sessions WHERE tenant = ? ORDER BY updated_at DESC LIMIT ?",
                (tenant, limit),
            ).fetchall()
        return [_session(row) for row in rows]

    def update(
        self,
        session_id: str,
        *,
        title: str | None = None,
        remember_messages: bool | None = None,
    ) -> Session | None:
        if NUL in session_id:
            return None
        refuse_nul(title, "the session title")
        changes: dict[str, object] = {"updated_at": time.time()}
        if title is not None:
            changes["title"] = title
        if remember_messages is not None:
            changes["remember_messages"] = int(remember_messages)
        assignments = ", ".join(f"{column} = ?" for column in changes)  # fixed names only
        with self.db.write() as conn:
            conn.execute(
                f"UPDATE sessions SET {assignments} WHERE id = ?", (*changes.values(), session_id)
            )
        return self.get(session_id)

    def delete(self, session_id: str) -> bool:
        if NUL in session_id:
            return False
        with self.db.write() as conn:
            gone = conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount
            conn.execute("DELETE FROM session_messages WHERE session_id = ?", (session_id,))
            conn.execute("DELETE FROM session_wakeups WHERE session_id = ?", (session_id,))
        return bool(gone)

    def append_message(self, message: Message) -> Message:
        for value, what in (
            (message.id, "the message id"),
            (message.session_id, "the session id"),
            (message.role, "the message role"),
            (message.content, "the message content"),
            (message.run_id, "the run id"),
            (message.status, "the message status"),
            (message.source, "the message source"),
            (message.tool_call_id, "tool_call_id"),
            (message.name, "the tool name"),
        ):
            refuse_nul(value, what)
        with self.db.write() as conn:
            self.db.lock(conn, f"transcript:{message.session_id}")
            row = conn.execute(
                "SELECT COALESCE(MAX(idx), -1) + 1 FROM session_messages WHERE session_id = ?",
                (message.session_id,),
            ).fetchone()
            stored = replace(message, idx=int(row[0]))
            conn.execute(
                "INSERT INTO session_messages (id, session_id, idx, role, content, created_at,"
                " run_id, status, source, tool_calls, tool_call_id, name)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    stored.id,
                    stored.session_id,
                    stored.idx,
                    stored.role,
                    stored.content,
                    stored.created_at,
                    stored.run_id,
                    stored.status,
                    stored.source,
                    json.dumps(stored.tool_calls),
                    stored.tool_call_id,
                    stored.name,
                ),
            )
            conn.execute(
                "UPDATE sessions SET updated_at = ? WHERE id = ?",
                (stored.created_at, stored.session_id),
            )
        return stored

    def messages(self, session_id: str) -> list[Message]:
        if NUL in session_id:
            return []
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT * FROM session_messages WHERE session_id = ? ORDER BY idx", (session_id,)
            ).fetchall()
        return [_message(row) for row in rows]

    def add_wakeup(self, wakeup: Wakeup) -> bool:
        with self.db.write() as conn:
            added = conn.execute(
                "INSERT INTO session_wakeups (id, session_id, task_run_id, summary, created_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (task_run_id) DO NOTHING",
                (
                    wakeup.id,
                    wakeup.session_id,
                    wakeup.task_run_id,
                    json.dumps(wakeup.summary),
                    wakeup.created_at,
                ),
            ).rowcount
        return bool(added)

    def pending_wakeups(self, session_id: str | None = None) -> list[Wakeup]:
        sql = "SELECT * FROM session_wakeups WHERE delivered_run_id IS NULL"
        args: tuple[str, ...] = ()
        if session_id is not None and NUL in session_id:
            return []
        if session_id is not None:
            sql += " AND session_id = ?"
            args = (session_id,)
        with self.db.read() as conn:
            rows = conn.execute(sql + " ORDER BY created_at, id", args).fetchall()
        return [_wakeup(row) for row in rows]

    def mark_delivered(self, wakeup_ids: Sequence[str], run_id: str) -> int:
        if not wakeup_ids:
            return 0
        marks = ", ".join("?" * len(wakeup_ids))
        with self.db.write() as conn:
            return int(
                conn.execute(
                    f"UPDATE session_wakeups SET delivered_run_id = ?"
                    f" WHERE id IN ({marks}) AND delivered_run_id IS NULL",
                    (run_id, *wakeup_ids),
                ).rowcount
            )
