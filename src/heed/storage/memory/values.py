"""Tags and metadata stored once per bank, however many units and documents carry them.

A retain copies lists onto what it writes: a request's ``document_tags`` onto every
document and every unit, an item's tags, metadata and context onto each of its units.
Stored on every row, 1,000 items with 64 document tags made 2,000 copies of the same
16 KB, one item of 2,800 dialogue turns with 128 KB of metadata 358 MB, and with a 100 KB
context 280 MB. So a value (a tag list or a metadata object as JSON text, a context as
itself) longer than :data:`INLINE_MAX` characters is stored once per bank in
``memory_values``, keyed by a digest of its text, and the row holds the digest in
``tags_ref`` / ``metadata_ref`` / ``context_ref`` with an empty ``tags`` / ``metadata`` /
``context``; a shorter value (most are ``[]``, ``{}`` or no context) stays inline, where
it costs less than a reference. Readers select :func:`value_column`, which gives the
text either way.

A value is deleted with the last row that references it (:func:`release`), in the
transaction that removes that row: ``memory_values`` holds nothing no row needs.

The memory store uses it on either database; the SQL is portable.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any, Final

__all__ = ["INLINE_MAX", "ValueWriter", "release", "value_column"]

#: JSON values up to this many characters stay in their row; longer ones are shared.
INLINE_MAX: Final = 64
#: Hex digits of the SHA-256 digest that keys a shared value (128 bits).
_DIGEST_CHARS: Final = 32

#: Deletes a bank's value unless a unit or a document still references it (the partial
#: indexes on the ``*_ref`` columns answer each ``NOT EXISTS``).
_RELEASE: Final = (
    "DELETE FROM memory_values WHERE bank_ref = ? AND digest = ?"
    " AND NOT EXISTS (SELECT 1 FROM memory_units WHERE bank_ref = ? AND tags_ref = ?)"
    " AND NOT EXISTS (SELECT 1 FROM memory_units WHERE bank_ref = ? AND metadata_ref = ?)"
    " AND NOT EXISTS (SELECT 1 FROM memory_units WHERE bank_ref = ? AND context_ref = ?)"
    " AND NOT EXISTS (SELECT 1 FROM memory_documents WHERE bank_ref = ? AND tags_ref = ?)"
    " AND NOT EXISTS (SELECT 1 FROM memory_documents WHERE bank_ref = ? AND metadata_ref = ?)"
)


def value_column(table: str, column: str) -> str:
    """SQL for the text of *column* (``tags``, ``metadata`` or ``context``) of the row
    *table* names (a table or an alias), inline or shared."""
    return (
        f"CASE WHEN {table}.{column}_ref IS NULL THEN {table}.{column} ELSE"
        f" (SELECT v.body FROM memory_values v WHERE v.bank_ref = {table}.bank_ref"
        f" AND v.digest = {table}.{column}_ref) END"
    )


class ValueWriter:
    """The tags and metadata of one write transaction: :meth:`encode` gives each value's
    column text and reference, :meth:`store` writes the shared ones.

    A value object met again (the tag list all units of an item share) is encoded once.
    """

    def __init__(self) -> None:
        self._seen: dict[int, tuple[Any, str, str | None]] = {}
        self._bodies: dict[str, str] = {}

    def encode(self, value: Any) -> tuple[str, str | None]:
        """``(column text, reference)`` of a JSON value: the JSON inline and ``None``, or
        ``""`` and the digest of a value stored by :meth:`store`."""
        seen = self._seen.get(id(value))
        if seen is not None and seen[0] is value:
            return seen[1], seen[2]
        inline, ref = self._share(json.dumps(value))
        self._seen[id(value)] = (value, inline, ref)
        return inline, ref

    def encode_text(self, text: str | None) -> tuple[str | None, str | None]:
        """``(column text, reference)`` of a plain text (``None`` stays ``None``)."""
        return (None, None) if text is None else self._share(text)

    def _share(self, text: str) -> tuple[str, str | None]:
        if len(text) <= INLINE_MAX:
            return text, None
        ref = hashlib.sha256(text.encode()).hexdigest()[:_DIGEST_CHARS]
        self._bodies[ref] = text
        return "", ref

    def store(self, conn: Any, bank_ref: str) -> None:
        """Insert the shared values encoded so far that the bank does not hold yet."""
        if self._bodies:
            conn.executemany(
                "INSERT INTO memory_values (bank_ref, digest, body) VALUES (?,?,?)"
                " ON CONFLICT (bank_ref, digest) DO NOTHING",
                [(bank_ref, digest, body) for digest, body in self._bodies.items()],
            )


def release(conn: Any, bank_ref: str, refs: Iterable[str | None]) -> None:
    """After rows referencing *refs* were deleted (in this transaction): delete the values
    no row references any more."""
    digests = sorted({ref for ref in refs if ref})
    if digests:
        conn.executemany(_RELEASE, [(bank_ref, d) * 6 for d in digests])
