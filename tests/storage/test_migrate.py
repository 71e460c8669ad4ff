"""``heed migrate``: a real SQLite source copied into a real PostgreSQL (pgvector) target.

The source is built once per module through the real code: a memory engine on SQLite
(MiniLM embeddings) retains documents into two banks of two tenants (a multi-item
document, an appended document, a deleted unit, an idempotency key), and the SQL run and
session stores on the same file hold a session with a transcript and a wakeup, finished
runs with journals and one unfinished run; the webhook store holds a bank's webhooks with
delivered, failed and pending deliveries (and their events), and the archive store an
export of three parts and an expired one. Each test migrates it into a fresh schema.
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import json
import sqlite3
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from click.testing import CliRunner

import heed.migrate as migration
from heed.api.app import create_app
from heed.cli import main
from heed.memory import build_memory_engine
from heed.memory.directives.rules import Directive
from heed.memory.models import Bank, EntityRef, RetainItem
from heed.memory.store import UnitFilter
from heed.mental_models.values import KnowledgeFolder, MentalModel
from heed.migrate import MigrationError, MigrationSummary, engine_factory_for
from heed.migrate.source import SOURCE_SCHEMA, Snapshot
from heed.migrate.tables import (
    ARCHIVE_TABLES,
    BANK_TABLES,
    DERIVED,
    LEFT_OUT,
    MEMORY_TABLES,
    REMAPPED,
    RUN_TABLES,
    WEBHOOK_TABLES,
    copy_columns,
)
from heed.migrate.target import prepare_target
from heed.runs.events import EventType
from heed.runs.model import Phase, Run, new_run_id
from heed.runtime import Lane, Lanes, RequestContext, use_context
from heed.sessions.store import Message, Session, Wakeup
from heed.settings import Settings
from heed.storage import SqliteDatabase
from heed.storage.memory import SqlMemoryStore
from heed.storage.postgres import PostgresDatabase
from heed.storage.run_store import SqlRunStore
from heed.storage.session_store import SqlSessionStore
from heed.storage.transfer.archives import SqlArchiveStore
from heed.storage.webhook_store import SqlWebhookStore
from heed.transfer.store import PART_BYTES, StoredArchive
from heed.webhooks.models import (
    DELIVERED,
    FAILED,
    PENDING,
    Delivery,
    Event,
    HttpConfig,
    Webhook,
)
from tests.pg_support import fresh_schema
from tests.support import live_server

TRAVEL = [
    "Ana flew from Lisbon to Tokyo for the cherry blossom season.",
    "In Tokyo Ana stayed at a small ryokan near the Sumida river.",
    "Ana took the shinkansen from Tokyo to Kyoto on Tuesday.",
    "In Kyoto Ana visited the Fushimi Inari shrine at dawn.",
    "Ana ate okonomiyaki in Osaka with her friend Kenji.",
]
SINGLES = [
    ("Bruno adopted a grey greyhound named Pixel.", "world"),
    ("Bruno runs the Berlin marathon every September.", "experience"),
    ("Carla repairs vintage typewriters in her Porto workshop.", "world"),
    ("Carla's workshop smells of machine oil and old paper.", "world"),
    ("Dmitri grows heirloom tomatoes on his allotment in Leeds.", "world"),
    ("The allotment committee banned hosepipes during the drought.", "world"),
]
APPENDED = ["Ana flew home to Lisbon with a suitcase full of matcha."]
COOKING = [
    "Priya bakes sourdough bread every Sunday morning.",
    "Priya's sourdough starter is called Bubbles and is seven years old.",
    "Omar slow-cooks lamb tagine with apricots and preserved lemons.",
    "Omar buys his saffron from a spice merchant in Marrakesh.",
    "Lena makes pierogi with potato and cheese for Christmas Eve.",
    "Lena's grandmother taught her to fold pierogi with a fork.",
    "Sam ferments hot sauce from habaneros grown on his balcony.",
]
DOOMED = "This unit is deleted before the migration: it must not appear anywhere."


@dataclass
class Source:
    """The built source file and what the tests need to know about it."""

    path: Path
    session_id: str
    finished_runs: dict[str, int]  # run id -> journal length
    unfinished_run: str
    unfinished_events: int
    archive: bytes  # the live export's bytes (the expired one is left out)


def _items(texts: list[str], document_id: str | None = None, **kw: Any) -> list[RetainItem]:
    return [
        RetainItem(
            content=text,
            timestamp=datetime(2024, 3, 1 + i, 9, tzinfo=UTC),
            document_id=document_id,
            metadata={"n": str(i)},
            tags=["t1"] if i % 2 else [],
            **kw,
        )
        for i, text in enumerate(texts)
    ]


async def _retain_memory(data_dir: Path, db: SqliteDatabase) -> None:
    settings = Settings(data_dir=data_dir)
    lanes = Lanes([Lane("recall", 1, 16), Lane("retain", 1, 16)])
    store = SqlMemoryStore(db)
    store.migrate()
    engine = build_memory_engine(settings, store, lanes)
    with use_context(RequestContext(tenant="default")):
        travel = await engine.put_bank("travel", {"mission": "remember trips"})
        trip = _items(TRAVEL, "trip-2024")
        trip[0].entities = [EntityRef("Ana", "person")]
        trip[1].context = "Notes written up after the trip, from the diary: " + "d" * 40  # shared
        await engine.retain(travel, trip)
        for text, fact_type in SINGLES[:4]:
            [item] = _items([text], fact_type=fact_type)
            await engine.retain(travel, [item], idempotency_key=f"key-{text[:8]}")
        # A document whose middle unit is deleted below: its two others are not neighbours.
        await engine.retain(travel, _items([SINGLES[4][0], DOOMED, SINGLES[5][0]], "allotment"))
        # Appended later: the document's new unit is not next to its first ones.
        await engine.retain(travel, _items(APPENDED, "trip-2024", update_mode="append"))
        doomed, _ = await engine.list_units(travel, UnitFilter(search=DOOMED[:30]), 10, 0)
        assert len(doomed) == 1
        await engine.delete_unit(travel, doomed[0].id)
        assert store.add_alias(travel, "journeys", True, 64) is None  # an alias travels too
        rule = Directive(str(uuid.uuid4()), travel.ref, "dates", "Give dates.", 2, tags=["t1"])
        assert store.create_directive(rule, 10) is not None
        folder = KnowledgeFolder(travel.ref, "trips", "Trips")
        store.create_knowledge_folder(folder, 10)
        page = MentalModel(travel.ref, "ana", "Ana", "Where did Ana go?", is_page=True)
        page.parent_id = folder.id
        store.create_mental_model(page, 10)
        for text in ("Tokyo.", "Tokyo and Kyoto."):  # the first goes to the page's history
            store.write_mental_model_content(
                travel.ref,
                "ana",
                text,
                {"text": text},
                None,
                reason="refreshed",
                history_limit=5,
                refreshed=True,
            )
    with use_context(RequestContext(tenant="acme")):
        cooking = await engine.put_bank("cooking", {})
        await engine.retain(cooking, _items(COOKING[:4], "kitchen-notes"))
        # Document tags longer than a reference: stored once, shared by units and documents.
        await engine.retain(cooking, _items(COOKING[4:]), [f"recipe-box-{i:02d}" for i in range(8)])
        # An invalidated fact (kept out of the units, for a revert) travels too.
        kept, _ = await engine.list_units(cooking, UnitFilter(), 20, 0)
        [doomed] = [u for u in kept if not u.text.startswith(("Lena", "Sam"))][:1]
        assert store.invalidate_unit(cooking.ref, doomed.id, "a test") is not None


def _runs_and_sessions(db: SqliteDatabase) -> tuple[str, dict[str, int], str, int]:
    runs = SqlRunStore(db)
    sessions = SqlSessionStore(db)
    runs.migrate()
    sessions.migrate()
    now = time.time()
    session = sessions.create(Session("ses_1", "default", "trip chat", "travel", now, now))
    for i, (role, content) in enumerate(
        [
            ("user", "Where did Ana go?"),
            ("assistant", "Tokyo, Kyoto and Osaka."),
            ("user", "And then?"),
            ("assistant", "Home to Lisbon."),
            ("user", "Thanks!"),
        ]
    ):
        sessions.append_message(
            Message(f"msg_{i}", session.id, 0, role, content, now + i, run_id=None)
        )
    finished: dict[str, int] = {}

    def run(phase: Phase, events: list[tuple[str, dict[str, Any]]], terminal: str | None) -> str:
        r = runs.create(
            Run(
                id=new_run_id(),
                kind="turn",
                tenant="default",
                phase="queued",
                created_at=time.time(),
                session_id=session.id,
            ),
            payload={"message": "hi"},
        )
        claimed = runs.claim(
            r.id, worker_id="w", lease_seconds=60, may_start=lambda *_: True, scope_kinds=["x"]
        )
        assert claimed is not None
        runs.append_events(r.id, events)
        if terminal is not None:
            done = runs.transition(
                r.id, phase, fields={"finished_at": time.time()}, event=(terminal, {})
            )
            assert done is not None
        return r.id

    deltas = [(EventType.TEXT_DELTA, {"text": f"part {i} "}) for i in range(4)]
    rid = run(Phase.COMPLETED, deltas, EventType.COMPLETED)
    finished[rid] = 6  # started, 4 deltas, completed
    rid = run(Phase.FAILED, deltas[:1], EventType.FAILED)
    finished[rid] = 3
    task = run(Phase.COMPLETED, [], EventType.COMPLETED)
    finished[task] = 2
    sessions.add_wakeup(Wakeup("wk_1", session.id, task, {"status": "completed"}, now))
    queued = runs.create(Run(new_run_id(), "turn", "default", "queued", time.time(), session.id))
    cancelled = runs.transition(
        queued.id, Phase.CANCELLED, fields={"finished_at": now}, event=(EventType.CANCELLED, {})
    )
    assert cancelled is not None
    finished[queued.id] = 1  # cancelled while queued: its one event
    unfinished = run(Phase.RUNNING, deltas[:2], None)  # still "running": its server stopped
    return session.id, finished, unfinished, 3


#: The webhooks' secret (copied as it is: the servers on the target sign with it).
SECRET = "whsec-migrate-test"


def _webhooks_and_archives(db: SqliteDatabase) -> bytes:
    """Two webhooks of the travel bank (one switched off) with a delivered, a failed and a
    pending (leased by the stopped server) delivery; an export of three parts, and one
    that expired. Returns the live export's bytes."""
    with db.read() as conn:
        ref = str(
            conn.execute("SELECT ref FROM memory_banks WHERE bank_id = 'travel'").fetchone()[0]
        )
    webhooks = SqlWebhookStore(db)
    webhooks.migrate()
    now = time.time()
    config = HttpConfig(timeout_seconds=10, headers={"X-Team": "blue"}, params={"k": "v"})
    for hook_id, enabled in (("wh_on", True), ("wh_off", False)):
        webhooks.create(
            Webhook(
                hook_id,
                "default",
                ref,
                "travel",
                f"https://hooks.example.com/{hook_id}",
                SECRET,
                ["retain.completed", "run.completed"],
                enabled,
                config,
                now,
                now,
            )
        )
    events = [
        Event(
            f"ev_{status}",
            "default",
            ref,
            "retain.completed",
            json.dumps({"type": "retain.completed", "n": i}),
            now - 60 + i,
            fanned_out=True,
        )
        for i, status in enumerate((DELIVERED, FAILED, PENDING))
    ]
    webhooks.add_events(events)
    deliveries = [
        Delivery(
            id=f"dl_{status}",
            tenant="default",
            bank_ref=ref,
            webhook_id="wh_on",
            event_id=f"ev_{status}",
            event_type="retain.completed",
            url="https://hooks.example.com/wh_on",
            status=status,
            attempts=attempts,
            next_attempt_at=now + i,
            created_at=now - 60 + i,
            updated_at=now - 30 + i,
            seq=i + 1,
            lease_owner="old-server" if status == PENDING else None,
            lease_until=now + 90 if status == PENDING else None,
            last_error="HTTP 500" if status == FAILED else None,
            last_response_status={DELIVERED: 200, FAILED: 500}.get(status),
            last_response_body="ok" if status == DELIVERED else None,
            last_attempt_at=now - 10 if attempts else None,
        )
        for i, (status, attempts) in enumerate(((DELIVERED, 1), (FAILED, 6), (PENDING, 0)))
    ]
    webhooks.enqueue(deliveries)
    archives = SqlArchiveStore(db)
    archives.migrate()
    parts = [bytes([n]) * PART_BYTES for n in (1, 2)] + [b"tail"]
    for archive_id, expires in (("arc_live", now + 86400), ("arc_expired", now - 1)):
        archives.put_archive(
            StoredArchive(
                archive_id, "default", "export", "travel", f"{archive_id}.zip", 0, "", now, expires
            ),
            parts,
        )
    return b"".join(parts)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Source:
    data_dir = tmp_path_factory.mktemp("migrate-source")
    path = data_dir / "heed.db"
    db = SqliteDatabase(path)
    try:
        asyncio.run(_retain_memory(data_dir, db))
        session_id, finished, unfinished, n_unfinished = _runs_and_sessions(db)
        archive = _webhooks_and_archives(db)
    finally:
        db.close()
    return Source(path, session_id, finished, unfinished, n_unfinished, archive)


