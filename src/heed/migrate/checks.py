"""The checks of ``heed migrate``: counts, and recall on both databases.

Counts: per bank, source and target must hold the same number of documents, chunks, units,
units with a vector, entities, memberships, links and ledger rows; for sessions, messages,
wakeups, (finished) runs and journal events, webhooks, their events and deliveries, and the
archives still downloadable and their parts, every source row's key must be in the target.

Recall: for each bank, up to ``queries`` units sampled deterministically (the first by id;
ids are random UUIDs) are used as queries, their text recalled on a
:class:`~heed.memory.MemoryEngine` over the SQLite store and one over the PostgreSQL store;
reported are the share of queries whose top hit is the same unit id and the mean overlap of
the top 10 ids. The check fails when a count differs or the top-1 agreement is below
:data:`~heed.migrate.reports.MIN_TOP1_AGREEMENT`. The engines come from an
:data:`EngineFactory` (:func:`engine_factory_for`: the embedder and reranker the servers
use). It runs its own event loop: call it from a thread when inside one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Final

from heed.memory import MemoryEngine, build_embedder, build_memory_engine
from heed.memory.embeddings import Embedder
from heed.memory.models import Bank, InvalidInput, RecallQuery
from heed.memory.store import MemoryStore
from heed.migrate.copier import KEY_BATCH, storable
from heed.migrate.reports import BankRecall, CountCheck, MigrationError, Progress, Verification
from heed.migrate.source import Snapshot
from heed.migrate.tables import BANK_TABLES, TERMINAL_SQL, live_archive
from heed.runtime import Lane, Lanes, RequestContext, use_context
from heed.settings import Settings
from heed.storage import SqliteDatabase
from heed.storage.memory import SqlMemoryStore
from heed.storage.postgres import PostgresDatabase

__all__ = ["DEFAULT_VERIFY_QUERIES", "TOP_K", "EngineFactory", "check_copy", "engine_factory_for"]

DEFAULT_VERIFY_QUERIES: Final = 20
#: Results compared per recall query.
TOP_K: Final = 10
#: A query is the unit's text cut to this many characters (recall refuses long queries).
MAX_QUERY_CHARS: Final = 400

#: Builds a memory engine over a store (for the recall check).
EngineFactory = Callable[[MemoryStore], MemoryEngine]


def _one(cursor: Any) -> Any:
    """The first column of a query's one row (``None`` when there is no row)."""
    row = cursor.fetchone()
    return None if row is None else row[0]


def _source_bank_counts(src: Snapshot) -> dict[str, dict[str, int]]:
    """Per bank ref, per table: the rows the source holds (what verification compares)."""
    counts: dict[str, dict[str, int]] = {}
    if not src.has("memory"):
        return counts
    for (ref,) in src.conn.execute("SELECT ref FROM memory_banks ORDER BY ref"):
        counts[str(ref)] = {t: 0 for t in (*BANK_TABLES, "memory_units.embedding")}
        counts[str(ref)]["memory_banks"] = 1
    for table, sql in _bank_count_queries("").items():
        for ref, n in src.conn.execute(sql):
            if str(ref) in counts:
                counts[str(ref)][table] = int(n)
    return counts


#: The memory tables that :func:`_bank_count_queries` does not count by its shared
#: ``bank_ref`` query: the banks themselves (one row a bank, counted by the caller), and the
#: tables it counts by a query of their own (through their units; the embeddings too).
_COUNTED_APART: Final = frozenset(
    {"memory_banks", "memory_units", "memory_unit_entities", "memory_links"}
)


def _bank_count_queries(where: str) -> dict[str, str]:
    """``SELECT bank_ref, COUNT(*) ... GROUP BY bank_ref`` per table; *where* filters refs."""
    out = {}
    for table in BANK_TABLES:
        if table in _COUNTED_APART:
            continue
        out[table] = (
            f"SELECT bank_ref, COUNT(*) FROM {table} t {where.format(ref='t.bank_ref')}"
            " GROUP BY bank_ref"
        )
    out["memory_units"] = (
        f"SELECT bank_ref, COUNT(*) FROM memory_units u {where.format(ref='u.bank_ref')}"
        " GROUP BY bank_ref"
    )
    out["memory_units.embedding"] = (
        f"SELECT bank_ref, COUNT(embedding) FROM memory_units u"
        f" {where.format(ref='u.bank_ref')} GROUP BY bank_ref"
    )
    out["memory_unit_entities"] = (
        "SELECT u.bank_ref, COUNT(*) FROM memory_unit_entities x JOIN memory_units u"
        f" ON u.seq = x.unit_seq {where.format(ref='u.bank_ref')} GROUP BY u.bank_ref"
    )
    out["memory_links"] = (
        "SELECT u.bank_ref, COUNT(*) FROM memory_links x JOIN memory_units u"
        f" ON u.seq = x.from_seq {where.format(ref='u.bank_ref')} GROUP BY u.bank_ref"
    )
    return out


