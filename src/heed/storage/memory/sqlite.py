"""The memory store's SQLite part: FTS5 keywords, rowid seqs, vectors as float32 blobs.

The keyword index is the FTS5 table ``memory_fts`` (``porter unicode61``): its rowid is the
unit's seq, its ``bank`` column one token per bank (so a query reads only its own bank's
postings), its ``body`` the unit's index text; ``bm25()`` scores it (the ``bank`` column
weighs nothing). Vectors are float32 blobs, loaded into each process's index
(:mod:`heed.memory.recall.vectors`), which catches up with other processes' writes by the bank's
generation. One writer at a time (the file's lock), so seqs are the rowids SQLite would
give, and lists are plain ``IN`` lists.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final

import numpy as np

from heed.memory.retain.units import with_neighbours
from heed.memory.store import VectorRows
from heed.runtime import raise_if_cancelled
from heed.storage.memory.dialect import Column
from heed.storage.memory.rows import UNIT_WRITE_COLUMNS, bank_token
from heed.storage.memory.writes import WRITE_BATCH
from heed.storage.sqlite import SqliteDatabase

__all__ = ["INDEX_TEXT_OF_UNIT", "SqliteMemory"]

#: Rows per bulk insert of memberships and links; the token is checked between them.
BULK_BATCH: Final = 1024

_INSERT_UNITS: Final = (
    f"INSERT INTO memory_units ({', '.join(UNIT_WRITE_COLUMNS)})"
    f" VALUES ({','.join('?' * len(UNIT_WRITE_COLUMNS))})"
)


#: The index text of unit ``u`` (its FTS5 body), in a ``SELECT ... FROM memory_units u``.
INDEX_TEXT_OF_UNIT: Final = "(SELECT f.body FROM memory_fts f WHERE f.rowid = u.seq)"
#: The same, in a ``SELECT ... FROM memory_units``.
_INDEX_TEXT_OF_UNITS: Final = INDEX_TEXT_OF_UNIT.replace("u.seq", "memory_units.seq")


def _fts_quote(term: str) -> str:
    return '"' + term.replace('"', '""') + '"'


class SqliteMemory:
    """A :class:`~heed.storage.memory.dialect.MemoryDialect` on SQLite."""

    searches_vectors = False
    #: Old SQLite builds allow 999 parameters in a statement.
    list_max = 500
    #: A document's units per bulk insert.
    unit_batch = WRITE_BATCH

    def __init__(self, database: SqliteDatabase) -> None:
        self.db = database

    def check_schema(self) -> None:
        """Nothing to check: a blob holds a vector of any size."""

    def any_of(
        self, column: str, values: Sequence[Any], element_type: str
    ) -> tuple[str, tuple[Any, ...]]:
        return f"{column} IN ({','.join('?' * len(values))})", tuple(values)

    def any_of_many(
        self, column: str, values: Sequence[Any], element_type: str
    ) -> tuple[str, tuple[Any, ...]]:
        return f"{column} IN (SELECT value FROM json_each(?))", (json.dumps(list(values)),)

    def encode_vector(self, vector: Any) -> bytes | None:
        return None if vector is None else np.asarray(vector, dtype=np.float32).tobytes()

    def allocate_seqs(self, conn: Any, sizes: Sequence[int]) -> list[list[int]]:
        """The rowids SQLite would give (the largest plus one on), known before the insert."""
        if not any(sizes):
            return [[] for _ in sizes]
        after = int(conn.execute("SELECT COALESCE(MAX(seq), 0) FROM memory_units").fetchone()[0])
        runs = []
        for n in sizes:
            runs.append(list(range(after + 1, after + 1 + n)))
            after += n
        return runs

    def insert_units(
        self, conn: Any, rows: Sequence[tuple[Any, ...]], keywords: Sequence[tuple[str, str]]
    ) -> None:
        conn.executemany(_INSERT_UNITS, rows)
        conn.executemany(
            "INSERT INTO memory_fts (rowid, bank, body) VALUES (?,?,?)",
            [(row[0], token, text) for row, (token, text) in zip(rows, keywords, strict=True)],
        )

    def add_keywords(self, conn: Any, seq: int, texts: Sequence[str]) -> None:
        body = conn.execute("SELECT body FROM memory_fts WHERE rowid = ?", (seq,)).fetchone()
        if body is not None:
            conn.execute(
                "UPDATE memory_fts SET body = ? WHERE rowid = ?",
                (with_neighbours(body[0], texts), seq),
            )

    def drop_keywords(self, conn: Any, seqs: Sequence[int]) -> None:
        for start in range(0, len(seqs), self.list_max):
            match, params = self.any_of("rowid", seqs[start : start + self.list_max], "bigint")
            conn.execute(f"DELETE FROM memory_fts WHERE {match}", params)

    def drop_bank_keywords(self, conn: Any, bank_ref: str) -> None:
        conn.execute(
            "DELETE FROM memory_fts WHERE rowid IN"
            " (SELECT seq FROM memory_units WHERE bank_ref = ?)",
            (bank_ref,),
        )

    def insert_rows(
        self, conn: Any, table: str, columns: Sequence[Column], rows: Sequence[tuple[Any, ...]]
    ) -> int:
        sql = (
            f"INSERT INTO {table} ({', '.join(name for name, _ in columns)})"
            f" VALUES ({','.join('?' * len(columns))}) ON CONFLICT DO NOTHING"
        )
        inserted = 0
        for start in range(0, len(rows), BULK_BATCH):
            raise_if_cancelled()
            inserted += max(0, conn.executemany(sql, rows[start : start + BULK_BATCH]).rowcount)
        return inserted

    def keyword_search(
        self, bank_ref: str, terms: Sequence[str], limit: int
    ) -> list[tuple[int, float]]:
        """FTS5's ``bm25()`` (negated: higher is better), ties the newer unit first."""
        match = f"bank : {bank_token(bank_ref)} AND ({' OR '.join(_fts_quote(t) for t in terms)})"
        with self.db.cancellable() as conn:
            rows = conn.execute(
                "SELECT rowid, bm25(memory_fts, 0.0, 1.0) AS score FROM memory_fts"
                " WHERE memory_fts MATCH ? ORDER BY score, rowid DESC LIMIT ?",
                (match, limit),
            ).fetchall()
        return [(int(r[0]), -float(r[1])) for r in rows]

    def vector_rows(
        self, conn: Any, bank_ref: str, generation: int, since: int | None
    ) -> VectorRows:
        seqs: list[int] = []
        blobs: list[bytes] = []
        types: list[str] = []
        later = "" if since is None else " AND generation > ?"
        params = (bank_ref,) if since is None else (bank_ref, since)
        for seq, blob, fact_type in conn.execute(
            "SELECT seq, embedding, fact_type FROM memory_units"
            f" WHERE bank_ref = ?{later} AND embedding IS NOT NULL ORDER BY seq",
            params,
        ):
            seqs.append(int(seq))
            blobs.append(blob)
            types.append(str(fact_type))
        if not blobs:
            empty = np.zeros((0, 0), dtype=np.float32)
            return VectorRows(np.zeros(0, dtype=np.int64), empty, [], generation)
        matrix = np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(len(blobs), -1)
        return VectorRows(np.asarray(seqs, dtype=np.int64), matrix.copy(), types, generation)

    def vector_search(
        self, bank_ref: str, query: np.ndarray, k: int, types: Sequence[str] | None
    ) -> list[tuple[int, float]]:
        """Exact, over every vector of the bank read from the file: correct, but what
        recall uses on SQLite is the process's index (``searches_vectors`` is false)."""
        with self.db.cancellable() as conn:
            rows = self.vector_rows(conn, bank_ref, 0, None)
        if k <= 0 or not len(rows.seqs):
            return []
        scores = rows.matrix @ np.asarray(query, dtype=np.float32).ravel()
        allowed = None if types is None else set(types)
        ranked = sorted(
            (
                (int(seq), float(score))
                for seq, score, fact_type in zip(rows.seqs, scores, rows.types, strict=True)
                if allowed is None or fact_type in allowed
            ),
            key=lambda hit: (-hit[1], -hit[0]),
        )
        return ranked[:k]

    def unit_vectors(self, bank_ref: str, seqs: Sequence[int]) -> dict[int, np.ndarray]:
        out: dict[int, np.ndarray] = {}
        with self.db.cancellable() as conn:
            for start in range(0, len(seqs), self.list_max):
                match, params = self.any_of("seq", seqs[start : start + self.list_max], "bigint")
                for seq, blob in conn.execute(
                    "SELECT seq, embedding FROM memory_units WHERE bank_ref = ?"
                    f" AND {match} AND embedding IS NOT NULL",
                    (bank_ref, *params),
                ):
                    out[int(seq)] = np.frombuffer(blob, dtype=np.float32).copy()
        return out

    # -- bank transfer ---------------------------------------------------------------------

    unit_index_text = f"{_INDEX_TEXT_OF_UNITS} AS index_text"

    @contextmanager
    def read_snapshot(self) -> Iterator[Any]:
        """A deferred read transaction (WAL: writers go on, the reader keeps seeing what
        was committed before its first read)."""
        with self.db.cancellable() as conn:
            conn.execute("BEGIN")  # deferred: the first read fixes the snapshot
            try:
                yield conn
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")  # read only: nothing to keep

    def snapshot_vectors(self, conn: Any, sql: str, params: Sequence[Any]) -> dict[int, np.ndarray]:
        return {
            int(r[0]): np.frombuffer(r[1], dtype=np.float32).copy()
            for r in conn.execute(sql, params).fetchall()
        }

    def parallel_unit_writes(self) -> None:
        return None  # SQLite has one writer

    def is_unique_violation(self, exc: Exception) -> bool:
        return isinstance(exc, sqlite3.IntegrityError)