@pytest.fixture
def pg_url() -> Iterator[str]:
    with fresh_schema() as url:
        yield url


@pytest.fixture(scope="module")
def factory() -> migration.EngineFactory:
    return engine_factory_for(Settings())


@pytest.fixture
def migrated(
    source: Source, pg_url: str, factory: migration.EngineFactory
) -> tuple[MigrationSummary, float]:
    started = time.perf_counter()
    summary = migration.migrate(source.path, pg_url, batch_size=3, engine_factory=factory)
    return summary, time.perf_counter() - started


def _sqlite(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)


def _pg(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True)


def _rows(conn: Any, sql: str) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in conn.execute(sql).fetchall()]


UNIT_EDGES = {
    "links": (
        "SELECT a.id, b.id, l.link_type, l.weight FROM memory_links l"
        " JOIN memory_units a ON a.seq = l.from_seq JOIN memory_units b ON b.seq = l.to_seq"
    ),
    "memberships": (
        "SELECT u.id, e.canonical, e.id FROM memory_unit_entities x"
        " JOIN memory_units u ON u.seq = x.unit_seq JOIN memory_entities e ON e.id = x.entity_id"
    ),
}

TABLES = [
    *BANK_TABLES,
    "sessions",
    "session_messages",
    "session_wakeups",
    "webhooks",
    "webhook_events",
    "webhook_deliveries",
]


