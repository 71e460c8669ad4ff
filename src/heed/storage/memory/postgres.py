"""The memory store's PostgreSQL part: pgvector, the ``keywords`` column, seq blocks.

Vectors are ``vector(dim)`` searched in the database through an HNSW index
(``vector_cosine_ops``): no process loads a bank into memory, so every process sees every
committed write at once. A bank is a filter on a table shared by all banks; HNSW applies a
filter after walking the graph, so a plain index scan could return fewer than *k* rows of a
small bank. Each search therefore sets, for its own transaction,
``hnsw.iterative_scan = relaxed_order`` (pgvector 0.8: keep walking until *k* rows pass the
filter) and ``hnsw.ef_search = max(40, 2k)``; rows come back nearly in order and are sorted
here. When a bank is a small part of the table the planner reads it through the
``(bank_ref, seq)`` index and sorts exactly instead.

Keywords: a unit's ``keywords`` tsvector is written with its row, and searched by
:mod:`heed.storage.memory.pg_keywords`.

Seqs: ``memory_units.seq`` comes from the column's identity sequence, which steps by
:data:`~heed.storage.memory.schema.SEQ_BLOCK`; a document takes one value per block of
units it writes and numbers its units from there. A document's units are therefore
consecutive even while other processes write, as recall's neighbour expansion
(``seq - 1``, ``seq + 1`` in the same document) expects.

Lists go as one array parameter; bulk inserts as one ``unnest`` statement. Every recall
statement runs through :meth:`PostgresDatabase.cancellable`.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import psycopg

from heed.memory.store import VectorRows
from heed.storage.memory.dialect import Column
from heed.storage.memory.pg_keywords import KeywordSearch
from heed.storage.memory.rows import UNIT_WRITE_COLUMNS
from heed.storage.memory.schema import SEQ_BLOCK
from heed.storage.postgres import PostgresDatabase, Statements

if TYPE_CHECKING:
    from heed.storage.transfer.pg_parallel import ParallelUnitWrites

__all__ = [
    "INSERT_UNITS",
    "PGVECTOR_MIN",
    "UNIT_VALUES",
    "PostgresMemory",
    "SchemaMismatch",
    "vector_literal",
]

#: The ``hnsw.ef_search`` floor and pgvector's ceiling.
EF_SEARCH_MIN: Final = 40
EF_SEARCH_MAX: Final = 1000
#: The oldest pgvector with ``hnsw.iterative_scan``.
PGVECTOR_MIN: Final = (0, 8, 0)

#: ``INSERT INTO memory_units`` up to its rows, each a :data:`UNIT_VALUES`.
INSERT_UNITS: Final = (
    f"INSERT INTO memory_units ({', '.join(UNIT_WRITE_COLUMNS)}, keywords) VALUES "
)
#: One unit's row: its :data:`~heed.storage.memory.rows.UNIT_WRITE_COLUMNS`, then the bank
#: token and the index text its ``keywords`` are made of.
UNIT_VALUES: Final = (
    "("
    + ",".join("?::vector" if c == "embedding" else "?" for c in UNIT_WRITE_COLUMNS)
    + ", to_tsvector('simple', ?) || to_tsvector('english', ?))"
)
_INSERT_UNITS: Final = INSERT_UNITS + UNIT_VALUES


class SchemaMismatch(RuntimeError):
    """The database's memory schema cannot serve this store (vector size, pgvector version)."""


def vector_literal(vector: Any) -> str:
    """A pgvector text literal (``'[x,y,...]'``) that round-trips float32 exactly."""
    values = np.asarray(vector, dtype=np.float32).ravel().tolist()
    return "[" + ",".join(map(repr, values)) + "]"


def _vector_from_binary(data: bytes) -> np.ndarray:
    """A float32 array from pgvector's binary form (dim, unused, big-endian float4s)."""
    (dim,) = struct.unpack_from(">H", data)
    return np.frombuffer(data, dtype=">f4", count=dim, offset=4).astype(np.float32)


