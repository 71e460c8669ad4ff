"""The SQL implementation of :class:`heed.runs.store.RunStore` (component ``runs``), on
SQLite or PostgreSQL (any :class:`~heed.storage.database.SqlDatabase`).

Tables: ``runs`` (the registry, one row per run) and ``run_events`` (the
journal, primary key ``(run_id, seq)``). Every phase write is a guarded
``UPDATE ... WHERE id = ? AND phase IN (...)``; journal appends bump
``runs.last_seq`` and insert the events in one transaction, so seqs are
gap-free and an event is durable before anyone is told about it. Admission and
claim hold the session's lock (:meth:`~heed.storage.database.SqlDatabase.lock`) for
their transaction: on SQLite ``BEGIN IMMEDIATE`` already excludes every other
writer, including other processes on the same file; on PostgreSQL it is an advisory
lock, so two instances admitting a turn for one session at the same moment are
serialised and the second sees the first's run. (A partial unique index could not
say "busy": a run that is cancelling stays busy for its unwind window.) A journal
append row-locks its run (``FOR UPDATE`` where rows lock) before reading ``last_seq``.

A run's payload (its input, up to the body limit) lives in ``run_payloads``, written in
the transaction that inserts the run and read only by :meth:`SqlRunStore.payload`: no
other query touches that table, so listing, reaping or admitting runs never reads a
payload, however large (on SQLite a large value in the row itself would be read by any
query needing a column stored after it). The row keeps the kind's small ``summary``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Final

from heed.errors import NUL, replace_nul
from heed.runs.events import EventType
from heed.runs.model import (
    TERMINAL_EVENT_TYPES,
    TERMINAL_PHASES,
    Phase,
    Run,
    RunEvent,
    allowed_sources,
    summary_json,
)
from heed.runs.state import is_queued
from heed.runs.store import BlockingCheck, ClaimCheck, Transition
from heed.storage.database import Migration, SqlStore, from_row

__all__ = ["MIGRATIONS", "SqlRunStore"]

_TERMINAL_SQL: Final = ", ".join(f"'{p.value}'" for p in sorted(TERMINAL_PHASES))


def _payload_fields(*keys: str) -> dict[str, str]:
    """Per dialect, a JSON object text of the payload's *keys* (for migration 2)."""
    return {
        "sqlite": "json_object("
        + ", ".join(f"'{k}', json_extract(payload, '$.{k}')" for k in keys)
        + ")",
        "postgresql": "jsonb_build_object("
        + ", ".join(f"'{k}', payload::jsonb -> '{k}'" for k in keys)
        + ")::text",
    }


_RETAIN_SUMMARY: Final = _payload_fields(
    "items_count", "client_operation_id", "idempotency_key", "fingerprint"
)
_TASK_SUMMARY: Final = _payload_fields("title", "action")

#: Timestamps are epoch seconds (``{real}``: a double on both databases).
MIGRATIONS: Final = [
    Migration(
        "runs",
        1,
        """
        CREATE TABLE runs (
            id TEXT PRIMARY KEY,
            kind TEXT NOT NULL,
            tenant TEXT NOT NULL,
            session_id TEXT,
            phase TEXT NOT NULL,
            source TEXT NOT NULL DEFAULT 'api',
            created_at {real} NOT NULL,
            started_at {real},
            cancelled_at {real},
            finished_at {real},
            cancel_reason TEXT,
            error TEXT,
            worker_id TEXT,
            lease_expires_at {real},
            payload TEXT NOT NULL DEFAULT '{}',
            result TEXT,
            last_seq INTEGER NOT NULL DEFAULT 0,
            first_seq INTEGER NOT NULL DEFAULT 1,
            journal_closed INTEGER NOT NULL DEFAULT 0
        );
        CREATE INDEX runs_session ON runs (session_id, created_at);
        {phase_index};
        CREATE INDEX runs_tenant ON runs (tenant, created_at);
        CREATE TABLE run_events (
            run_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            type TEXT NOT NULL,
            data TEXT NOT NULL,
            ts {real} NOT NULL,
            PRIMARY KEY (run_id, seq)
        );
        """,
        words={
            "sqlite": {"phase_index": "CREATE INDEX runs_phase ON runs (phase)"},
            # Only the runs not yet ended, which are all the reaper and admission look at.
            "postgresql": {
                "phase_index": "CREATE INDEX runs_active ON runs (phase)"
                f" WHERE phase NOT IN ({_TERMINAL_SQL})"
            },
        },
    ),
    # Payloads move out of the registry row (see the module docstring). The summaries of
    # runs that may still be looked up by key (retain operations) or that still report
    # (tasks' wakeups) are derived from their payloads, as their kinds now write them.
    Migration(
        "runs",
        2,
        """
        CREATE TABLE run_payloads (
            run_id TEXT PRIMARY KEY,
            payload TEXT NOT NULL
        );
        INSERT INTO run_payloads (run_id, payload) SELECT id, payload FROM runs;
        ALTER TABLE runs ADD COLUMN summary TEXT NOT NULL DEFAULT '{}';
        UPDATE runs SET summary = {retain_summary} WHERE kind = 'retain';
        UPDATE runs SET summary = {task_summary} WHERE kind = 'task';
        ALTER TABLE runs DROP COLUMN payload;
        """,
        words={
            dialect: {
                "retain_summary": _RETAIN_SUMMARY[dialect],
                "task_summary": _TASK_SUMMARY[dialect],
            }
            for dialect in _RETAIN_SUMMARY
        },
    ),
    # How many times a worker died while running the run (requeues, then the quarantine:
    # heed.runs.state.ending_for_lost_worker). Every existing run counts none.
    Migration("runs", 3, "ALTER TABLE runs ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;"),
]