def _count(conn: Any, table: str) -> int:
    return int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


# -- 1. everything arrives, intact ------------------------------------------------------------


def test_migration_copies_every_table_and_leaves_unfinished_runs_out(
    source: Source, pg_url: str, migrated: tuple[MigrationSummary, float]
) -> None:
    summary, seconds = migrated
    print(f"migration of the test data: {seconds:.2f} s, {summary.total_copied} rows")
    with _sqlite(source.path) as lite, _pg(pg_url) as pg:
        for table in TABLES:
            n = _count(lite, table)
            assert n > 0, table
            assert _count(pg, table) == n, table
            assert summary.copied[table] == n, table
            assert summary.existing[table] == 0, table
        # Runs: the finished ones with their journals; the unfinished one stays behind.
        assert set(r[0] for r in _rows(pg, "SELECT id FROM runs")) == set(source.finished_runs)
        assert _count(lite, "runs") == len(source.finished_runs) + 1
        assert summary.left_out["runs"] == 1
        assert summary.left_out["run_events"] == source.unfinished_events
        assert summary.copied["runs"] == len(source.finished_runs)
        assert summary.copied["run_events"] == sum(source.finished_runs.values())
        for run_id, n in source.finished_runs.items():
            query = "SELECT seq FROM run_events WHERE run_id = %s ORDER BY seq"
            seqs = [r[0] for r in pg.execute(query, (run_id,)).fetchall()]
            assert seqs == list(range(1, n + 1)), run_id
            journal = "SELECT seq, type, data, ts FROM run_events WHERE run_id = '%s' ORDER BY seq"
            assert _rows(pg, journal % run_id) == _rows(lite, journal % run_id)
        assert not _rows(pg, f"SELECT 1 FROM run_events WHERE run_id = '{source.unfinished_run}'")
        # The transcript, in order; the wakeup.
        transcript = (
            "SELECT idx, role, content, created_at FROM session_messages"
            f" WHERE session_id = '{source.session_id}' ORDER BY idx"
        )
        assert _rows(pg, transcript) == _rows(lite, transcript)
        assert [r[0] for r in _rows(pg, transcript)] == [0, 1, 2, 3, 4]
        assert _rows(pg, "SELECT id, task_run_id, summary FROM session_wakeups") == _rows(
            lite, "SELECT id, task_run_id, summary FROM session_wakeups"
        )
        # Links and memberships point at the same units (compared by unit id).
        for name, sql in UNIT_EDGES.items():
            assert sorted(_rows(pg, sql)) == sorted(_rows(lite, sql)), name
        # Units: same rows apart from seq, in the same seq order; a document's neighbours
        # stay neighbours, and no other units become neighbours.
        columns = (
            "id, bank_ref, document_id, chunk_id, text, fact_type, context, context_ref,"
            " metadata, metadata_ref, tags, tags_ref"
        )
        order = f"SELECT {columns} FROM memory_units ORDER BY seq"
        assert _rows(pg, order) == _rows(lite, order)
        shared = "SELECT bank_ref, digest, body FROM memory_values ORDER BY bank_ref, digest"
        assert _rows(pg, shared) == _rows(lite, shared) != []
        lite_seq = dict(_rows(lite, "SELECT id, seq FROM memory_units"))
        pg_seq = dict(_rows(pg, "SELECT id, seq FROM memory_units"))
        doc = dict(_rows(lite, "SELECT id, document_id FROM memory_units"))
        # (The source has both cases: a document appended to later, one with a deleted unit.)
        by_doc: dict[str, list[int]] = {}
        for unit_id, seq in sorted(lite_seq.items(), key=lambda kv: kv[1]):
            by_doc.setdefault(doc[unit_id], []).append(seq)
        gaps = {
            d for d, seqs in by_doc.items() if any(b - a > 1 for a, b in itertools.pairwise(seqs))
        }
        assert gaps == {"trip-2024", "allotment"}
        for a in lite_seq:
            for b in lite_seq:
                near_before = lite_seq[b] == lite_seq[a] + 1 and doc[a] == doc[b]
                near_after = pg_seq[b] == pg_seq[a] + 1 and doc[a] == doc[b]
                assert near_before == near_after, (a, b)
        assert DOOMED not in {r[0] for r in _rows(pg, "SELECT text FROM memory_units")}
        # Vectors are the same float32 values; the keyword text is FTS's body.
        for unit_id, blob, body in _rows(
            lite,
            "SELECT u.id, u.embedding, f.body FROM memory_units u"
            " JOIN memory_fts f ON f.rowid = u.seq",
        ):
            text = pg.execute(
                "SELECT embedding::text FROM memory_units WHERE id = %s", (unit_id,)
            ).fetchone()
            assert text is not None
            vector = np.array(text[0].strip("[]").split(","), dtype=np.float32)
            assert np.array_equal(vector, np.frombuffer(blob, dtype=np.float32))
            assert body  # the index text the keyword column was built from
    # The verification at the end of the migration passed.
    assert summary.verification is not None
    assert summary.verification.ok, summary.verification.problems()
    checked = {c.table for c in summary.verification.counts}
    assert {"webhooks", "webhook_events", "webhook_deliveries", "transfer_archive_parts"} <= checked


