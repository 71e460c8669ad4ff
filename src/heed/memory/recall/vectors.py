"""The in-process vector index: one float32 matrix of unit rows per bank, exact search.

Exact search is a matrix-vector product over the bank's rows, done in blocks
with a token check between blocks (a cancelled recall stops within one
block). Measured on 2 cores: about 1 ms per 10K rows, so exact search stays
within the latency targets to roughly 100K-200K units per bank; past that an
IVF or HNSW index (or pgvector's) would replace :meth:`VectorIndex.search`.

Concurrency: appends write rows past the published count and then publish
the new count under a lock, so a reader's snapshot never sees a partial row.
Growth reallocates (amortized doubling); removals clear an ``alive`` flag
and compaction builds new arrays, leaving old snapshots intact.

Other processes: ``heed serve`` and ``heed mcp`` (or two servers) on one SQLite data
dir each hold their own index of a bank. An index remembers the bank's generation it
holds (a counter every write of units bumps in its transaction); every search first
reads the bank's generation (a primary-key read) and, when another process wrote since,
reads the units written after the index's generation and drops the units no longer
stored (:meth:`BankIndexes.current`). So a search sees every write committed before it
began, whichever process made it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

import numpy as np

from heed.memory.store import BankGone
from heed.runtime import raise_if_cancelled

if TYPE_CHECKING:
    from heed.memory.models import PreparedDocument
    from heed.memory.store import MemoryStore, VectorSearchingStore, WriteResult

__all__ = [
    "BLOCK_ROWS",
    "BankIndexes",
    "CurrentIndex",
    "StoreVectors",
    "VectorIndex",
    "VectorSearch",
]

BLOCK_ROWS = 16_384


class VectorSearch(Protocol):
    """What recall needs of a bank's vectors: the in-process :class:`VectorIndex`, or
    :class:`StoreVectors` when the store searches them itself (pgvector)."""

    def search(
        self, query: np.ndarray, k: int, types: Sequence[str] | None = None
    ) -> list[tuple[int, float]]:
        """The *k* most similar units as (seq, cosine), best first."""
        ...

    def vectors_for(self, seqs: Sequence[int]) -> dict[int, np.ndarray]:
        """The stored vectors of *seqs* (those still present)."""
        ...


class StoreVectors:
    """A bank's vectors searched where they are stored (see
    :class:`heed.memory.store.VectorSearchingStore`): nothing is loaded into this process,
    so every process sharing the database sees every committed write at once."""

    def __init__(self, store: VectorSearchingStore, bank_ref: str) -> None:
        self._store = store
        self._bank_ref = bank_ref

    def search(
        self, query: np.ndarray, k: int, types: Sequence[str] | None = None
    ) -> list[tuple[int, float]]:
        raise_if_cancelled()
        if k <= 0:
            return []
        return self._store.vector_search(self._bank_ref, query, k, types)

    def vectors_for(self, seqs: Sequence[int]) -> dict[int, np.ndarray]:
        return self._store.unit_vectors(self._bank_ref, seqs) if seqs else {}


class CurrentIndex:
    """A bank's in-process index as recall searches it: each search first catches the
    index up with other processes' writes (:meth:`BankIndexes.current`), in the worker
    thread that searches, so it costs the event loop nothing."""

    def __init__(self, indexes: BankIndexes, bank_ref: str) -> None:
        self._indexes = indexes
        self._bank_ref = bank_ref
        self._index: VectorIndex | None = None

    def search(
        self, query: np.ndarray, k: int, types: Sequence[str] | None = None
    ) -> list[tuple[int, float]]:
        self._index = self._indexes.current(self._bank_ref)
        return self._index.search(query, k, types)

    def vectors_for(self, seqs: Sequence[int]) -> dict[int, np.ndarray]:
        index = self._index or self._indexes.current(self._bank_ref)
        return index.vectors_for(seqs)


@dataclass(frozen=True, slots=True)
class _Snapshot:
    matrix: np.ndarray
    seqs: np.ndarray
    alive: np.ndarray
    types: np.ndarray
    count: int


class VectorIndex:
    """Unit vectors of one bank, searchable by cosine similarity (rows are unit length)."""

    TYPE_CODES: ClassVar[dict[str, int]] = {"world": 0, "experience": 1, "observation": 2}

    def __init__(self, dim: int, capacity: int = 1024) -> None:
        self.dim = dim
        self._lock = threading.Lock()
        self._matrix = np.zeros((capacity, dim), dtype=np.float32)
        self._seqs = np.zeros(capacity, dtype=np.int64)
        self._alive = np.zeros(capacity, dtype=bool)
        self._types = np.zeros(capacity, dtype=np.int8)
        self._count = 0
        self._dead = 0
        self._row_of: dict[int, int] = {}
        #: The bank generation whose writes the index holds (see the module docstring).
        self.generation = 0

    def __len__(self) -> int:
        return self._count - self._dead

    @property
    def nbytes(self) -> int:
        """Memory held by the index's arrays."""
        return int(
            self._matrix.nbytes + self._seqs.nbytes + self._alive.nbytes + self._types.nbytes
        )

    def _snapshot(self) -> _Snapshot:
        with self._lock:
            return _Snapshot(self._matrix, self._seqs, self._alive, self._types, self._count)

    def add(self, seqs: Sequence[int], vectors: np.ndarray, types: Sequence[str]) -> None:
        """Append rows (unit-length float32 vectors)."""
        n = len(seqs)
        if n == 0:
            return
        with self._lock:
            needed = self._count + n
            if needed > len(self._seqs):
                capacity = max(needed, 2 * len(self._seqs))
                self._grow(capacity)
            start = self._count
            self._matrix[start:needed] = vectors
            self._seqs[start:needed] = seqs
            self._types[start:needed] = [self.TYPE_CODES.get(t, 0) for t in types]
            self._alive[start:needed] = True
            for i, seq in enumerate(seqs):
                self._row_of[int(seq)] = start + i
            self._count = needed

    def _grow(self, capacity: int) -> None:
        matrix = np.zeros((capacity, self.dim), dtype=np.float32)
        seqs = np.zeros(capacity, dtype=np.int64)
        alive = np.zeros(capacity, dtype=bool)
        types = np.zeros(capacity, dtype=np.int8)
        n = self._count
        matrix[:n] = self._matrix[:n]
        seqs[:n] = self._seqs[:n]
        alive[:n] = self._alive[:n]
        types[:n] = self._types[:n]
        self._matrix, self._seqs, self._alive, self._types = matrix, seqs, alive, types

    def remove(self, seqs: Sequence[int]) -> None:
        """Forget rows; compacts when more than a quarter of the rows are dead."""
        with self._lock:
            for seq in seqs:
                row = self._row_of.pop(int(seq), None)
                if row is not None and self._alive[row]:
                    self._alive[row] = False
                    self._dead += 1
            if self._dead and self._dead * 4 > self._count:
                self._compact()

    def _compact(self) -> None:
        n = self._count
        keep = np.flatnonzero(self._alive[:n])
        capacity = max(1024, 2 * len(keep))
        matrix = np.zeros((capacity, self.dim), dtype=np.float32)
        seqs = np.zeros(capacity, dtype=np.int64)
        alive = np.zeros(capacity, dtype=bool)
        types = np.zeros(capacity, dtype=np.int8)
        matrix[: len(keep)] = self._matrix[keep]
        seqs[: len(keep)] = self._seqs[keep]
        alive[: len(keep)] = True
        types[: len(keep)] = self._types[keep]
        self._matrix, self._seqs, self._alive, self._types = matrix, seqs, alive, types
        self._count = len(keep)
        self._dead = 0
        self._row_of = {int(s): i for i, s in enumerate(seqs[: len(keep)])}

    def seqs(self) -> np.ndarray:
        """The seqs of the live rows."""
        snap = self._snapshot()
        live: np.ndarray = snap.seqs[: snap.count][snap.alive[: snap.count]]
        return live.copy()

    def vectors_for(self, seqs: Sequence[int]) -> dict[int, np.ndarray]:
        """The stored vectors of *seqs* (those still present), as copies."""
        with self._lock:
            rows = {int(s): self._row_of.get(int(s)) for s in seqs}
            matrix = self._matrix
        return {s: matrix[r].copy() for s, r in rows.items() if r is not None}

    def search(
        self, query: np.ndarray, k: int, types: Sequence[str] | None = None
    ) -> list[tuple[int, float]]:
        """The *k* most similar live rows as (seq, cosine), best first.

        Checks the active token before each block of :data:`BLOCK_ROWS` rows.
        """
        snap = self._snapshot()
        if snap.count == 0 or k <= 0:
            return []
        allowed = None
        if types is not None:
            allowed = np.array([self.TYPE_CODES.get(t, -1) for t in types], dtype=np.int8)
        best_scores: list[np.ndarray] = []
        best_rows: list[np.ndarray] = []
        q = query.astype(np.float32, copy=False)
        for start in range(0, snap.count, BLOCK_ROWS):
            raise_if_cancelled()
            end = min(snap.count, start + BLOCK_ROWS)
            scores = snap.matrix[start:end] @ q
            mask = snap.alive[start:end]
            if allowed is not None:
                mask = mask & np.isin(snap.types[start:end], allowed)
            scores = np.where(mask, scores, -np.inf)
            take = min(k, end - start)
            idx = np.argpartition(-scores, take - 1)[:take]
            best_scores.append(scores[idx])
            best_rows.append(idx + start)
        scores = np.concatenate(best_scores)
        rows = np.concatenate(best_rows)
        order = np.argsort(-scores, kind="stable")[:k]
        return [
            (int(snap.seqs[rows[i]]), float(scores[i])) for i in order if np.isfinite(scores[i])
        ]