def _count_checks(src: Snapshot, dst: PostgresDatabase) -> list[CountCheck]:
    checks: list[CountCheck] = []
    now = time.time()  # the archives live now (an archive copied earlier may expire since)
    with dst.read() as conn:
        missing = [
            table
            for table in ("schema_migrations", "memory_units", "sessions", "runs")
            if _one(conn.execute("SELECT to_regclass(?)", (table,))) is None
        ]
    if missing:
        raise MigrationError(
            f"the target has no heed schema (no {', '.join(missing)}); run the migration "
            "without --verify-only first"
        )
    # Memory: per bank, exact counts.
    source = _source_bank_counts(src)
    if source:
        refs = list(source)
        names = {
            str(r[0]): f"bank {r[1]}/{r[2]}"
            for r in src.conn.execute("SELECT ref, tenant, bank_id FROM memory_banks")
        }
        target: dict[str, dict[str, int]] = {ref: {} for ref in refs}
        with dst.read() as conn:
            for (ref,) in conn.execute(
                "SELECT ref FROM memory_banks WHERE ref = ANY(?::text[])", (refs,)
            ).fetchall():
                target[str(ref)]["memory_banks"] = 1
            for table, sql in _bank_count_queries("WHERE {ref} = ANY(?::text[])").items():
                for ref, n in conn.execute(sql, (refs,)).fetchall():
                    target[str(ref)][table] = int(n)
        for ref in refs:
            for table, n in source[ref].items():
                checks.append(CountCheck(names[ref], table, n, target[ref].get(table, 0)))
    # Sessions and runs: every source row's key in the target.
    keyed = [
        ("sessions", "sessions", "SELECT rowid AS _k, id FROM sessions WHERE 1 = 1", "id"),
        (
            "sessions",
            "session_messages",
            "SELECT rowid AS _k, id FROM session_messages WHERE 1 = 1",
            "id",
        ),
        (
            "sessions",
            "session_wakeups",
            "SELECT rowid AS _k, id FROM session_wakeups WHERE 1 = 1",
            "id",
        ),
        (
            "runs",
            "runs",
            f"SELECT rowid AS _k, id FROM runs WHERE phase IN ({TERMINAL_SQL})",
            "id",
        ),
        ("webhooks", "webhooks", "SELECT rowid AS _k, id FROM webhooks WHERE 1 = 1", "id"),
        (
            "webhooks",
            "webhook_events",
            "SELECT rowid AS _k, id FROM webhook_events WHERE 1 = 1",
            "id",
        ),
        (
            "webhooks",
            "webhook_deliveries",
            "SELECT rowid AS _k, id FROM webhook_deliveries WHERE 1 = 1",
            "id",
        ),
        (
            "transfer_archives",
            "transfer_archives",
            "SELECT rowid AS _k, id FROM transfer_archives"
            f" WHERE {live_archive('transfer_archives', now)}",
            "id",
        ),
    ]
    for component, table, select, column in keyed:
        if not src.has(component):
            continue
        n_source = n_target = 0
        for rows in src.pages(select, (), KEY_BATCH, "rowid"):
            keys = [storable(r[column]) for r in rows]
            n_source += len(keys)
            with dst.read() as conn:
                n_target += int(
                    _one(
                        conn.execute(
                            f"SELECT COUNT(*) FROM {table} WHERE {column} = ANY(?::text[])",
                            (keys,),
                        )
                    )
                )
        checks.append(CountCheck("all", table, n_source, n_target))
    if src.has("runs"):
        checks.append(
            _pair_count(
                src,
                dst,
                "run_events",
                (
                    "SELECT e.rowid AS _k, e.run_id AS k1, e.seq AS k2 FROM run_events e"
                    f" JOIN runs r ON r.id = e.run_id WHERE r.phase IN ({TERMINAL_SQL})"
                ),
                "e.rowid",
                ("run_id", "seq", "bigint"),
            )
        )
    if src.has("transfer_archives"):
        checks.append(
            _pair_count(
                src,
                dst,
                "transfer_archive_parts",
                (
                    "SELECT t.rowid AS _k, t.archive_id AS k1, t.part AS k2"
                    " FROM transfer_archive_parts t JOIN transfer_archives a"
                    f" ON a.id = t.archive_id WHERE {live_archive('a', now)}"
                ),
                "t.rowid",
                ("archive_id", "part", "integer"),
            )
        )
    return checks


def _pair_count(
    src: Snapshot,
    dst: PostgresDatabase,
    table: str,
    select: str,
    order: str,
    key: tuple[str, str, str],
) -> CountCheck:
    """The rows of *table* the source's *select* names (its key columns as ``k1``, ``k2``)
    against those of the target with the same key: *key* is the target's two key columns
    and the SQL type of the second (the first is text)."""
    first, second, second_type = key
    n_source = n_target = 0
    for rows in src.pages(select, (), KEY_BATCH, order):
        n_source += len(rows)
        with dst.read() as conn:
            n_target += int(
                _one(
                    conn.execute(
                        f"SELECT COUNT(*) FROM {table} t"
                        f" JOIN unnest(?::text[], ?::{second_type}[]) AS k({first}, {second})"
                        f" ON t.{first} = k.{first} AND t.{second} = k.{second}",
                        ([storable(r["k1"]) for r in rows], [int(r["k2"]) for r in rows]),
                    )
                )
            )
    return CountCheck("all", table, n_source, n_target)