def test_webhooks_and_live_archives_survive_the_migration(
    source: Source, pg_url: str, migrated: tuple[MigrationSummary, float]
) -> None:
    """The banks' webhooks (secret, events, config, switched off or not) and their
    deliveries, each as it was: the pending one is sent by the target's servers once the
    stopped server's lease expires. The export still downloadable arrives whole, the
    expired one is left out and counted; a second run copies none of them again."""
    summary = migrated[0]
    database = PostgresDatabase(pg_url, pool_size=2)
    try:
        webhooks = SqlWebhookStore(database)
        with database.read() as conn:
            ref = str(
                conn.execute("SELECT ref FROM memory_banks WHERE bank_id = 'travel'").fetchone()[0]
            )
        hooks, total = webhooks.list_bank("default", ref, 10, 0)
        assert total == 2 and {h.id: h.enabled for h in hooks} == {"wh_on": True, "wh_off": False}
        on = webhooks.get("default", ref, "wh_on")
        assert on is not None and on.secret == SECRET and on.bank_id == "travel"
        assert on.event_types == ["retain.completed", "run.completed"]
        assert on.http_config == HttpConfig("POST", 10, {"X-Team": "blue"}, {"k": "v"})
        assert [s.id for s in webhooks.subscribers("default", ref)] == ["wh_on"]
        log = webhooks.deliveries("default", ref, "wh_on", 10, None)
        assert {d.id: d.status for d in log} == {
            "dl_delivered": DELIVERED,
            "dl_failed": FAILED,
            "dl_pending": PENDING,
        }
        with _sqlite(source.path) as lite:
            lite.row_factory = sqlite3.Row
            for delivery in log:
                row = lite.execute(
                    "SELECT * FROM webhook_deliveries WHERE id = ?", (delivery.id,)
                ).fetchone()
                assert delivery == Delivery(**dict(zip(row.keys(), tuple(row), strict=True)))
        for delivery in log:  # each body stored once, with its event
            n = {"dl_delivered": 0, "dl_failed": 1, "dl_pending": 2}[delivery.id]
            body = webhooks.event_body(delivery.event_id)
            assert body is not None and json.loads(body) == {"type": "retain.completed", "n": n}
        later = time.time() + 120  # the stopped server's lease is over
        assert [d.id for d in webhooks.due(later, 10)] == ["dl_pending"]
        assert webhooks.claim("dl_pending", "new-server", later, later + 90)

        archives = SqlArchiveStore(database)
        live = archives.get_archive("default", "arc_live")
        assert live is not None and live.byte_size == len(source.archive)
        assert b"".join(archives.archive_parts("arc_live")) == source.archive
        assert archives.get_archive("default", "arc_expired") is None
        with database.read() as conn:
            assert conn.execute("SELECT COUNT(*) FROM transfer_archives").fetchone()[0] == 1
    finally:
        database.close()
    assert summary.copied["webhooks"] == 2 and summary.copied["webhook_deliveries"] == 3
    assert summary.copied["webhook_events"] == 3
    assert summary.copied["transfer_archives"] == 1
    assert summary.copied["transfer_archive_parts"] == 3
    assert summary.left_out["transfer_archives"] == 1
    assert summary.left_out["transfer_archive_parts"] == 3
    again = migration.migrate(source.path, pg_url, verify_queries=0)
    for table in (
        "webhooks",
        "webhook_events",
        "webhook_deliveries",
        "transfer_archives",
        "transfer_archive_parts",
    ):
        assert again.copied[table] == 0 and again.existing[table] == summary.copied[table]