class BankIndexes:
    """The vector indexes of all banks: loaded lazily, kept within ``max_bytes`` (LRU).

    ``get`` loads a bank's vectors from the store on first use (blocking; call it
    in the offload) under a per-bank lock; ``apply`` keeps a loaded index in step
    with a committed write (an index not loaded reads the write when it loads).
    When the loaded indexes exceed ``max_bytes``, the least recently used ones
    are dropped (never the one just used); a dropped bank reloads on next use.
    """

    def __init__(self, store: MemoryStore, dim: int, max_bytes: int = 2 << 30) -> None:
        self._store = store
        self._dim = dim
        self.max_bytes = max_bytes
        self._indexes: OrderedDict[str, VectorIndex] = OrderedDict()
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def _lock(self, bank_ref: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(bank_ref, threading.Lock())

    def _touch(self, bank_ref: str) -> VectorIndex | None:
        with self._guard:
            index = self._indexes.get(bank_ref)
            if index is not None:
                self._indexes.move_to_end(bank_ref)
            return index

    def peek(self, bank_ref: str) -> VectorIndex | None:
        """The bank's index if it is in memory, else ``None``; never blocks on a load."""
        return self._touch(bank_ref)

    def get(self, bank_ref: str) -> VectorIndex:
        """The bank's index, loading it from storage on first use (blocking)."""
        index = self._touch(bank_ref)
        if index is not None:
            return index
        with self._lock(bank_ref):
            index = self._touch(bank_ref)
            if index is None:
                rows = self._store.load_vectors(bank_ref)
                index = VectorIndex(self._dim, capacity=max(1024, len(rows.seqs)))
                index.add([int(s) for s in rows.seqs], rows.matrix, rows.types)
                index.generation = rows.generation
                with self._guard:
                    self._indexes[bank_ref] = index
                self._evict(keep=bank_ref)
        return index

    def current(self, bank_ref: str) -> VectorIndex:
        """The bank's index, loaded on first use and caught up with every write committed
        so far, by any process (blocking; see the module docstring). Raises
        :class:`~heed.memory.store.BankGone` (and forgets the index) when the bank no
        longer exists."""
        index = self.get(bank_ref)
        generation = self._store.bank_generation(bank_ref)
        if generation is None:
            self.drop(bank_ref)
            raise BankGone(bank_ref)
        if generation == index.generation:
            return index
        with self._lock(bank_ref):
            with self._guard:
                loaded = self._indexes.get(bank_ref)
            if loaded is not index:  # dropped or replaced meanwhile
                return self.current(bank_ref)
            if index.generation != generation:
                self._catch_up(bank_ref, index)
        return index

    def _catch_up(self, bank_ref: str, index: VectorIndex) -> None:
        """Read what other processes wrote into the bank since the index's generation.

        Units written later are (re)read whole: a seq can come back for another unit, as
        SQLite reuses the largest rowid once its row is deleted. Removals show as a unit
        count below the index's size; then the index keeps only the seqs still stored.
        Call with the bank's lock held."""
        changes = self._store.vectors_since(bank_ref, index.generation)
        if changes is None:
            with self._guard:
                self._indexes.pop(bank_ref, None)
            raise BankGone(bank_ref)
        rows = changes.rows
        if len(rows.seqs):
            seqs = [int(s) for s in rows.seqs]
            index.remove(seqs)
            index.add(seqs, rows.matrix, rows.types)
        if len(index) != changes.unit_count:
            raise_if_cancelled()
            gone = np.setdiff1d(index.seqs(), self._store.unit_seqs(bank_ref))
            index.remove([int(s) for s in gone])
        index.generation = rows.generation
        self._evict(keep=bank_ref)

    def _evict(self, keep: str) -> None:
        with self._guard:
            total = sum(i.nbytes for i in self._indexes.values())
            for ref in list(self._indexes):
                if total <= self.max_bytes:
                    break
                if ref != keep:
                    total -= self._indexes.pop(ref).nbytes

    def loaded(self) -> list[str]:
        """Banks whose index is in memory, least recently used first."""
        with self._guard:
            return list(self._indexes)

    def apply(self, bank_ref: str, result: WriteResult, document: PreparedDocument | None) -> None:
        """Apply a committed write of this process to a loaded index (an unloaded one reads
        it at load). The index takes the write's generation only when it held the one just
        before: otherwise another process wrote in between, and the next search catches up
        (:meth:`current`)."""
        with self._lock(bank_ref):
            with self._guard:
                index = self._indexes.get(bank_ref)
            if index is None:
                return
            if result.generation is not None and result.generation == index.generation + 1:
                index.generation = result.generation
            if result.removed:
                index.remove(result.removed)
            if document is not None and result.added:
                fresh = [(seq, u) for (seq, _), u in zip(result.added, document.units, strict=True)]
                known = index.vectors_for([seq for seq, _ in fresh])
                fresh = [(seq, u) for seq, u in fresh if seq not in known]
                if fresh:
                    index.add(
                        [seq for seq, _ in fresh],
                        np.stack([u.embedding for _, u in fresh]),
                        [u.fact_type for _, u in fresh],
                    )
            self._evict(keep=bank_ref)

    def drop(self, bank_ref: str) -> None:
        """Forget a bank's index (the bank was deleted)."""
        with self._lock(bank_ref), self._guard:
            self._indexes.pop(bank_ref, None)