def _samples(src: Snapshot, queries: int) -> list[tuple[str, str, str, list[tuple[str, str]]]]:
    """Per bank: ref, tenant, bank_id and up to *queries* (unit id, text), first by id."""
    if not src.has("memory") or queries <= 0:
        return []
    out = []
    for ref, tenant, bank_id in src.conn.execute(
        "SELECT ref, tenant, bank_id FROM memory_banks ORDER BY tenant, bank_id"
    ).fetchall():
        units = [
            (str(r[0]), str(r[1]))
            for r in src.conn.execute(
                "SELECT id, text FROM memory_units WHERE bank_ref = ? ORDER BY id LIMIT ?",
                (ref, queries),
            )
        ]
        if units:
            out.append((str(ref), str(tenant), str(bank_id), units))
    return out


def _query_text(text: str) -> str:
    if len(text) <= MAX_QUERY_CHARS:
        return text
    cut = text[:MAX_QUERY_CHARS]
    return cut.rsplit(" ", 1)[0] if " " in cut else cut


async def _top_ids(engine: MemoryEngine, bank: Bank | None, query: RecallQuery) -> list[str] | None:
    """The ids of the top :data:`TOP_K` hits (``[]`` without the bank, ``None`` when the
    engine refuses the query)."""
    if bank is None:
        return []
    try:
        outcome = await engine.recall(bank, query)
    except InvalidInput:
        return None
    return [hit.unit.id for hit in outcome.hits[:TOP_K]]


async def _compare_recall(
    samples: list[tuple[str, str, str, list[tuple[str, str]]]],
    source_store: MemoryStore,
    target_store: MemoryStore,
    engine_factory: EngineFactory,
    dim: int,
    progress: Progress,
) -> list[BankRecall]:
    lite, pg = engine_factory(source_store), engine_factory(target_store)
    if lite.embedder.dim != dim:
        raise MigrationError(
            f"the configured embedder makes {lite.embedder.dim}-dimensional vectors but the "
            f"banks hold {dim}-dimensional ones: set HEED_EMBEDDINGS_* as the source server "
            "had them"
        )
    results: list[BankRecall] = []
    for _ref, tenant, bank_id, units in samples:
        outcome = BankRecall(tenant, bank_id, 0, 0, 0.0)
        results.append(outcome)
        with use_context(RequestContext(tenant=tenant)):
            bank_a = await asyncio.to_thread(source_store.get_bank, tenant, bank_id)
            bank_b = await asyncio.to_thread(target_store.get_bank, tenant, bank_id)
            for unit_id, text in units:
                query = RecallQuery(query=_query_text(text))
                top_a = await _top_ids(lite, bank_a, query)
                if top_a is not None:  # else not a usable query (say, only punctuation)
                    top_b = await _top_ids(pg, bank_b, query) or []
                    outcome.queries += 1
                    if top_a[:1] == top_b[:1]:
                        outcome.top1_same += 1
                    elif len(outcome.differing) < 10:
                        outcome.differing.append(unit_id)
                    widest = max(len(top_a), len(top_b))
                    outcome.top10_overlap_sum += (
                        len(set(top_a) & set(top_b)) / widest if widest else 1.0
                    )
                progress.advance(f"recall {bank_id}", 1)
    return results


def check_copy(
    src: Snapshot,
    dst: PostgresDatabase,
    dim: int,
    queries: int,
    engine_factory: EngineFactory | None,
    progress: Progress,
) -> Verification:
    """Compare the target with the source: counts, and recall when *engine_factory* is
    given (see the module docstring)."""
    counts = _count_checks(src, dst)
    recall: list[BankRecall] = []
    samples = _samples(src, queries) if engine_factory is not None else []
    if samples and engine_factory is not None:
        progress.start("verify", sum(len(s[3]) for s in samples))
        source_db = SqliteDatabase(src.path)
        try:
            recall = asyncio.run(
                _compare_recall(
                    samples,
                    SqlMemoryStore(source_db, dim),
                    SqlMemoryStore(dst, dim),
                    engine_factory,
                    dim,
                    progress,
                )
            )
        finally:
            source_db.close()
            progress.finish()
    return Verification(counts, recall)


def engine_factory_for(settings: Settings) -> EngineFactory:
    """Engines for the recall check configured by *settings* (the embedder and reranker the
    servers use). The embedder loads on the first engine, not here."""
    embedders: list[Embedder] = []

    def make(store: MemoryStore) -> MemoryEngine:
        if not embedders:
            embedders.append(build_embedder(settings))
        # Queries run one at a time: one slot per lane, no wait limit.
        lanes = Lanes([Lane("recall", 1, 16), Lane("retain", 1, 16)])
        return build_memory_engine(settings, store, lanes, embedders[0])

    return make