def test_the_postgres_store_searches_the_migrated_units(
    source: Source, pg_url: str, migrated: tuple[MigrationSummary, float]
) -> None:
    database = PostgresDatabase(pg_url, pool_size=2)
    try:
        store = SqlMemoryStore(database, migrated[0].dim)
        bank = store.get_bank("default", "travel")
        assert bank is not None and bank.mission == "remember trips"
        unit = next(
            u
            for u in store.list_units(bank.ref, UnitFilter(search="Inari"), 10, 0)[0]
            if "Inari" in u.text
        )
        # (its neighbours in the document are indexed with its words too:
        # see heed.memory.retain.units)
        hits = store.keyword_search(bank.ref, ["shrine"], 5)
        assert unit.seq in [seq for seq, _ in hits]
        vector = store.unit_vectors(bank.ref, [unit.seq])[unit.seq]
        assert store.vector_search(bank.ref, vector, 3, None)[0][0] == unit.seq
        # The other tenant's bank is there too, and its entities resolve.
        cooking = store.get_bank("acme", "cooking")
        assert cooking is not None
        [state] = store.entity_states(cooking.ref, ["priya"], 5).values()
        assert any("sourdough" in o["text"] for o in state["observations"])
    finally:
        database.close()


def test_every_column_of_every_table_is_copied(
    source: Source, pg_url: str, migrated: tuple[MigrationSummary, float]
) -> None:
    """The columns come from the schemas: each table of the target is copied or left out on
    purpose, each copied table with every column of the live schema, every value equal."""
    database = PostgresDatabase(pg_url, pool_size=2)
    snapshot = Snapshot(source.path)
    try:
        target = prepare_target(database, migrated[0].dim)
        plan = copy_columns(snapshot, target)
        assert target.tables() == set(plan) | set(LEFT_OUT)
        for table, columns in plan.items():
            assert set(columns) | DERIVED.get(table, set()) == set(target.columns(table)), table
        with _sqlite(source.path) as lite, _pg(pg_url) as pg:
            for spec in (*RUN_TABLES, *MEMORY_TABLES, *WEBHOOK_TABLES, *ARCHIVE_TABLES):
                named = ", ".join(f"t.{c}" for c in plan[spec.table])
                rows = f"SELECT {named} FROM {spec.rows_from} WHERE {spec.where_at(time.time())}"
                assert sorted(_rows(pg, rows)) == sorted(_rows(lite, rows)) != [], spec.table
            unit_columns = [c for c in REMAPPED["memory_units"] if c not in ("seq", "embedding")]
            units = f"SELECT {', '.join(unit_columns)} FROM memory_units"
            assert sorted(_rows(pg, units)) == sorted(_rows(lite, units))
    finally:
        snapshot.close()
        database.close()


