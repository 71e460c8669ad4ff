"""Where a bank import's memory writes spend their time on PostgreSQL (pgvector).

heed's store alone (no server), on a PostgreSQL with pgvector (``_cluster.postgres``): a bank
of ``--base`` memories is written first, then documents of ``--units`` memories are written
as an import writes them (:meth:`TransferRows.write_document_rows`, batches of 32: the
import's), each variant on a fresh document, the variants alternated ``--rounds`` times
(medians reported):

- ``as_shipped``: :data:`~heed.storage.transfer.pg_parallel.PG_WRITERS` connections at once;
- ``one_connection``: the same on one connection;
- ``one_connection_no_hnsw``: on one connection, the HNSW index (``memory_units_embedding``)
  dropped;
- ``one_connection_no_hnsw_no_gin``: the keyword GIN index (``memory_units_keywords``)
  dropped too.

The indexes are dropped after the other variants ran (the database is thrown away), so the
differences are what each index's maintenance costs a memory; what is left with neither is
the rest of the write (statements, commits, the other b-tree indexes, the row itself, the
Python side). Also timed: a vector's encoding in Python, as pgvector's text literal (what
the import sent before) and as its binary form (what it sends). The vectors are random unit
vectors of the default embedder's size, the texts ``transfer_cancel.py``'s dialogue turns.
Writes ``benchmarks/results/transfer_pg_costs.json``.
"""

from __future__ import annotations

import argparse
import statistics
import time
import timeit
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import psycopg

from _cluster import postgres
from _server import write_result
from _synthetic import DIM, NOW, turn
from heed.memory.models import Bank
from heed.storage.memory import SqlMemoryStore
from heed.storage.memory.postgres import vector_literal
from heed.storage.postgres import PostgresDatabase
from heed.storage.transfer import pg_parallel as transfer_rows
from heed.transfer.rows import DocumentRow, UnitRow

BATCH = 32  # the import's batch (heed.transfer.work.IMPORT_BATCH)


def _units(rng: np.random.Generator, document_id: str, n: int) -> list[UnitRow]:
    vectors = rng.standard_normal((n, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return [turn(i, document_id, None, vectors[i]) for i in range(n)]


def _write(
    store: SqlMemoryStore, bank: Bank, rng: np.random.Generator, n: int, writers: int
) -> float:
    """Seconds to write a document of *n* memories on *writers* connections."""
    document_id = f"doc-{uuid.uuid4().hex[:8]}"
    units = _units(rng, document_id, n)
    document = DocumentRow(document_id, "text", None, {}, [], NOW, NOW, n, [])
    shipped = transfer_rows.PG_WRITERS
    transfer_rows.PG_WRITERS = writers  # type: ignore[misc]
    try:
        started = time.perf_counter()
        store.write_document_rows(
            bank.ref, document, [units[i : i + BATCH] for i in range(0, n, BATCH)]
        )
        return time.perf_counter() - started
    finally:
        transfer_rows.PG_WRITERS = shipped  # type: ignore[misc]


def _figures(n: int, seconds: list[float]) -> dict[str, Any]:
    median = statistics.median(seconds)
    return {
        "units_per_second": round(n / median, 1),
        "ms_per_unit": round(1000 * median / n, 3),
        "units_per_second_each_round": [round(n / s, 1) for s in seconds],
    }


def _encoding() -> dict[str, float]:
    vector = np.random.default_rng(3).standard_normal(DIM).astype(np.float32)
    number = 2000
    text = timeit.timeit(lambda: vector_literal(vector), number=number) / number
    binary = timeit.timeit(lambda: transfer_rows.pg_vector(vector), number=number) / number
    return {"text_literal_us": round(text * 1e6, 1), "binary_us": round(binary * 1e6, 2)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(11)
    out: dict[str, Any] = {
        "base_units": args.base,
        "units_per_document": args.units,
        "rounds": args.rounds,
        "shipped_writers": transfer_rows.PG_WRITERS,
        "vector_encoding": _encoding(),
    }
    with postgres() as url:
        db = PostgresDatabase(url)
        try:
            store = SqlMemoryStore(db, DIM)
            store.migrate()
            bank = store.save_bank(Bank(tenant="t", bank_id="b", ref=str(uuid.uuid4()), name="b"))
            print(f"a bank of {args.base} memories")
            base = _write(store, bank, rng, args.base, transfer_rows.PG_WRITERS)
            out["base_units_per_second"] = round(args.base / base, 1)
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("VACUUM ANALYZE")
            variants: dict[str, Callable[[], float]] = {
                "as_shipped": lambda: _write(
                    store, bank, rng, args.units, transfer_rows.PG_WRITERS
                ),
                "one_connection": lambda: _write(store, bank, rng, args.units, 1),
            }
            times: dict[str, list[float]] = {name: [] for name in variants}
            for _ in range(args.rounds):
                for name, variant in variants.items():
                    times[name].append(variant())
            for index, name in (
                ("memory_units_embedding", "one_connection_no_hnsw"),
                ("memory_units_keywords", "one_connection_no_hnsw_no_gin"),
            ):
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute(f"DROP INDEX {index}")
                times[name] = [_write(store, bank, rng, args.units, 1) for _ in range(args.rounds)]
        finally:
            db.close()
    out["variants"] = {name: _figures(args.units, seconds) for name, seconds in times.items()}
    per_unit = {name: figures["ms_per_unit"] for name, figures in out["variants"].items()}
    whole = per_unit["one_connection"]
    hnsw = whole - per_unit["one_connection_no_hnsw"]
    gin = per_unit["one_connection_no_hnsw"] - per_unit["one_connection_no_hnsw_no_gin"]
    out["one_connection_ms_per_unit"] = {
        "total": whole,
        "hnsw_index": round(hnsw, 3),
        "gin_keyword_index": round(gin, 3),
        "rest": per_unit["one_connection_no_hnsw_no_gin"],
        "hnsw_share": round(hnsw / whole, 3),
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", type=int, default=20_000, help="memories in the bank first")
    parser.add_argument("--units", type=int, default=2_000, help="memories a variant writes")
    parser.add_argument("--rounds", type=int, default=3, help="times each variant runs")
    parser.add_argument("--name", default="transfer_pg_costs", help="results file name")
    args = parser.parse_args()
    result = run(args)
    for name, figures in result["variants"].items():
        print(f"{name:32s} {figures['units_per_second']:8.1f} units/s")
    print(result["one_connection_ms_per_unit"], result["vector_encoding"])
    print(f"wrote {write_result(args.name, result)}")


if __name__ == "__main__":
    main()
