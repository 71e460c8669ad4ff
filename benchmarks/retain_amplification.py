"""What a retain request writes, and how long it holds the writer (issue #28 rows 4 and 5).

Each scenario retains one request through a memory engine on a fresh SQLite file (the
storage of ``heed serve``; the embedder is a hash-based stand-in, since what is measured
is storage, not embedding) and reports:

- ``db_growth_mb``: the database file after a WAL checkpoint, minus the empty schema;
- ``retain_seconds``: the whole retain;
- ``writer_wait_ms_max``: while the retain runs, a second thread creates a session every
  10 ms on the same database (what ``POST /v1/sessions`` does); the slowest of them.

Scenarios, all within the request limits of the HTTP edge (64 tags / document tags /
metadata keys, 256 entities per item, 256-character tags):

- ``items_1000_document_tags_64``: 1,000 items, 64 document tags of 256 characters;
- ``turns_2800_metadata_64x2k``: one item of 2,800 dialogue turns (one unit each) whose
  metadata holds 64 values of 2,000 characters;
- ``turns_2800_context_100k``: the same turns with a context of 100,000 characters;
- ``sentences_2800_entities_256``: one item of 2,800 sentences with 256 given entities;
- ``sentences_2800_entities_5000``: the same with 5,000 given entities (the issue's
  reproduction, past today's edge limit: the engine's own cost).

Run with ``--out NAME`` to write ``benchmarks/results/NAME.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from _server import write_result
from heed.memory import build_memory_engine
from heed.memory.models import EntityRef, RetainItem
from heed.runtime import RequestContext, use_context
from heed.services import build_lanes
from heed.sessions.store import Session
from heed.settings import Settings
from heed.storage import SqliteDatabase
from heed.storage.memory import SqlMemoryStore
from heed.storage.session_store import SqlSessionStore

DIM = 384


class HashEmbedder:
    """Unit vectors from a hash of the text: the size of MiniLM's, none of its cost."""

    dim = DIM

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.empty((len(texts), DIM), dtype=np.float32)
        for i, text in enumerate(texts):
            seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")
            v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
            out[i] = v / np.linalg.norm(v)
        return out


def _tag(i: int) -> str:
    return f"tag-{i:04d}-" + "x" * 246


def items_1000_document_tags_64() -> tuple[list[RetainItem], list[str]]:
    items = [RetainItem(content=f"Fact number {i} about the garden.") for i in range(1000)]
    return items, [_tag(i) for i in range(64)]


def turns_2800_metadata_64x2k() -> tuple[list[RetainItem], list[str]]:
    turns = "\n".join(f"{('Ann', 'Bob')[i % 2]}: line {i} of the talk" for i in range(2800))
    metadata = {f"key{i:02d}": f"{i:02d}" + "m" * 1998 for i in range(64)}
    return [RetainItem(content=turns, metadata=metadata)], []


def turns_2800_context_100k() -> tuple[list[RetainItem], list[str]]:
    turns = "\n".join(f"{('Ann', 'Bob')[i % 2]}: line {i} of the talk" for i in range(2800))
    return [RetainItem(content=turns, context="c" * 99_985 + " words about it")], []


def _sentences(n: int) -> str:
    return " ".join(f"Sentence {i} mentions nothing in particular." for i in range(n))


def _entities(n: int) -> list[EntityRef]:
    return [EntityRef(f"Entity{i:05d} Person", "person") for i in range(n)]


def sentences_2800_entities_256() -> tuple[list[RetainItem], list[str]]:
    return [RetainItem(content=_sentences(2800), entities=_entities(256))], []


def sentences_2800_entities_5000() -> tuple[list[RetainItem], list[str]]:
    return [RetainItem(content=_sentences(2800), entities=_entities(5000))], []


SCENARIOS: dict[str, Callable[[], tuple[list[RetainItem], list[str]]]] = {
    f.__name__: f
    for f in (
        items_1000_document_tags_64,
        turns_2800_metadata_64x2k,
        turns_2800_context_100k,
        sentences_2800_entities_256,
        sentences_2800_entities_5000,
    )
}


def _size(path: Path, db: SqliteDatabase) -> int:
    with db.read() as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path.stat().st_size


def _writer(db: SqliteDatabase, stop: threading.Event, waits: list[float]) -> None:
    sessions = SqlSessionStore(db)
    while not stop.is_set():
        now = time.time()
        started = time.perf_counter()
        sessions.create(
            Session(id="ses_" + uuid.uuid4().hex[:20], tenant="b", title="", bank_id=None,
                    created_at=now, updated_at=now)
        )  # fmt: skip
        waits.append(time.perf_counter() - started)
        stop.wait(0.01)


async def scenario(name: str) -> dict[str, Any]:
    items, document_tags = SCENARIOS[name]()
    with tempfile.TemporaryDirectory(prefix="heed-amp-") as tmp:
        path = Path(tmp) / "heed.db"
        db = SqliteDatabase(path)
        settings = Settings(data_dir=Path(tmp))
        SqlSessionStore(db).migrate()
        store = SqlMemoryStore(db, DIM)
        store.migrate()
        engine = build_memory_engine(
            settings, store, build_lanes(settings), embedder=HashEmbedder()
        )
        with use_context(RequestContext()):
            bank = await engine.put_bank("amp", {})
            empty = _size(path, db)
            stop = threading.Event()
            waits: list[float] = []
            writer = threading.Thread(target=_writer, args=(db, stop, waits))
            writer.start()
            started = time.perf_counter()
            try:
                summary = await engine.retain(bank, items, document_tags)
            finally:
                seconds = time.perf_counter() - started
                stop.set()
                writer.join()
        grown = _size(path, db) - empty
        with db.read() as conn:
            rows = {
                table: int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
                for table in ("memory_units", "memory_documents", "memory_unit_entities")
            }
        db.close()
    return {
        "units": summary.units,
        "documents": summary.documents,
        "rows": rows,
        "db_growth_mb": round(grown / 1e6, 2),
        "retain_seconds": round(seconds, 2),
        "writer_wait_ms_max": round(max(waits, default=0.0) * 1000, 1),
        "writer_waits": len(waits),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    results = {}
    unknown = set(args.scenarios) - set(SCENARIOS)
    if unknown:
        raise SystemExit(f"unknown scenarios {sorted(unknown)}; choose from {list(SCENARIOS)}")
    for name in args.scenarios or list(SCENARIOS):
        results[name] = await scenario(name)
        print(name, results[name], flush=True)
    return {"scenarios": results}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", help=f"some of {list(SCENARIOS)} (all)")
    parser.add_argument("--out", help="write benchmarks/results/OUT.json")
    arguments = parser.parse_args()
    data = asyncio.run(main(arguments))
    if arguments.out:
        print(write_result(arguments.out, data))