def test_every_table_a_server_makes_is_copied_or_left_out_on_purpose(tmp_path: Path) -> None:
    """The tables of a real server's SQLite file (every store its composition root
    migrates): each component is one the source reads, and each table is copied (row for
    row, or remapped), left out with a reason (``LEFT_OUT``), or SQLite's keyword index. A
    store added to the server and not to ``heed migrate`` fails here."""
    settings = Settings(data_dir=tmp_path / "data")
    with live_server(create_app(settings)):
        pass
    snapshot = Snapshot(settings.database_path())
    try:
        components = {
            str(r[0]) for r in snapshot.conn.execute("SELECT component FROM schema_migrations")
        }
        tables = {
            str(r[0])
            for r in snapshot.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
    finally:
        snapshot.close()
    assert components == set(SOURCE_SCHEMA) | {"ui_revocations"}  # that one: all LEFT_OUT
    copied = {s.table for s in (*RUN_TABLES, *MEMORY_TABLES, *WEBHOOK_TABLES, *ARCHIVE_TABLES)}
    handled = copied | set(REMAPPED) | set(LEFT_OUT)
    assert {t for t in tables if not t.startswith("memory_fts")} == handled


def test_a_column_a_store_adds_is_copied_or_refused(
    source: Source, pg_url: str, tmp_path: Path
) -> None:
    """As if a store's new migration added a column on both databases: a table copied row
    for row copies it with no change to heed migrate; a table the memory store writes
    itself refuses until the store writes it; a column only one side has is refused."""
    path = tmp_path / "heed.db"
    path.write_bytes(source.path.read_bytes())
    with sqlite3.connect(path) as lite:
        lite.execute("ALTER TABLE sessions ADD COLUMN mood TEXT")
        lite.execute("UPDATE sessions SET mood = 'curious'")
    database = PostgresDatabase(pg_url, pool_size=2)
    try:
        prepare_target(database, 384)
    finally:
        database.close()
    with _pg(pg_url) as pg:
        with pytest.raises(
            MigrationError, match=r"sessions differs .* only in the source \['mood'\]"
        ):
            migration.migrate(path, pg_url, verify_queries=0)
        pg.execute("ALTER TABLE sessions ADD COLUMN mood TEXT")
        summary = migration.migrate(path, pg_url, verify_queries=0)
        assert summary.copied["sessions"] == 1
        assert _rows(pg, "SELECT mood FROM sessions") == [("curious",)]
        pg.execute("ALTER TABLE memory_links ADD COLUMN strength REAL")
        with pytest.raises(MigrationError, match=r"memory_links differs .* only in the target"):
            migration.migrate(path, pg_url, verify_queries=0)
    with sqlite3.connect(path) as lite:
        lite.execute("ALTER TABLE memory_links ADD COLUMN strength REAL")
    with pytest.raises(MigrationError, match="the memory store writes memory_links as"):
        migration.migrate(path, pg_url, verify_queries=0)


# -- 2. idempotent ----------------------------------------------------------------------------


def test_a_second_migration_copies_nothing(
    source: Source, pg_url: str, migrated: tuple[MigrationSummary, float]
) -> None:
    first = migrated[0]
    with _pg(pg_url) as pg:
        before = {t: _count(pg, t) for t in [*TABLES, "runs", "run_events"]}
        seqs = sorted(_rows(pg, "SELECT id, seq FROM memory_units"))
    again = migration.migrate(source.path, pg_url, verify_queries=0)
    assert again.total_copied == 0
    assert again.existing == {t: first.copied[t] + first.existing[t] for t in first.copied}
    assert again.left_out["runs"] == 1
    assert again.verification is not None and again.verification.ok
    with _pg(pg_url) as pg:
        assert {t: _count(pg, t) for t in before} == before
        assert sorted(_rows(pg, "SELECT id, seq FROM memory_units")) == seqs


def test_an_interrupted_copy_is_completed_by_running_again(
    source: Source, pg_url: str, migrated: tuple[MigrationSummary, float]
) -> None:
    with _pg(pg_url) as pg:
        links = sorted(_rows(pg, UNIT_EDGES["links"]))
        # As if the copy had stopped before the cooking bank's second half.
        pg.execute("DELETE FROM memory_units WHERE text LIKE 'Lena%' OR text LIKE 'Sam%'")
        pg.execute("DELETE FROM session_messages WHERE idx >= 3")
        pg.execute("DELETE FROM run_events WHERE seq > 2")
    broken = migration.verify(source.path, pg_url, queries=0)
    assert not broken.ok
    assert {c.table for c in broken.mismatches} >= {"memory_units", "session_messages"}
    again = migration.migrate(source.path, pg_url, verify_queries=0)
    assert again.copied["memory_units"] == 3
    assert again.copied["session_messages"] == 2
    assert again.copied["run_events"] == sum(max(0, n - 2) for n in source.finished_runs.values())
    assert again.verification is not None and again.verification.ok
    with _pg(pg_url) as pg:
        assert sorted(_rows(pg, UNIT_EDGES["links"])) == links


# -- 3. verification --------------------------------------------------------------------------


def test_recall_agrees_on_the_migrated_banks(
    source: Source, pg_url: str, migrated: tuple[MigrationSummary, float], factory: Any
) -> None:
    verification = migration.verify(source.path, pg_url, queries=20, engine_factory=factory)
    assert verification.ok, verification.problems()
    assert {(b.tenant, b.bank_id) for b in verification.recall} == {
        ("default", "travel"),
        ("acme", "cooking"),
    }
    with _sqlite(source.path) as lite:
        assert verification.queries == _count(lite, "memory_units")  # all fit under 20 a bank
    assert verification.top1_agreement >= 0.9
    assert verification.mean_top10_overlap >= 0.7
    assert not verification.mismatches and len(verification.counts) > 20


def test_a_target_missing_a_unit_fails_verification(
    source: Source, pg_url: str, migrated: tuple[MigrationSummary, float], factory: Any
) -> None:
    with _pg(pg_url) as pg:
        pg.execute("DELETE FROM memory_units WHERE text = %s", (COOKING[0],))
    verification = migration.verify(source.path, pg_url, engine_factory=factory)
    assert not verification.ok
    tables = {(c.scope, c.table) for c in verification.mismatches}
    assert ("bank acme/cooking", "memory_units") in tables
    assert any("memory_units" in p for p in verification.problems())
    # The query whose own unit is gone cannot find it first on PostgreSQL.
    [cooking] = [b for b in verification.recall if b.bank_id == "cooking"]
    assert cooking.top1_same < cooking.queries


def test_recall_disagreement_alone_fails_verification(
    source: Source, pg_url: str, migrated: tuple[MigrationSummary, float], factory: Any
) -> None:
    # Counts stay equal, but every target unit answers under another id.
    with _pg(pg_url) as pg:
        pg.execute("UPDATE memory_units SET id = id || '-x'")
    verification = migration.verify(source.path, pg_url, engine_factory=factory)
    assert not verification.mismatches
    assert verification.top1_agreement < 0.9
    assert not verification.ok
    assert any("top-1 agreement" in p for p in verification.problems())


# -- refusals ---------------------------------------------------------------------------------


def test_an_entity_the_target_has_under_another_id_is_reused(source: Source, pg_url: str) -> None:
    # The target already holds the bank (same ref) and its entity "priya" under its own id,
    # as after a first migration and writes on both sides.
    with _sqlite(source.path) as lite:
        bank = lite.execute("SELECT * FROM memory_banks WHERE bank_id = 'cooking'").fetchone()
        n_priya = lite.execute(
            "SELECT COUNT(*) FROM memory_unit_entities x JOIN memory_entities e"
            " ON e.id = x.entity_id WHERE e.canonical = 'priya'"
        ).fetchone()[0]
    assert n_priya == 2
    migration.migrate(source.path, pg_url, verify_queries=0)  # creates the schema
    with _pg(pg_url) as pg:
        pg.execute("TRUNCATE memory_banks CASCADE")
        pg.execute(
            f"INSERT INTO memory_banks VALUES ({', '.join(['%s'] * len(bank))})", tuple(bank)
        )
        pg.execute(
            "INSERT INTO memory_entities (id, bank_ref, canonical, name)"
            " VALUES ('pg-priya', %s, 'priya', 'Priya')",
            (bank[0],),
        )
    summary = migration.migrate(source.path, pg_url, verify_queries=0)
    assert summary.verification is not None and summary.verification.ok
    assert summary.existing["memory_entities"] == 1
    with _pg(pg_url) as pg:
        members = _rows(
            pg,
            "SELECT x.entity_id FROM memory_unit_entities x JOIN memory_entities e"
            " ON e.id = x.entity_id WHERE e.canonical = 'priya'",
        )
    assert members == [("pg-priya",), ("pg-priya",)]


def test_a_target_with_another_vector_size_is_refused(source: Source, pg_url: str) -> None:
    database = PostgresDatabase(pg_url, pool_size=2)
    try:
        SqlMemoryStore(database, 8).migrate()
    finally:
        database.close()
    with pytest.raises(MigrationError, match="holds 8-dimensional vectors and the source's 384"):
        migration.migrate(source.path, pg_url, verify_queries=0)


def test_a_bank_name_taken_in_the_target_is_refused(source: Source, pg_url: str) -> None:
    database = PostgresDatabase(pg_url, pool_size=2)
    try:
        store = SqlMemoryStore(database)
        store.migrate()
        store.save_bank(Bank(tenant="acme", bank_id="cooking", ref=str(uuid.uuid4())))
    finally:
        database.close()
    with pytest.raises(MigrationError, match=r"other banks named acme/cooking"):
        migration.migrate(source.path, pg_url, verify_queries=0)
    with _pg(pg_url) as pg:
        assert _count(pg, "memory_units") == 0  # refused before anything was written


def test_source_locations(tmp_path: Path, source: Source, monkeypatch: pytest.MonkeyPatch) -> None:
    assert migration.sqlite_source_path(source.path) == source.path
    assert migration.sqlite_source_path(f"sqlite:///{source.path}") == source.path  # //// form
    assert migration.sqlite_source_path(f"sqlite://{source.path}") == source.path
    monkeypatch.chdir(source.path.parent)
    assert migration.sqlite_source_path("sqlite:///heed.db") == Path("heed.db")
    with pytest.raises(MigrationError, match="does not exist"):
        migration.sqlite_source_path(tmp_path / "nope.db")
    not_heed = tmp_path / "other.db"
    sqlite3.connect(not_heed).execute("CREATE TABLE x (y)").connection.commit()
    with pytest.raises(MigrationError, match="not a heed database"):
        migration.migrate(not_heed, "postgresql://127.0.0.1:1/x")


# -- 4. the command ---------------------------------------------------------------------------


def test_cli_help_describes_the_command() -> None:
    result = CliRunner().invoke(main, ["migrate", "--help"])
    assert result.exit_code == 0, result.output
    for words in [
        "Copy a heed SQLite database into PostgreSQL",
        "--from",
        "--to",
        "--batch-size",
        "--verify-only",
        "--verify-queries",
    ]:
        assert words in result.output
    assert "migrate" in CliRunner().invoke(main, ["--help"]).output
    # heed.cli's ``migrate`` is the command; the module is imported by name.
    cli_migrate = importlib.import_module("heed.cli.migrate")
    assert cli_migrate.DEFAULT_BATCH_SIZE == migration.DEFAULT_BATCH_SIZE
    assert cli_migrate.DEFAULT_VERIFY_QUERIES == migration.DEFAULT_VERIFY_QUERIES


def test_cli_names_a_missing_source_file(tmp_path: Path) -> None:
    missing = tmp_path / "gone" / "heed.db"
    result = CliRunner().invoke(
        main, ["migrate", "--from", str(missing), "--to", "postgresql://127.0.0.1:1/x"]
    )
    assert result.exit_code == 1
    assert f"source database {missing} does not exist" in result.output
    assert "Traceback" not in result.output and result.exception is not None
    assert isinstance(result.exception, SystemExit)


def test_cli_names_an_unreachable_target(source: Source) -> None:
    unreachable = "postgresql://127.0.0.1:1/heed"
    result = CliRunner().invoke(
        main,
        ["migrate", "--from", str(source.path), "--to", unreachable, "--connect-timeout", "1"],
    )
    assert result.exit_code == 1
    assert "cannot reach the target PostgreSQL postgresql://127.0.0.1:1/heed" in result.output
    assert isinstance(result.exception, SystemExit)


def test_cli_names_a_target_without_pgvector(source: Source, pg_url: str) -> None:
    hidden = pg_url.replace("%2Cpublic", "")  # the schema alone: pgvector's type out of sight
    assert hidden != pg_url
    result = CliRunner().invoke(main, ["migrate", "--from", str(source.path), "--to", hidden])
    assert result.exit_code == 1
    assert "pgvector is installed in the target" in result.output


def test_cli_migrates_and_prints_the_summary(source: Source, pg_url: str) -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["migrate", "--from", f"sqlite:///{source.path}", "--to", pg_url])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert f"migrated {source.path} -> " in out
    assert "memory_units" in out and "left out: 1 unfinished runs" in out
    assert "webhook_deliveries" in out and "left out: 1 bank archives expired" in out
    assert "counts: all" in out and "recall: top-1 agreement 1.000" in out
    assert "copy" in result.stderr  # the progress bar
    result = runner.invoke(
        main, ["migrate", "--from", str(source.path), "--to", pg_url, "--verify-only"]
    )
    assert result.exit_code == 0, result.output
    assert "counts: all" in result.stdout and "migrated" not in result.stdout
    # JSON, and a second run through the CLI copies nothing.
    result = runner.invoke(
        main,
        ["migrate", "--from", str(source.path), "--to", pg_url, "--json", "--verify-queries", "0"],
    )
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["total_copied"] == 0 and body["left_out"]["runs"] == 1
    assert body["verification"]["ok"] is True