_COLUMNS: Final = (
    "id, kind, tenant, session_id, phase, source, created_at, started_at, cancelled_at,"
    " finished_at, cancel_reason, error, worker_id, lease_expires_at, summary, result,"
    " last_seq, first_seq, journal_closed, attempts"
)
#: The row without its result (``NULL``): for reads that never look at it.
_WITHOUT_RESULT: Final = _COLUMNS.replace(" result,", " NULL AS result,")
_SUMMARY_KEY: Final = re.compile(r"[a-z_][a-z0-9_]{0,63}")
_SETTABLE: Final = frozenset(
    {
        "started_at",
        "cancelled_at",
        "finished_at",
        "cancel_reason",
        "error",
        "worker_id",
        "lease_expires_at",
        "result",
        "attempts",
    }
)


def _equal_to(**columns: str | None) -> tuple[list[str], list[Any]]:
    """SQL conditions that each of *columns* given (not ``None``) equals its value, and
    their arguments."""
    given = {column: value for column, value in columns.items() if value is not None}
    return [f"{column} = ?" for column in given], list(given.values())


def _row_to_run(row: Any) -> Run:
    return from_row(
        Run,
        row,
        summary=json.loads(row["summary"] or "{}"),
        result=None if row["result"] is None else json.loads(row["result"]),
        journal_closed=bool(row["journal_closed"]),
        attempts=int(row["attempts"] or 0),
    )


def _row_to_event(row: Any) -> RunEvent:
    run_id, seq, type_, data, ts = row
    return RunEvent(run_id, seq, type_, ts=ts, data_json=data)


