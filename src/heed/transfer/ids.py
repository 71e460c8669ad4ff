"""The ids of a transfer: the sets a check keeps of an archive's ids (:class:`IdDigests`,
8 bytes an id whatever its length), and the new ids an import gives (:class:`NewIds`:
UUID 5 of the new bank and the old id, so no id is ever reused and the same archive
imports twice)."""

from __future__ import annotations

import hashlib
import os
import uuid
from array import array
from hashlib import blake2b
from typing import Any, Final

import numpy as np

from heed.transfer.rows import UnitRow

__all__ = ["IdDigests", "NewIds"]

#: The namespace of the ids an import gives.
_ID_NAMESPACE: Final = uuid.UUID("1b1f7c2e-3a55-4d1e-9e65-7c3c6d1f0a42")


class IdDigests:
    """A set of ids kept as 8-byte keyed digests in a packed array (8 bytes an id).

    :meth:`add` appends; :meth:`seal` sorts and returns a digest held twice (or ``None``);
    :meth:`missing` tells which of some values are not held (after :meth:`seal`). A digest
    is 64 bits of BLAKE2b keyed with a key drawn per set: two different ids share one with
    a probability of about n^2 / 2^65 (1e-6 for 6 million ids) and nobody can aim for it.
    """

    def __init__(self) -> None:
        self._key = os.urandom(16)
        self._values = array("Q")
        self._sorted: np.ndarray[Any, np.dtype[np.uint64]] | None = None

    def __len__(self) -> int:
        return len(self._values)

    def digest(self, value: str) -> int:
        raw = blake2b(value.encode("utf-8", "surrogatepass"), digest_size=8, key=self._key)
        return int.from_bytes(raw.digest(), "little")

    def add(self, value: str) -> None:
        self._values.append(self.digest(value))
        self._sorted = None

    def seal(self) -> int | None:
        """Sort the digests; one that is held twice, or ``None``."""
        values = np.frombuffer(self._values, dtype=np.uint64).copy() if self._values else None
        self._sorted = np.sort(values) if values is not None else np.empty(0, np.uint64)
        same = np.flatnonzero(self._sorted[1:] == self._sorted[:-1])
        return int(self._sorted[same[0]]) if same.size else None

    def missing(self, values: list[str]) -> str | None:
        """The first of *values* not held (the set must be sealed)."""
        assert self._sorted is not None, "seal() before looking up"
        if not values:
            return None
        wanted = np.fromiter((self.digest(v) for v in values), np.uint64, len(values))
        at = np.searchsorted(self._sorted, wanted)
        found = at < self._sorted.size
        found[found] = self._sorted[at[found]] == wanted[found]
        misses = np.flatnonzero(~found)
        return values[int(misses[0])] if misses.size else None


class NewIds:
    """The new ids an import gives an archive's memories, chunks and entities."""

    def __init__(self, bank_ref: str) -> None:
        self.prefix = _ID_NAMESPACE.bytes + (bank_ref + "/").encode()

    def __call__(self, old: str) -> str:
        """``uuid5(_ID_NAMESPACE, bank_ref + "/" + old)``, without the UUID object (an
        import maps every id several times: it was a tenth of its CPU)."""
        raw = bytearray(hashlib.sha1(self.prefix + old.encode()).digest()[:16])
        raw[6] = (raw[6] & 0x0F) | 0x50  # version 5
        raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
        x = raw.hex()
        return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"

    def unit(self, unit: UnitRow) -> UnitRow:
        """*unit* with its id, chunk id and provenance mapped."""
        unit.id = self(unit.id)
        unit.chunk_id = self(unit.chunk_id) if unit.chunk_id is not None else None
        unit.source_ids = [self(s) for s in unit.source_ids]
        return unit
