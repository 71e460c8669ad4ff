"""Idempotent retain: under an ``Idempotency-Key`` a retried retain writes nothing twice.

A retain is one transaction per document, so a client whose connection drops after some
documents committed cannot tell what landed. With a key it may simply send the same request
again:

- Each document written under a key leaves a ledger entry (bank, key, document index,
  document id, units, request fingerprint) **in the same transaction** as the document.
  A retry skips every document the ledger already has and writes only the rest; the answer
  reports all of them, as the first complete attempt would have.
- Items without a ``document_id`` get ids derived from the key and their position, so a
  retry addresses the same documents instead of minting new ones.
- The same key with a different request (another fingerprint) is refused with 409: a key
  names one request, and silently applying a different body would lose data either way.
- Keys are scoped to the bank (and so to the tenant) and are forgotten after
  :data:`KEY_TTL_SECONDS`.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import asdict, dataclass
from typing import Final

from heed.memory.models import Conflict, RetainItem

__all__ = [
    "KEY_TTL_SECONDS",
    "MAX_KEY_CHARS",
    "IdempotencyConflict",
    "LedgerEntry",
    "RetainKey",
    "check_fingerprint",
    "check_ledger",
    "document_id_for",
    "retain_key",
]

MAX_KEY_CHARS: Final = 255
KEY_TTL_SECONDS: Final = 24 * 3600
_NAMESPACE: Final = uuid.UUID("6f1c1d3e-8c55-4d2b-9a55-4b1f5c0f4e11")


class IdempotencyConflict(Conflict):
    """The key was used before for a different request (HTTP 409)."""


@dataclass(frozen=True, slots=True)
class RetainKey:
    """An idempotency key and the fingerprint of the request it names."""

    key: str
    fingerprint: str


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One document already written under a key."""

    document_index: int
    document_id: str
    units: int
    fingerprint: str


def retain_key(key: str, items: list[RetainItem], document_tags: list[str]) -> RetainKey:
    """The :class:`RetainKey` of a request: *key* and a SHA-256 of its items and tags."""
    canonical = json.dumps(
        {"items": [asdict(item) for item in items], "document_tags": document_tags},
        sort_keys=True,
        default=str,
        ensure_ascii=True,
    )
    return RetainKey(key, hashlib.sha256(canonical.encode()).hexdigest())


def document_id_for(key: str, position: int) -> str:
    """The document id of the item at *position* (which has none of its own) under *key*."""
    return str(uuid.uuid5(_NAMESPACE, f"{key}\x00{position}"))


def check_fingerprint(key: RetainKey, recorded: str | None) -> None:
    """Raise :class:`IdempotencyConflict` unless *recorded* is the key's own fingerprint."""
    if recorded != key.fingerprint:
        raise IdempotencyConflict(
            f"Idempotency-Key {key.key!r} was already used for a different retain request; "
            "send the same body to retry it, or use a new key"
        )


def check_ledger(key: RetainKey, entries: list[LedgerEntry]) -> dict[int, LedgerEntry]:
    """The entries by document index; raises :class:`IdempotencyConflict` on another body."""
    for entry in entries:
        check_fingerprint(key, entry.fingerprint)
    return {entry.document_index: entry for entry in entries}