class SqlRunStore(SqlStore):
    """The run registry and journal on a :class:`~heed.storage.database.SqlDatabase`."""

    migrations = MIGRATIONS

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        with self.db.write() as conn:
            yield conn

    # -- registry ------------------------------------------------------------------

    def create(self, run: Run, payload: Mapping[str, Any] | None = None) -> Run:
        with self.db.write() as conn:
            self._insert(conn, run, payload)
        return run

    @staticmethod
    def _insert(conn: Any, run: Run, payload: Mapping[str, Any] | None) -> None:
        conn.execute(
            "INSERT INTO run_payloads (run_id, payload) VALUES (?, ?)",
            (run.id, json.dumps(dict(payload or {}))),
        )
        conn.execute(
            f"INSERT INTO runs ({_COLUMNS}) VALUES ({', '.join('?' * 20)})",
            (
                run.id,
                run.kind,
                run.tenant,
                run.session_id,
                run.phase,
                str(run.source),
                run.created_at,
                run.started_at,
                run.cancelled_at,
                run.finished_at,
                run.cancel_reason,
                run.error,
                run.worker_id,
                run.lease_expires_at,
                summary_json(run.summary),
                None if run.result is None else json.dumps(run.result),
                run.last_seq,
                run.first_seq,
                int(run.journal_closed),
                run.attempts,
            ),
        )

    def delete_terminal(self, run_id: str) -> bool:
        with self.db.write() as conn:
            deleted = conn.execute(
                f"DELETE FROM runs WHERE id = ? AND phase IN ({_TERMINAL_SQL})", (run_id,)
            ).rowcount
            if deleted:
                conn.execute("DELETE FROM run_events WHERE run_id = ?", (run_id,))
                conn.execute("DELETE FROM run_payloads WHERE run_id = ?", (run_id,))
        return bool(deleted)

    def payload(self, run_id: str) -> dict[str, Any] | None:
        with self.db.read() as conn:
            row = conn.execute(
                "SELECT payload FROM run_payloads WHERE run_id = ?", (run_id,)
            ).fetchone()
        if row is None:
            return None
        value = json.loads(row[0] or "{}")
        return value if isinstance(value, dict) else {}

    def get(self, run_id: str) -> Run | None:
        if NUL in run_id:
            return None  # no run id holds NUL (heed.errors.InvalidText): the same on both
        with self.db.read() as conn:
            return self._get(conn, run_id)

    @staticmethod
    def _get(conn: Any, run_id: str) -> Run | None:
        row = conn.execute(f"SELECT {_COLUMNS} FROM runs WHERE id = ?", (run_id,)).fetchone()
        return None if row is None else _row_to_run(row)

    def list_runs(
        self,
        *,
        tenant: str | None = None,
        session_id: str | None = None,
        kind: str | None = None,
        phases: Iterable[str] | None = None,
        non_terminal: bool = False,
        summary_equals: Mapping[str, str] | None = None,
        newest_first: bool = False,
        offset: int = 0,
        limit: int = 1000,
        with_result: bool = True,
    ) -> list[Run]:
        if session_id is not None and NUL in session_id:
            return []
        if any(NUL in value for value in (summary_equals or {}).values()):
            return []  # a key a client sent (an operation id): nothing holds NUL
        where, args = _equal_to(tenant=tenant, session_id=session_id, kind=kind)
        if phases is not None:
            phase_list = [str(p) for p in phases]
            if not phase_list:
                return []
            where.append(f"phase IN ({', '.join('?' * len(phase_list))})")
            args.extend(phase_list)
        if non_terminal:
            where.append(f"phase NOT IN ({_TERMINAL_SQL})")
        for key, value in (summary_equals or {}).items():
            where.append(f"{self._summary_field(key)} = ?")
            args.append(value)
        sql = f"SELECT {_COLUMNS if with_result else _WITHOUT_RESULT} FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at DESC, id DESC" if newest_first else " ORDER BY created_at, id"
        sql += " LIMIT ? OFFSET ?"
        args.extend((limit, max(0, offset)))
        with self.db.read() as conn:
            return [_row_to_run(row) for row in conn.execute(sql, args)]

    def _summary_field(self, key: str) -> str:
        """SQL for the string value of the summary's *key* (a fixed identifier)."""
        if not _SUMMARY_KEY.fullmatch(key):
            raise ValueError(f"not a summary key: {key!r}")
        return self.db.json_text("summary", key)

    @staticmethod
    def _open_siblings(conn: Any, session_id: str, kinds: Iterable[str]) -> list[Run]:
        """The session's runs of *kinds* whose phase is not terminal (including unknown or
        blank phases), oldest first, at most 1000."""
        kind_list = list(kinds)
        rows = conn.execute(
            f"SELECT {_COLUMNS} FROM runs WHERE session_id = ?"
            f" AND kind IN ({', '.join('?' * len(kind_list))})"
            f" AND phase NOT IN ({_TERMINAL_SQL}) ORDER BY created_at, id LIMIT 1000",
            (session_id, *kind_list),
        )
        return [_row_to_run(row) for row in rows]

    def runs_in_phases(
        self, phases: Iterable[str], *, after_id: str = "", limit: int = 500
    ) -> list[Run]:
        phase_list = [str(p) for p in phases]
        if not phase_list:
            return []
        with self.db.read() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM runs WHERE phase IN ({', '.join('?' * len(phase_list))})"
                " AND id > ? ORDER BY id LIMIT ?",
                (*phase_list, after_id, limit),
            ).fetchall()
        return [_row_to_run(row) for row in rows]

    def count_runs(
        self, *, tenant: str | None = None, session_id: str | None = None, kind: str | None = None
    ) -> dict[str, int]:
        where, args = _equal_to(tenant=tenant, session_id=session_id, kind=kind)
        sql = "SELECT phase, COUNT(*) FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        with self.db.read() as conn:
            rows = conn.execute(sql + " GROUP BY phase", args).fetchall()
        return {str(row[0]): int(row[1]) for row in rows}

    def transition(
        self,
        run_id: str,
        to: Phase,
        *,
        fields: Mapping[str, Any] | None = None,
        event: tuple[str, Mapping[str, Any]] | None = None,
        only_from: Iterable[Phase] | None = None,
        worker_id: str | None = None,
    ) -> Transition | None:
        sources = allowed_sources(to)
        if only_from is not None:
            sources = sources & frozenset(only_from)
        if not sources:
            return None
        fields = dict(fields or {})
        for name in ("error", "cancel_reason"):
            # Descriptions the server writes (an exception's text, a reason): a run's ending
            # must be recorded whatever they hold, so NUL, which no store keeps, becomes U+FFFD.
            value = fields.get(name)
            if isinstance(value, str):
                fields[name] = replace_nul(value)
        unknown = set(fields) - _SETTABLE
        if unknown:
            raise ValueError(f"transition cannot set {sorted(unknown)}")
        if "result" in fields and fields["result"] is not None:
            fields["result"] = json.dumps(fields["result"])
        assignments = ["phase = ?", *(f"{name} = ?" for name in fields)]
        args: list[Any] = [str(to), *fields.values(), run_id, *(str(p) for p in sorted(sources))]
        sql = (
            f"UPDATE runs SET {', '.join(assignments)} WHERE id = ?"
            f" AND phase IN ({', '.join('?' * len(sources))})"
        )
        if worker_id is not None:
            sql += " AND worker_id = ?"
            args.append(worker_id)
        with self.db.write() as conn:
            if conn.execute(sql, args).rowcount != 1:
                return None
            appended = self._append(conn, run_id, [event]) if event is not None else []
            run = self._get(conn, run_id)
        assert run is not None
        return Transition(run, appended[0] if appended else None)

    def admit(
        self,
        run: Run,
        blocking: BlockingCheck,
        *,
        scope_kinds: Iterable[str],
        payload: Mapping[str, Any] | None = None,
    ) -> tuple[Run | None, Run | None]:
        with self.db.write() as conn:
            if run.session_id is not None:
                self.db.lock(conn, f"session:{run.session_id}")
            siblings = (
                self._open_siblings(conn, run.session_id, scope_kinds)
                if run.session_id is not None
                else []
            )
            blocker = blocking(siblings)
            if blocker is not None:
                return None, blocker
            # Stamped under the lock, after every sibling: within a session, created_at
            # order is admission order, whichever process or clock admitted each run.
            newest = max((s.created_at for s in siblings), default=0.0)
            run = dataclasses.replace(run, created_at=max(time.time(), newest + 1e-6))
            self._insert(conn, run, payload)
        return run, None

    def claim(
        self,
        run_id: str,
        *,
        worker_id: str,
        lease_seconds: float,
        may_start: ClaimCheck,
        scope_kinds: Iterable[str],
    ) -> tuple[Run, RunEvent] | None:
        with self.db.write() as conn:
            run = self._get(conn, run_id)
            if run is None or not is_queued(run):
                return None
            if run.session_id is not None:
                self.db.lock(conn, f"session:{run.session_id}")
                run = self._get(conn, run_id)  # as it is now that we hold the lock
                if run is None or not is_queued(run):
                    return None
            siblings = (
                [
                    r
                    for r in self._open_siblings(conn, run.session_id, scope_kinds)
                    if r.id != run.id
                ]
                if run.session_id is not None
                else []
            )
            if not may_start(run, siblings):
                return None
            now = time.time()
            updated = conn.execute(
                "UPDATE runs SET phase = ?, started_at = ?, worker_id = ?, lease_expires_at = ?"
                " WHERE id = ? AND phase = ?",
                (
                    str(Phase.RUNNING),
                    now,
                    worker_id,
                    now + lease_seconds,
                    run_id,
                    str(Phase.QUEUED),
                ),
            ).rowcount
            if updated != 1:
                return None
            events = self._append(conn, run_id, [(EventType.STARTED, {"worker_id": worker_id})])
            claimed = self._get(conn, run_id)
        assert claimed is not None and events
        return claimed, events[0]

    def renew_leases(self, worker_id: str, run_ids: Sequence[str], until: float) -> list[Run]:
        if not run_ids:
            return []
        marks = ", ".join("?" * len(run_ids))
        with self.db.write() as conn:
            conn.execute(
                f"UPDATE runs SET lease_expires_at = ? WHERE worker_id = ? AND id IN ({marks})"
                f" AND phase NOT IN ({_TERMINAL_SQL})",
                (until, worker_id, *run_ids),
            )
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM runs WHERE id IN ({marks})", tuple(run_ids)
            ).fetchall()
        return [_row_to_run(row) for row in rows]

    def cancel_requests(self, run_ids: Sequence[str]) -> dict[str, str]:
        if not run_ids:
            return {}
        marks = ", ".join("?" * len(run_ids))
        with self.db.read() as conn:
            rows = conn.execute(
                f"SELECT id, cancel_reason FROM runs WHERE phase = ? AND id IN ({marks})",
                (Phase.CANCELLING, *run_ids),
            ).fetchall()
        return {row["id"]: row["cancel_reason"] or "cancelled" for row in rows}

    # -- journal -------------------------------------------------------------------

    def append_events(
        self, run_id: str, events: Sequence[tuple[str, Mapping[str, Any]]]
    ) -> list[RunEvent]:
        if not events:
            return []
        with self.db.write() as conn:
            return self._append(conn, run_id, events)

    def _append(
        self, conn: Any, run_id: str, events: Sequence[tuple[str, Mapping[str, Any]]]
    ) -> list[RunEvent]:
        row = conn.execute(
            "SELECT last_seq, journal_closed FROM runs WHERE id = ?" + self.db.for_update,
            (run_id,),
        ).fetchone()
        if row is None or row["journal_closed"]:
            return []
        seq = int(row["last_seq"])
        now = time.time()
        written: list[RunEvent] = []
        for type_, data in events:
            seq += 1
            written.append(RunEvent(run_id, seq, type_, dict(data), now))
            if type_ in TERMINAL_EVENT_TYPES:
                break
        conn.executemany(
            "INSERT INTO run_events (run_id, seq, type, data, ts) VALUES (?, ?, ?, ?, ?)",
            [(e.run_id, e.seq, e.type, e.data_json, e.ts) for e in written],
        )
        closed = int(written[-1].type in TERMINAL_EVENT_TYPES)
        conn.execute(
            "UPDATE runs SET last_seq = ?, journal_closed = ? WHERE id = ?",
            (seq, closed, run_id),
        )
        return written

    def last_seqs(self, run_ids: Sequence[str]) -> dict[str, int]:
        ids = [run_id for run_id in run_ids if NUL not in run_id]
        found: dict[str, int] = {}
        with self.db.read() as conn:
            for start in range(0, len(ids), 500):
                part = ids[start : start + 500]
                rows = conn.execute(
                    f"SELECT id, last_seq FROM runs WHERE id IN ({', '.join('?' * len(part))})",
                    part,
                ).fetchall()
                found.update((str(row[0]), int(row[1])) for row in rows)
        return found

    def events_after(self, run_id: str, after: int, limit: int = 1000) -> list[RunEvent]:
        if NUL in run_id:
            return []
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT run_id, seq, type, data, ts FROM run_events"
                " WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                (run_id, after, limit),
            ).fetchall()
        return [_row_to_event(row) for row in rows]

    def last_event(self, run_id: str, event_type: str) -> RunEvent | None:
        if NUL in run_id or NUL in event_type:
            return None
        with self.db.read() as conn:
            row = conn.execute(
                "SELECT run_id, seq, type, data, ts FROM run_events"
                " WHERE run_id = ? AND type = ? ORDER BY seq DESC LIMIT 1",
                (run_id, event_type),
            ).fetchone()
        return _row_to_event(row) if row is not None else None

    def finished_before(self, cutoff: float, limit: int = 1000) -> list[Run]:
        with self.db.read() as conn:
            rows = conn.execute(
                f"SELECT {_WITHOUT_RESULT} FROM runs WHERE phase IN ({_TERMINAL_SQL})"
                " AND finished_at < ? AND first_seq < last_seq ORDER BY finished_at LIMIT ?",
                (cutoff, limit),
            ).fetchall()
        return [_row_to_run(row) for row in rows]

    def trim_journal(self, run_id: str, keep_from_seq: int) -> int:
        with self.db.write() as conn:
            deleted = conn.execute(
                "DELETE FROM run_events WHERE run_id = ? AND seq < ?", (run_id, keep_from_seq)
            ).rowcount
            conn.execute(
                "UPDATE runs SET first_seq = ? WHERE id = ? AND first_seq < ?",
                (keep_from_seq, run_id, keep_from_seq),
            )
        return int(deleted)
