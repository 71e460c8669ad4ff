"""LLM usage, LLM request traces and audit entries on both databases: usage adds up per
hour row, each bank keeps its newest rows and none past their age, reads are scoped by
tenant and bank, and a deleted bank's usage and traces go."""

from __future__ import annotations

import time

from heed.observability import AuditEntry, AuditFilter, Retention, TraceFilter, TraceRow, UsageRow
from heed.storage import SqlDatabase
from heed.storage.observability_store import SqlObservabilityStore


def _trace(i: int, bank: str = "b", tenant: str = "t", **fields: object) -> TraceRow:
    started = float(fields.pop("started_at", 1_000_000.0 + i))  # type: ignore[arg-type]
    row = {
        "id": f"{tenant}-{bank}-{i}",
        "tenant": tenant,
        "bank_id": bank,
        "operation": "reflect",
        "scope": "reflect",
        "trace_id": None,
        "provider": "openai",
        "model": "m",
        "status": "success",
        "started_at": started,
        "ended_at": started + 0.5,
        "duration_ms": 500,
        "input_tokens": 10,
        "output_tokens": 2,
        "input": [{"role": "user", "chars": 5}],
        "output": {"chars": 3, "tool_calls": [], "finish_reason": "stop"},
        "error": None,
        "metadata": {"usage_reported": True},
        **fields,
    }
    return TraceRow(**row)  # type: ignore[arg-type]


def _audit(i: int, bank: str = "b", tenant: str = "t", action: str = "retain") -> AuditEntry:
    return AuditEntry(
        id=f"a-{tenant}-{bank}-{i}",
        tenant=tenant,
        bank_id=bank,
        action=action,
        transport="http",
        started_at=1_000_000.0 + i,
        ended_at=1_000_000.5 + i,
        duration_ms=500,
        principal="key:k1",
        request={"method": "POST", "route": "/x"},
        response={"status": 200},
        metadata={"tenant": tenant},
    )


def test_usage_adds_up_per_hour_row(sql_database: SqlDatabase) -> None:
    store = SqlObservabilityStore(sql_database)
    store.migrate()
    store.migrate()  # idempotent
    hour = 3600 * 500_000
    store.write([UsageRow("t", "b", "reflect", hour, 1, 100, 5)], [], [])
    store.write(
        [
            UsageRow("t", "b", "reflect", hour, 2, 50, 5),
            UsageRow("t", "b", "extraction", hour, 1, 7, 1),
            UsageRow("t", "b", "reflect", hour + 3600, 1, 1, 1),
            UsageRow("u", "b", "reflect", hour, 9, 9, 9),  # another tenant's bank
        ],
        [],
        [],
    )
    rows = store.usage("t", "b", hour)
    assert rows == [
        UsageRow("t", "b", "extraction", hour, 1, 7, 1),
        UsageRow("t", "b", "reflect", hour, 3, 150, 10),
        UsageRow("t", "b", "reflect", hour + 3600, 1, 1, 1),
    ]
    assert store.usage("t", "b", hour + 3600) == [rows[2]]
    store.delete_bank("t", "b")
    assert store.usage("t", "b", 0) == []
    assert store.usage("u", "b", 0) != []


def test_each_bank_keeps_its_newest_rows_and_none_too_old(sql_database: SqlDatabase) -> None:
    store = SqlObservabilityStore(sql_database)
    store.migrate()
    store.write(
        [],
        [*(_trace(i) for i in range(10)), *(_trace(i, bank="other") for i in range(3))],
        [*(_audit(i) for i in range(6))],
    )
    store.prune(
        [("t", "b")],
        Retention(
            max_traces=4,
            max_audits=2,
            traces_before=0.0,
            audits_before=0.0,
            usage_before=0.0,
        ),
    )
    rows, total = store.traces("t", "b", TraceFilter(), 100, 0)
    assert total == 4 and [r.id for r in rows] == [f"t-b-{i}" for i in (9, 8, 7, 6)]
    assert store.traces("t", "other", TraceFilter(), 100, 0)[1] == 3  # not pruned: not named
    entries, total = store.audits("t", "b", AuditFilter(), 100, 0)
    assert total == 2 and [e.id for e in entries] == ["a-t-b-5", "a-t-b-4"]
    store.prune(
        [],
        Retention(
            max_traces=100,
            max_audits=100,
            traces_before=1_000_008.0,
            audits_before=1_000_005.0,
            usage_before=0.0,
        ),
    )
    assert [r.id for r in store.traces("t", "b", TraceFilter(), 100, 0)[0]] == ["t-b-9", "t-b-8"]
    assert store.traces("t", "other", TraceFilter(), 100, 0)[1] == 0  # all older than the cut
    assert [e.id for e in store.audits("t", "b", AuditFilter(), 100, 0)[0]] == ["a-t-b-5"]


def test_traces_filter_page_and_keep_their_values(sql_database: SqlDatabase) -> None:
    store = SqlObservabilityStore(sql_database)
    store.migrate()
    now = time.time()
    store.write(
        [],
        [
            _trace(1, started_at=now - 30),
            _trace(2, started_at=now - 20, status="error", error="upstream 503"),
            _trace(3, started_at=now - 10, operation="retain", scope="extraction", trace_id="r1"),
            _trace(4, tenant="u", started_at=now),
        ],
        [],
    )
    rows, total = store.traces("t", "b", TraceFilter(), 2, 0)
    assert total == 3 and [r.id for r in rows] == ["t-b-3", "t-b-2"]
    assert rows[0].input == [{"role": "user", "chars": 5}] and rows[0].trace_id == "r1"
    assert rows[1].error == "upstream 503" and rows[1].metadata == {"usage_reported": True}
    assert [r.id for r in store.traces("t", "b", TraceFilter(status="error"), 9, 0)[0]] == ["t-b-2"]
    assert store.traces("t", "b", TraceFilter(trace_id="r1"), 9, 0)[1] == 1
    assert store.traces("t", "b", TraceFilter(operation="retain"), 9, 0)[1] == 1
    window = TraceFilter(since=now - 25, until=now - 15)
    assert [r.id for r in store.traces("t", "b", window, 9, 0)[0]] == ["t-b-2"]
    assert len(store.trace_times("t", "b", TraceFilter())) == 3


def test_an_audit_entry_is_read_only_through_its_bank(sql_database: SqlDatabase) -> None:
    store = SqlObservabilityStore(sql_database)
    store.migrate()
    store.write([], [], [_audit(1), _audit(2, action="delete_document")])
    entry = store.audit("t", "b", "a-t-b-1")
    assert entry is not None and entry.request == {"method": "POST", "route": "/x"}
    assert entry.response == {"status": 200} and entry.principal == "key:k1"
    assert store.audit("t", "other", "a-t-b-1") is None
    assert store.audit("u", "b", "a-t-b-1") is None
    assert store.audit_times("t", "b", AuditFilter(action="delete_document")) == [
        (1_000_002.0, "delete_document")
    ]
    store.delete_bank("t", "b")  # audit entries are history: they stay
    assert store.audit("t", "b", "a-t-b-1") is not None