def _version(text: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in text.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


class PostgresMemory:
    """A :class:`~heed.storage.memory.dialect.MemoryDialect` on PostgreSQL with pgvector."""

    searches_vectors = True
    #: An array parameter holds any number of values.
    list_max = 1 << 30
    #: A document's units per bulk insert: pgvector's HNSW insert costs about 2.7 ms a
    #: unit (``benchmarks/transfer_pg_costs.py``) and a running insert is not
    #: interrupted: a cancel waits for at most one batch (~20 ms), not 256 units (~700 ms).
    unit_batch = 8

    def __init__(self, database: PostgresDatabase, dim: int) -> None:
        self.db = database
        self.dim = dim
        self.keywords = KeywordSearch(database)
        self._parallel: ParallelUnitWrites | None = None

    def check_schema(self) -> None:
        """Raise :class:`SchemaMismatch` when the stored vectors have another size than the
        store's (the embedder changed) or pgvector is older than 0.8."""
        with self.db.read() as conn:
            row = conn.execute(
                "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
            ).fetchone()
            stored = conn.execute(
                "SELECT a.atttypmod FROM pg_attribute a"
                " WHERE a.attrelid = 'memory_units'::regclass AND a.attname = 'embedding'"
            ).fetchone()
        if row is None or _version(str(row[0])) < PGVECTOR_MIN:
            found = "not installed" if row is None else f"version {row[0]}"
            raise SchemaMismatch(
                f"pgvector is {found}; the memory store needs pgvector 0.8 or later "
                "(hnsw.iterative_scan)"
            )
        if stored is None or int(stored[0]) != self.dim:
            size = "no" if stored is None else f"{int(stored[0])}-dimensional"
            raise SchemaMismatch(
                f"memory_units.embedding holds {size} vectors but the embedder makes "
                f"{self.dim}-dimensional ones: use the embedder the banks were written "
                "with, or a new database"
            )

    def any_of(
        self, column: str, values: Sequence[Any], element_type: str
    ) -> tuple[str, tuple[Any, ...]]:
        return f"{column} = ANY(?::{element_type}[])", (list(values),)

    def any_of_many(
        self, column: str, values: Sequence[Any], element_type: str
    ) -> tuple[str, tuple[Any, ...]]:
        return self.any_of(column, values, element_type)

    def encode_vector(self, vector: Any) -> str | None:
        return None if vector is None else vector_literal(vector)

    def allocate_seqs(self, conn: Any, sizes: Sequence[int]) -> list[list[int]]:
        """Per run, its seqs: a value of the sequence per ``SEQ_BLOCK`` units, numbered
        from there (see the module docstring)."""
        blocks = [-(-n // SEQ_BLOCK) for n in sizes]
        starts: list[int] = []
        if sum(blocks):
            starts = sorted(
                int(r[0])
                for r in conn.execute(
                    "SELECT nextval(pg_get_serial_sequence('memory_units', 'seq'))"
                    " FROM generate_series(1, ?)",
                    (sum(blocks),),
                ).fetchall()
            )
        runs = []
        for n, count in zip(sizes, blocks, strict=True):
            mine, starts = starts[:count], starts[count:]
            runs.append([start + i for start in mine for i in range(SEQ_BLOCK)][:n])
        return runs

    def insert_units(
        self, conn: Any, rows: Sequence[tuple[Any, ...]], keywords: Sequence[tuple[str, str]]
    ) -> None:
        conn.executemany(
            _INSERT_UNITS, [(*row, *words) for row, words in zip(rows, keywords, strict=True)]
        )

    def add_keywords(self, conn: Any, seq: int, texts: Sequence[str]) -> None:
        conn.execute(
            "UPDATE memory_units SET keywords = keywords || to_tsvector('english', ?)"
            " WHERE seq = ?",
            ("\n".join(texts), seq),
        )

    def drop_keywords(self, conn: Any, seqs: Sequence[int]) -> None:
        """Nothing: the keywords go with the unit's row."""

    def drop_bank_keywords(self, conn: Any, bank_ref: str) -> None:
        """Nothing: the keywords go with the units' rows."""

    def insert_rows(
        self, conn: Any, table: str, columns: Sequence[Column], rows: Sequence[tuple[Any, ...]]
    ) -> int:
        if not rows:
            return 0
        arrays = ", ".join(f"?::{kind}[]" for _, kind in columns)
        cursor = conn.execute(
            f"INSERT INTO {table} ({', '.join(name for name, _ in columns)})"
            f" SELECT * FROM unnest({arrays}) ON CONFLICT DO NOTHING",
            tuple(list(column) for column in zip(*rows, strict=True)),
        )
        return max(0, int(cursor.rowcount))

    def keyword_search(
        self, bank_ref: str, terms: Sequence[str], limit: int
    ) -> list[tuple[int, float]]:
        return self.keywords.search(bank_ref, terms, limit)

    def vector_rows(
        self, conn: Statements, bank_ref: str, generation: int, since: int | None
    ) -> VectorRows:
        later = "" if since is None else " AND generation > ?"
        params = (bank_ref,) if since is None else (bank_ref, since)
        rows = conn.binary(
            "SELECT seq, embedding, fact_type FROM memory_units"
            f" WHERE bank_ref = ?{later} AND embedding IS NOT NULL ORDER BY seq",
            params,
        )
        if not rows:
            empty = np.zeros((0, 0), dtype=np.float32)
            return VectorRows(np.zeros(0, dtype=np.int64), empty, [], generation)
        matrix = np.stack([_vector_from_binary(r[1]) for r in rows])
        return VectorRows(
            np.asarray([int(r[0]) for r in rows], dtype=np.int64),
            matrix,
            [str(r[2]) for r in rows],
            generation,
        )

    def vector_search(
        self, bank_ref: str, query: np.ndarray, k: int, types: Sequence[str] | None
    ) -> list[tuple[int, float]]:
        """The *k* nearest units by cosine through the HNSW index (see the module docstring)."""
        ef_search = min(EF_SEARCH_MAX, max(EF_SEARCH_MIN, 2 * k))
        where = "bank_ref = ? AND embedding IS NOT NULL"
        params: list[Any] = [vector_literal(query), bank_ref]
        if types is not None:
            where += " AND fact_type = ANY(?::text[])"
            params.append(list(types))
        with self.db.cancellable(transaction=True) as q:
            q.execute(
                "SELECT set_config('hnsw.ef_search', ?, true),"
                " set_config('hnsw.iterative_scan', 'relaxed_order', true)",
                (str(ef_search),),
            )
            rows = q.execute(
                f"SELECT seq, embedding <=> ?::vector AS distance FROM memory_units"
                f" WHERE {where} ORDER BY distance LIMIT ?",
                (*params, k),
            ).fetchall()
        hits = []
        for seq, distance in rows:
            score = 1.0 - float(distance)
            hits.append((int(seq), 0.0 if math.isnan(score) else score))
        hits.sort(key=lambda hit: (-hit[1], -hit[0]))  # relaxed order: nearly sorted
        return hits

    def unit_vectors(self, bank_ref: str, seqs: Sequence[int]) -> dict[int, np.ndarray]:
        with self.db.cancellable() as q:
            rows = q.binary(
                "SELECT seq, embedding FROM memory_units WHERE bank_ref = ?"
                " AND seq = ANY(?::bigint[]) AND embedding IS NOT NULL",
                (bank_ref, [int(s) for s in seqs]),
            )
        return {int(r[0]): _vector_from_binary(r[1]) for r in rows}

    # -- bank transfer ---------------------------------------------------------------------

    #: The index keeps a ``tsvector``, no text: a transfer rebuilds it.
    unit_index_text = "NULL AS index_text"

    @contextmanager
    def read_snapshot(self) -> Iterator[Any]:
        """A ``REPEATABLE READ READ ONLY`` transaction whose statements a cancel stops."""
        with self.db.cancellable(transaction=True) as statements:
            statements.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY", ())
            yield statements

    def snapshot_vectors(self, conn: Any, sql: str, params: Sequence[Any]) -> dict[int, np.ndarray]:
        """In pgvector's binary form: no text to parse."""
        return {int(r[0]): _vector_from_binary(r[1]) for r in conn.binary(sql, params)}

    def parallel_unit_writes(self) -> ParallelUnitWrites:
        if self._parallel is None:
            # Imported here: the module builds its statements from this one's.
            from heed.storage.transfer.pg_parallel import ParallelUnitWrites

            self._parallel = ParallelUnitWrites(self.db)
        return self._parallel

    def is_unique_violation(self, exc: Exception) -> bool:
        return isinstance(exc, psycopg.errors.UniqueViolation)
