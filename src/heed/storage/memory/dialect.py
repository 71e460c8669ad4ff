"""What the memory store asks of each database: the part that really differs.

:class:`heed.storage.memory.store.SqlMemoryStore` writes every other statement once. Each
database implements :class:`MemoryDialect`:

- SQLite (:mod:`heed.storage.memory.sqlite`): the FTS5 keyword index and ``bm25()``, seqs
  as rowids, vectors as float32 blobs loaded into the process's index, lists as ``IN``
  (a long one as a JSON array).
- PostgreSQL (:mod:`heed.storage.memory.postgres`): the ``tsvector`` keyword column and
  BM25 in SQL with its pruning, vectors searched by pgvector's HNSW index, seqs in blocks of
  the identity sequence, lists as array parameters; a bank transfer's memories written on
  several connections at once (:mod:`heed.storage.transfer.pg_parallel`).

Statement cancellation is the database's own
(:meth:`heed.storage.database.SqlDatabase.cancellable`).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from heed.memory.store import VectorRows

if TYPE_CHECKING:
    from heed.storage.database import SqlDatabase
    from heed.storage.transfer.pg_parallel import ParallelUnitWrites

__all__ = ["Column", "MemoryDialect", "memory_dialect"]

#: A column written in bulk: its name and its PostgreSQL array element type.
Column = tuple[str, str]


class MemoryDialect(Protocol):
    """One database's part of the memory store (see the module docstring)."""

    #: Whether :meth:`vector_search` searches in the database (else the engine keeps an
    #: in-process index loaded by :meth:`vector_rows`).
    searches_vectors: bool
    #: Values at most in one :meth:`any_of` list (SQLite's parameter limit).
    list_max: int
    #: A document's units inserted per bulk insert; the token is checked between batches,
    #: so a cancel waits for at most one batch's insert.
    unit_batch: int
    #: SQL of a unit's keyword text in a ``SELECT ... FROM memory_units``, named
    #: ``index_text`` (``NULL`` where the index keeps no text: PostgreSQL's ``tsvector``).
    unit_index_text: str

    def check_schema(self) -> None:
        """After the migrations: refuse a database this store cannot serve."""
        ...

    def any_of(
        self, column: str, values: Sequence[Any], element_type: str
    ) -> tuple[str, tuple[Any, ...]]:
        """SQL matching *column* against any of *values* (at most :attr:`list_max`; of the
        PostgreSQL type *element_type*), and its parameters."""
        ...

    def any_of_many(
        self, column: str, values: Sequence[Any], element_type: str
    ) -> tuple[str, tuple[Any, ...]]:
        """As :meth:`any_of`, for a list of any length, as one parameter (SQLite: a JSON
        array read by ``json_each``; PostgreSQL: the array)."""
        ...

    def encode_vector(self, vector: Any) -> Any:
        """A unit's float32 vector as its ``embedding`` parameter (``None`` stays ``None``)."""
        ...

    def allocate_seqs(self, conn: Any, sizes: Sequence[int]) -> list[list[int]]:
        """New unit seqs for runs of units (a document's, in order) of *sizes*, in the write
        transaction: each run's consecutive, the runs' ascending; one statement."""
        ...

    def insert_units(
        self, conn: Any, rows: Sequence[tuple[Any, ...]], keywords: Sequence[tuple[str, str]]
    ) -> None:
        """Insert unit *rows* (:data:`~heed.storage.memory.rows.UNIT_WRITE_COLUMNS`, the
        embedding encoded) and index each one's ``(bank token, index text)`` for keywords."""
        ...

    def add_keywords(self, conn: Any, seq: int, texts: Sequence[str]) -> None:
        """Add *texts* (an appended document's new neighbours) to a stored unit's keyword
        index, as if they had been in its index text from the start."""
        ...

    def drop_keywords(self, conn: Any, seqs: Sequence[int]) -> None:
        """Remove what the keyword index holds of the deleted units *seqs*."""
        ...

    def drop_bank_keywords(self, conn: Any, bank_ref: str) -> None:
        """Remove what the keyword index holds of the bank's units (before they go)."""
        ...

    def insert_rows(
        self, conn: Any, table: str, columns: Sequence[Column], rows: Sequence[tuple[Any, ...]]
    ) -> int:
        """Insert *rows* into *table* in bulk, a row already there skipped; the token is
        checked between batches. Returns how many rows were new."""
        ...

    def keyword_search(
        self, bank_ref: str, terms: Sequence[str], limit: int
    ) -> list[tuple[int, float]]:
        """BM25 over the bank's units matching any of *terms* (none empty, none holding NUL;
        *limit* > 0), best first, as (seq, score > 0)."""
        ...

    def vector_rows(
        self, conn: Any, bank_ref: str, generation: int, since: int | None
    ) -> VectorRows:
        """The bank's vectors in seq order (of the units written after generation *since*
        when given), read on *conn*, labelled *generation*."""
        ...

    def vector_search(
        self, bank_ref: str, query: np.ndarray, k: int, types: Sequence[str] | None
    ) -> list[tuple[int, float]]:
        """See :meth:`heed.memory.store.VectorSearchingStore.vector_search`."""
        ...

    def unit_vectors(self, bank_ref: str, seqs: Sequence[int]) -> dict[int, np.ndarray]:
        """See :meth:`heed.memory.store.VectorSearchingStore.unit_vectors`."""
        ...

    # -- bank transfer (heed.storage.transfer) ---------------------------------------------

    def read_snapshot(self) -> AbstractContextManager[Any]:
        """A cancellable read connection inside one read-only snapshot: writes committed
        after it opened are not seen."""
        ...

    def snapshot_vectors(self, conn: Any, sql: str, params: Sequence[Any]) -> dict[int, np.ndarray]:
        """The ``(seq, embedding)`` rows *sql* selects, read on *conn* (a
        :meth:`read_snapshot`'s), as float32 vectors by seq."""
        ...

    def parallel_unit_writes(self) -> ParallelUnitWrites | None:
        """How a transfer writes a batch of memories on several connections at once
        (PostgreSQL: :mod:`heed.storage.transfer.pg_parallel`), or ``None``: a few a
        transaction, one after the other (SQLite, whose one writer a cancel waits for)."""
        ...

    def is_unique_violation(self, exc: Exception) -> bool:
        """Whether *exc* is the database refusing a duplicate key."""
        ...


def memory_dialect(database: SqlDatabase, dim: int) -> MemoryDialect:
    """The memory store's part for *database* (psycopg loads only for PostgreSQL)."""
    if database.dialect == "sqlite":
        from heed.storage.memory.sqlite import SqliteMemory
        from heed.storage.sqlite import SqliteDatabase

        assert isinstance(database, SqliteDatabase)
        return SqliteMemory(database)
    from heed.storage.memory.postgres import PostgresMemory
    from heed.storage.postgres import PostgresDatabase

    assert isinstance(database, PostgresDatabase)
    return PostgresMemory(database, dim)