def test_cli_fails_when_verification_fails(source: Source, pg_url: str) -> None:
    runner = CliRunner()
    assert (
        runner.invoke(
            main, ["migrate", "--from", str(source.path), "--to", pg_url, "--verify-queries", "0"]
        ).exit_code
        == 0
    )
    with _pg(pg_url) as pg:
        pg.execute("DELETE FROM sessions")
    args = ["migrate", "--from", str(source.path), "--to", pg_url, "--verify-queries", "0"]
    result = runner.invoke(main, [*args, "--verify-only"])
    assert result.exit_code == 1
    assert "verification failed: sessions (all): 1 in the source, 0 in the target" in result.output


def test_cli_defaults_come_from_the_settings(source: Source, pg_url: str) -> None:
    runner = CliRunner()
    env = {"HEED_DATA_DIR": str(source.path.parent), "HEED_DATABASE_URL": None}
    result = runner.invoke(main, ["migrate"], env=env)
    assert result.exit_code == 2  # a usage error: no target anywhere
    assert "--to postgresql://... or set HEED_DATABASE_URL" in result.output
    # Nothing there yet: --verify-only says so instead of comparing against nothing.
    env["HEED_DATABASE_URL"] = pg_url
    result = runner.invoke(main, ["migrate", "--verify-only"], env=env)
    assert result.exit_code == 1
    assert "the target has no heed schema" in result.output
    result = runner.invoke(main, ["migrate", "--verify-queries", "0"], env=env)
    assert result.exit_code == 0, result.output
    assert f"migrated {source.path} -> " in result.stdout
