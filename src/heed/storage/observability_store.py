"""LLM usage, LLM request traces and audit entries (component ``observability``), on
SQLite or PostgreSQL: :class:`heed.observability.ObservabilityStore`.

Usage rows are keyed by ``(tenant, bank_id, kind, hour_start)`` and added to by an
``ON CONFLICT ... DO UPDATE`` upsert (one statement per hour row a flush touches). Traces
and audit entries are rows with their JSON values as text, read newest first through an
index on ``(tenant, bank_id, started_at)``; bounds are cut by the ``started_at`` of the
oldest row to keep, which both databases answer from that index.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from heed.observability.records import (
    AuditEntry,
    AuditFilter,
    Retention,
    TraceFilter,
    TraceRow,
    UsageRow,
)
from heed.storage.database import (
    Migration,
    SqlStore,
    from_row,
    read_page,
)

__all__ = ["MIGRATIONS", "SqlObservabilityStore"]

MIGRATIONS: Final = [
    Migration(
        "observability",
        1,
        """
        CREATE TABLE llm_usage (
            tenant TEXT NOT NULL,
            bank_id TEXT NOT NULL,
            kind TEXT NOT NULL,
            hour_start BIGINT NOT NULL,
            calls BIGINT NOT NULL,
            prompt_tokens BIGINT NOT NULL,
            completion_tokens BIGINT NOT NULL,
            PRIMARY KEY (tenant, bank_id, kind, hour_start)
        );
        CREATE TABLE llm_requests (
            id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            bank_id TEXT NOT NULL,
            operation TEXT NOT NULL,
            scope TEXT NOT NULL,
            trace_id TEXT,
            provider TEXT NOT NULL,
            model TEXT NOT NULL,
            status TEXT NOT NULL,
            started_at {real} NOT NULL,
            ended_at {real} NOT NULL,
            duration_ms BIGINT NOT NULL,
            input_tokens BIGINT NOT NULL,
            output_tokens BIGINT NOT NULL,
            input TEXT NOT NULL,
            output TEXT NOT NULL,
            error TEXT,
            metadata TEXT NOT NULL
        );
        CREATE INDEX llm_requests_bank ON llm_requests (tenant, bank_id, started_at);
        CREATE TABLE audit_logs (
            id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            bank_id TEXT,
            action TEXT NOT NULL,
            transport TEXT NOT NULL,
            started_at {real} NOT NULL,
            ended_at {real},
            duration_ms BIGINT,
            principal TEXT,
            request TEXT,
            response TEXT,
            metadata TEXT NOT NULL
        );
        CREATE INDEX audit_logs_bank ON audit_logs (tenant, bank_id, started_at);
        """,
    ),
]

_TRACE_COLUMNS: Final = (
    "id, tenant, bank_id, operation, scope, trace_id, provider, model, status, started_at,"
    " ended_at, duration_ms, input_tokens, output_tokens, input, output, error, metadata"
)
_AUDIT_COLUMNS: Final = (
    "id, tenant, bank_id, action, transport, started_at, ended_at, duration_ms, principal,"
    " request, response, metadata"
)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _trace(row: Any) -> TraceRow:
    return from_row(
        TraceRow,
        row,
        floats=("started_at", "ended_at"),
        ints=("duration_ms", "input_tokens", "output_tokens"),
        input=_loads(row["input"]),
        output=_loads(row["output"]),
        metadata=_loads(row["metadata"]) or {},
    )


def _audit(row: Any) -> AuditEntry:
    return from_row(
        AuditEntry,
        row,
        floats=("started_at", "ended_at"),
        ints=("duration_ms",),
        request=_loads(row["request"]),
        response=_loads(row["response"]),
        metadata=_loads(row["metadata"]) or {},
    )


_Row = TypeVar("_Row")


@dataclass(frozen=True, slots=True)
class _Rows(Generic[_Row]):
    """One kind of a bank's rows: its table, the columns read and how a row of them reads,
    and the fields of its filter that name a column to equal."""

    table: str
    columns: str
    read: Callable[[Any], _Row]
    equal: tuple[str, ...]

    def where(
        self, tenant: str, bank_id: str, where: TraceFilter | AuditFilter
    ) -> tuple[str, list[Any]]:
        """The SQL condition and its parameters for the bank's rows *where* takes: each
        field of :attr:`equal` equal when given, ``started_at`` within ``[since, until)``."""
        clauses: list[str] = ["tenant = ?", "bank_id = ?"]
        params: list[Any] = [tenant, bank_id]
        for column in self.equal:
            value = getattr(where, column)
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if where.since is not None:
            clauses.append("started_at >= ?")
            params.append(where.since)
        if where.until is not None:
            clauses.append("started_at < ?")
            params.append(where.until)
        return " AND ".join(clauses), params


_TRACES: Final = _Rows(
    "llm_requests", _TRACE_COLUMNS, _trace, ("status", "operation", "scope", "provider", "trace_id")
)
_AUDITS: Final = _Rows("audit_logs", _AUDIT_COLUMNS, _audit, ("action", "transport"))


class SqlObservabilityStore(SqlStore):
    """See the module docstring. Calls block (short statements)."""

    migrations = MIGRATIONS

    def write(
        self, usage: list[UsageRow], traces: list[TraceRow], audits: list[AuditEntry]
    ) -> None:
        with self.db.write() as conn:
            for u in usage:
                conn.execute(
                    "INSERT INTO llm_usage (tenant, bank_id, kind, hour_start, calls,"
                    " prompt_tokens, completion_tokens) VALUES (?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (tenant, bank_id, kind, hour_start) DO UPDATE SET"
                    " calls = llm_usage.calls + excluded.calls,"
                    " prompt_tokens = llm_usage.prompt_tokens + excluded.prompt_tokens,"
                    " completion_tokens = llm_usage.completion_tokens"
                    " + excluded.completion_tokens",
                    (
                        u.tenant,
                        u.bank_id,
                        u.kind,
                        u.hour_start,
                        u.calls,
                        u.prompt_tokens,
                        u.completion_tokens,
                    ),
                )
            for t in traces:
                conn.execute(
                    f"INSERT INTO llm_requests ({_TRACE_COLUMNS}) VALUES"
                    " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (id) DO NOTHING",
                    (
                        t.id,
                        t.tenant,
                        t.bank_id,
                        t.operation,
                        t.scope,
                        t.trace_id,
                        t.provider,
                        t.model,
                        t.status,
                        t.started_at,
                        t.ended_at,
                        t.duration_ms,
                        t.input_tokens,
                        t.output_tokens,
                        _dumps(t.input),
                        _dumps(t.output),
                        t.error,
                        _dumps(t.metadata),
                    ),
                )
            for a in audits:
                conn.execute(
                    f"INSERT INTO audit_logs ({_AUDIT_COLUMNS}) VALUES"
                    " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
                    (
                        a.id,
                        a.tenant,
                        a.bank_id,
                        a.action,
                        a.transport,
                        a.started_at,
                        a.ended_at,
                        a.duration_ms,
                        a.principal,
                        None if a.request is None else _dumps(a.request),
                        None if a.response is None else _dumps(a.response),
                        _dumps(a.metadata),
                    ),
                )

    def prune(self, banks: list[tuple[str, str]], retention: Retention) -> None:
        keeps = (("llm_requests", retention.max_traces), ("audit_logs", retention.max_audits))
        with self.db.write() as conn:
            for tenant, bank_id in banks:
                for table, keep in keeps:
                    row = conn.execute(
                        f"SELECT started_at FROM {table} WHERE tenant = ? AND bank_id = ?"
                        " ORDER BY started_at DESC LIMIT 1 OFFSET ?",
                        (tenant, bank_id, max(0, keep - 1)),
                    ).fetchone()
                    if row is not None:
                        conn.execute(
                            f"DELETE FROM {table} WHERE tenant = ? AND bank_id = ?"
                            " AND started_at < ?",
                            (tenant, bank_id, row[0]),
                        )
            if retention.traces_before > 0:
                conn.execute(
                    "DELETE FROM llm_requests WHERE started_at < ?", (retention.traces_before,)
                )
            if retention.audits_before > 0:
                conn.execute(
                    "DELETE FROM audit_logs WHERE started_at < ?", (retention.audits_before,)
                )
            if retention.usage_before > 0:
                conn.execute(
                    "DELETE FROM llm_usage WHERE hour_start < ?", (int(retention.usage_before),)
                )

    def usage(self, tenant: str, bank_id: str, since: float) -> list[UsageRow]:
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT kind, hour_start, calls, prompt_tokens, completion_tokens FROM llm_usage"
                " WHERE tenant = ? AND bank_id = ? AND hour_start >= ?"
                " ORDER BY hour_start, kind",
                (tenant, bank_id, int(since // 3600 * 3600)),
            ).fetchall()
        return [
            UsageRow(tenant, bank_id, r[0], int(r[1]), int(r[2]), int(r[3]), int(r[4]))
            for r in rows
        ]

    def traces(
        self, tenant: str, bank_id: str, where: TraceFilter, limit: int, offset: int
    ) -> tuple[list[TraceRow], int]:
        return self._newest_first(_TRACES, tenant, bank_id, where, limit, offset)

    def trace_times(
        self, tenant: str, bank_id: str, where: TraceFilter
    ) -> list[tuple[float, str, int, int]]:
        clause, params = _TRACES.where(tenant, bank_id, where)
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT started_at, status, input_tokens, output_tokens FROM llm_requests"
                f" WHERE {clause}",
                params,
            ).fetchall()
        return [(float(r[0]), r[1], int(r[2]), int(r[3])) for r in rows]

    def audits(
        self, tenant: str, bank_id: str, where: AuditFilter, limit: int, offset: int
    ) -> tuple[list[AuditEntry], int]:
        return self._newest_first(_AUDITS, tenant, bank_id, where, limit, offset)

    def _newest_first(
        self,
        rows: _Rows[_Row],
        tenant: str,
        bank_id: str,
        where: TraceFilter | AuditFilter,
        limit: int,
        offset: int,
    ) -> tuple[list[_Row], int]:
        """A page of the bank's *rows* that *where* takes, newest first, and how many it
        takes."""
        clause, params = rows.where(tenant, bank_id, where)
        page, total = read_page(
            self.db,
            rows.columns,
            f"{rows.table} WHERE {clause}",
            params,
            "started_at DESC, id",
            limit,
            offset,
        )
        return [rows.read(row) for row in page], total

    def audit(self, tenant: str, bank_id: str, log_id: str) -> AuditEntry | None:
        with self.db.read() as conn:
            row = conn.execute(
                f"SELECT {_AUDIT_COLUMNS} FROM audit_logs"
                " WHERE id = ? AND tenant = ? AND bank_id = ?",
                (log_id, tenant, bank_id),
            ).fetchone()
        return None if row is None else _audit(row)

    def audit_times(self, tenant: str, bank_id: str, where: AuditFilter) -> list[tuple[float, str]]:
        clause, params = _AUDITS.where(tenant, bank_id, where)
        with self.db.read() as conn:
            rows = conn.execute(
                f"SELECT started_at, action FROM audit_logs WHERE {clause}", params
            ).fetchall()
        return [(float(r[0]), r[1]) for r in rows]

    def delete_bank(self, tenant: str, bank_id: str) -> None:
        with self.db.write() as conn:
            conn.execute(
                "DELETE FROM llm_usage WHERE tenant = ? AND bank_id = ?", (tenant, bank_id)
            )
            conn.execute(
                "DELETE FROM llm_requests WHERE tenant = ? AND bank_id = ?", (tenant, bank_id)
            )
