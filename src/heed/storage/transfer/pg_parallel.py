"""PostgreSQL's part of a bank transfer's writes: memories written on several connections
at once, vectors sent in pgvector's binary form.

Nearly all of a memory's write on PostgreSQL is pgvector's HNSW insert, CPU in the server
(``benchmarks/transfer_pg_costs.py``, a bank of 20,000: 2.7 ms of a memory's 2.8 ms on one
connection; the GIN keyword index costs too little to measure), which one statement does
row after row in one server process. So :class:`ParallelUnitWrites` splits a batch among
:data:`PG_WRITERS` connections at once, each part one transaction of at most
:data:`PG_UNITS_PER_TRANSACTION` holding the bank's lock *shared* (a delete, which takes it
whole, waits for the parts or they find the bank gone). Each part runs in
:meth:`PostgresDatabase.cancellable`: a cancel stops its running statement (a few ms: the
row being inserted), so a part's size does not bound a cancel's wait. Vectors go as binary
parameters (:class:`PgVector`), the rows of a part in one ``INSERT``; shared values are
stored by each part at its end, in one order (:class:`_SortedValues`: parts never wait for
each other in a cycle). The helper threads are :func:`heed.runtime.run_concurrently`'s.

:class:`heed.storage.memory.postgres.PostgresMemory` hands this out
(:meth:`~heed.storage.memory.dialect.MemoryDialect.parallel_unit_writes`) to the portable
writer (:mod:`heed.storage.transfer.writer`).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Sequence
from typing import Any, Final

import numpy as np
from psycopg.adapt import Dumper
from psycopg.pq import Format

from heed.memory.store import BankGone
from heed.runtime import raise_if_cancelled, run_concurrently
from heed.storage.memory.postgres import INSERT_UNITS, UNIT_VALUES
from heed.storage.memory.rows import bank_token
from heed.storage.memory.values import ValueWriter
from heed.storage.memory.writes import BANK_LOCK
from heed.storage.postgres import PostgresDatabase
from heed.transfer.rows import UnitRow

__all__ = ["PG_UNITS_PER_TRANSACTION", "PG_WRITERS", "ParallelUnitWrites", "PgVector"]

#: Connections a PostgreSQL write of memories uses at once, each a transaction of its own
#: part of the batch (the calling thread's and helpers'). pgvector's HNSW insert is nearly
#: all of the write's time (2.7 ms of server CPU a memory in a bank of 20,000:
#: ``benchmarks/transfer_pg_costs.py``), and one statement inserts its rows one after the
#: other in one server process, so only more connections make it faster. Two: on the
#: benchmarks' two CPUs, which the server and PostgreSQL share, more gained little.
PG_WRITERS: Final = 2
#: Memories one PostgreSQL transaction holds at most, inserted by one statement (27
#: parameters a row: PostgreSQL takes 65,535). Not a bound on a cancel's wait (a cancel
#: stops the running statement, :meth:`PostgresDatabase.cancellable`), only on what a
#: failed part throws away.
PG_UNITS_PER_TRANSACTION: Final = 256
#: The helper threads' pool (shared by every write: :func:`heed.runtime.run_concurrently`).
_POOL: Final = "heed-pg-writer"
#: Threads in it, beside each calling thread.
_HELPERS: Final = 8

#: How a unit's rows are built: (bank_ref, units, values, generation, vector encoder).
RowBuilder = Callable[
    [str, Sequence[UnitRow], ValueWriter, int, Callable[[Any], Any]], list[tuple[Any, ...]]
]


class PgVector(bytes):
    """A vector in pgvector's binary form (``dim``, an unused 0, big-endian float4s), sent
    as a binary parameter of the ``vector`` type (:func:`_vector_dumper`): the text form
    cost 180 us a vector to write in Python and as much again to parse in the server."""

    __slots__ = ()


def pg_vector(vector: Any) -> PgVector | None:
    """*vector* (float32) as a :class:`PgVector` (``None`` stays ``None``)."""
    if vector is None:
        return None
    values = np.asarray(vector, dtype=">f4").ravel()
    return PgVector(struct.pack(">HH", values.size, 0) + values.tobytes())


def _vector_dumper(oid: int) -> type[Any]:
    """A psycopg dumper sending a :class:`PgVector` as it is, in binary, as the type *oid*
    (pgvector's ``vector`` in the database: extensions have no fixed oid)."""

    class VectorDumper(Dumper):
        format = Format.BINARY

        def dump(self, obj: Any) -> bytes:
            return bytes(obj)

    VectorDumper.oid = oid
    return VectorDumper


class _SortedValues(ValueWriter):
    """A :class:`ValueWriter` storing its values in digest order: parts of one bank written
    at once on several connections then wait for each other's values (a unique key) in one
    order, never in a cycle (a deadlock)."""

    def store(self, conn: Any, bank_ref: str) -> None:
        self._bodies = dict(sorted(self._bodies.items()))
        super().store(conn, bank_ref)


class ParallelUnitWrites:
    """Writes memories on their reserved seqs in parts on several connections at once (see
    the module docstring); *rows* builds a part's ``memory_units`` rows."""

    def __init__(self, database: PostgresDatabase) -> None:
        self.db = database
        self._dumper: type[Any] | None = None

    def _vector_type(self) -> type[Any]:
        """The dumper of :class:`PgVector` for this database (its ``vector`` oid, read once)."""
        if self._dumper is None:
            with self.db.read() as conn:
                row = conn.execute("SELECT 'vector'::regtype::oid").fetchone()
            assert row is not None
            self._dumper = _vector_dumper(int(row[0]))
        return self._dumper

    def write(
        self,
        rows: RowBuilder,
        bank_ref: str,
        units: Sequence[UnitRow],
        seqs: Sequence[int],
        generation: int,
        placeholder: int | None,
    ) -> None:
        """Write *units* on their reserved *seqs* in parts, on up to :data:`PG_WRITERS`
        connections at once, each part a transaction of its own (:meth:`_part`); the part
        holding the seq *placeholder* replaces the placeholder's row. Returns once every
        part is written; the first part that failed is raised (a cancel stops each running
        part's statement: see the module docstring)."""
        dumper = self._vector_type()
        size = min(PG_UNITS_PER_TRANSACTION, -(-len(units) // PG_WRITERS))
        jobs: list[Callable[[], None]] = []
        for start in range(0, len(units), size):
            part = units[start : start + size]
            values = _SortedValues()
            built = rows(bank_ref, part, values, generation, pg_vector)
            mine = seqs[start : start + size]
            replaces = placeholder if placeholder in mine else None
            jobs.append(
                functools.partial(
                    self._part, bank_ref, part, built, mine, generation, values, replaces, dumper
                )
            )
        run_concurrently(jobs, PG_WRITERS, pool=_POOL, threads=_HELPERS)

    def _part(
        self,
        bank_ref: str,
        units: Sequence[UnitRow],
        rows: Sequence[tuple[Any, ...]],
        seqs: Sequence[int],
        generation: int,
        values: ValueWriter,
        placeholder: int | None,
        dumper: type[Any],
    ) -> None:
        """One part of :meth:`write`: a cancellable transaction holding the bank's lock
        shared (the bank's other parts write beside it; a delete, which takes it whole,
        waits for them or they find the bank gone). The bank's generation is not bumped
        here: its row lock would make the parts wait for each other (the transaction that
        reserved the seqs bumped it, and on PostgreSQL no process keeps a bank's vectors by
        generation: they are searched in the database)."""
        with self.db.cancellable(transaction=True) as statements:
            statements.execute(
                "SELECT pg_advisory_xact_lock_shared(hashtextextended(?, 0))",
                (BANK_LOCK + bank_ref,),
            )
            if (
                statements.execute("SELECT 1 FROM memory_banks WHERE ref = ?", (bank_ref,))
            ).fetchone() is None:
                raise BankGone(bank_ref)
            statements.conn.raw.adapters.register_dumper(PgVector, dumper)
            if placeholder is not None:
                statements.execute("DELETE FROM memory_units WHERE seq = ?", (placeholder,))
            token = bank_token(bank_ref)
            params: list[Any] = []
            for seq, row, unit in zip(seqs, rows, units, strict=True):
                params += (seq, *row[1:-1], generation, token, unit.index_text or unit.text)
            # One statement (a pipelined executemany, stopped by a cancel, made psycopg
            # log a warning on every cancelled part).
            statements.execute(INSERT_UNITS + ",".join([UNIT_VALUES] * len(rows)), params)
            raise_if_cancelled()
            values.store(statements.conn, bank_ref)
