"""How rows of the memory tables become models and back, on either database.

SQLite and PostgreSQL keep the same columns with the same text (JSON as text, timestamps
as ISO-8601 text in UTC: :mod:`heed.storage.memory.schema`), so one mapping serves both;
rows are anything indexable by column name (:class:`sqlite3.Row`,
:class:`heed.storage.postgres.Row`). Also here: the checks every write makes first (NUL,
the bank's row) and the small rules of reads (limits, NUL in a key).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Final

from heed.errors import NUL, refuse_nul
from heed.memory.models import Bank, DocumentInfo, PreparedDocument, PreparedUnit, StoredUnit
from heed.memory.retain.units import NEIGHBOUR_WINDOW, neighbour_gains, with_neighbours
from heed.memory.store import BankGone, BankTaken
from heed.storage.database import from_row
from heed.storage.memory.values import value_column

__all__ = [
    "DOCUMENT_VALUES",
    "LAST_UNITS_OF_DOCUMENT",
    "NO_LIMIT",
    "UNIT_COLUMNS",
    "UNIT_WRITE_COLUMNS",
    "bank_from_row",
    "bank_token",
    "document_from_row",
    "holds_nul",
    "insert_bank",
    "iso",
    "join_append",
    "loads",
    "now_iso",
    "read_generation",
    "refuse_nul_in_bank",
    "refuse_nul_in_document",
    "row_limit",
    "touch_bank",
    "unit_from_row",
    "without_nul",
]

#: The ``memory_units`` columns :func:`unit_from_row` reads, for a ``SELECT ... FROM
#: memory_units`` (context, tags and metadata inline or shared:
#: :mod:`heed.storage.memory.values`).
UNIT_COLUMNS: Final = (
    f"seq, id, text, fact_type, {value_column('memory_units', 'context')} AS context,"
    " document_id, chunk_id, occurred_start,"
    f" occurred_end, mentioned_at, {value_column('memory_units', 'metadata')} AS metadata,"
    f" {value_column('memory_units', 'tags')} AS tags, created_at, updated_at, token_count,"
    " consolidation_state, source_ids, proof_count, history"
)

#: The ``memory_units`` columns a write gives, in the order of its rows: every column but
#: the keyword index (SQLite's FTS5 table, PostgreSQL's ``keywords``, which each database's
#: part writes from the unit's index text). ``heed migrate`` copies units by this list too.
UNIT_WRITE_COLUMNS: Final = (
    "seq",
    "id",
    "bank_ref",
    "document_id",
    "chunk_id",
    "text",
    "fact_type",
    "context",
    "context_ref",
    "occurred_start",
    "occurred_end",
    "mentioned_at",
    "metadata",
    "metadata_ref",
    "tags",
    "tags_ref",
    "embedding",
    "created_at",
    "updated_at",
    "token_count",
    "consolidation_state",
    "source_ids",
    "proof_count",
    "history",
    "generation",
)

#: A ``LIMIT`` no bank reaches: what a negative limit means.
NO_LIMIT: Final = 2**62

#: What :func:`document_from_row` reads beside ``d.*`` (``memory_documents d``).
DOCUMENT_VALUES: Final = (
    f"{value_column('d', 'metadata')} AS metadata_json, {value_column('d', 'tags')} AS tags_json"
)


#: A document's stored last units (``seq, text``, last first), which an append's first units
#: neighbour; parameters ``(bank_ref, document_id)``.
LAST_UNITS_OF_DOCUMENT: Final = (
    "SELECT seq, text FROM memory_units WHERE bank_ref = ? AND document_id = ?"
    f" ORDER BY seq DESC LIMIT {NEIGHBOUR_WINDOW}"
)


def join_append(
    last_first: Sequence[Any], units: Sequence[PreparedUnit]
) -> tuple[list[tuple[int, list[str]]], list[PreparedUnit]]:
    """Join an append's *units* to the document's stored last units (rows of
    :data:`LAST_UNITS_OF_DOCUMENT`): the ``(seq, texts)`` each stored unit's index gains, for
    the store to write, and the units with their own gains in their index text."""
    stored = list(reversed(last_first))
    gains_stored, gains_added = neighbour_gains(
        [str(r["text"]) for r in stored], [u.text for u in units]
    )
    joined = [
        replace(u, index_text=with_neighbours(u.index_text, gains)) if gains else u
        for u, gains in zip(units, gains_added, strict=True)
    ]
    updates = [
        (int(r["seq"]), gains) for r, gains in zip(stored, gains_stored, strict=True) if gains
    ]
    return updates, joined


def bank_token(bank_ref: str) -> str:
    """The keyword-index token that marks a bank's units (letters and digits only)."""
    return "bank" + bank_ref.replace("-", "")


def row_limit(limit: int) -> int:
    """*limit* as a ``LIMIT``: a negative limit means none (:data:`NO_LIMIT`)."""
    return limit if limit >= 0 else NO_LIMIT


def holds_nul(*texts: str | None) -> bool:
    """Whether any of *texts* holds NUL: such a key or filter finds nothing stored (no
    stored text holds NUL), so a read answers at once, never sending it to the database."""
    return any(text is not None and NUL in text for text in texts)


def without_nul(texts: Sequence[str]) -> list[str]:
    """*texts* without those holding NUL (a search term, a name or an id among several:
    it finds nothing, and the others are still looked up)."""
    return [text for text in texts if NUL not in text]


def touch_bank(conn: Any, bank_ref: str, last_write_at: str | None = None) -> int:
    """Bump the bank's generation (and set ``last_write_at`` when given) and return the new
    generation; raise :class:`BankGone` when the bank's row is gone.

    A write that adds or removes units calls it inside its transaction before its first
    row: so a write into a bank that another process deleted writes nothing (instead of
    failing on a foreign key), and every process sees from the generation that the bank's
    units changed (:meth:`heed.memory.store.MemoryStore.bank_generation`).
    """
    row = conn.execute(
        "UPDATE memory_banks SET generation = generation + 1,"
        " last_write_at = COALESCE(?, last_write_at) WHERE ref = ? RETURNING generation",
        (last_write_at, bank_ref),
    ).fetchone()
    if row is None:
        raise BankGone(bank_ref)
    return int(row[0])


def read_generation(conn: Any, bank_ref: str) -> int | None:
    """The bank's generation, ``None`` when the bank does not exist."""
    row = conn.execute("SELECT generation FROM memory_banks WHERE ref = ?", (bank_ref,)).fetchone()
    return None if row is None else int(row[0])


def insert_bank(conn: Any, bank: Bank, values: Sequence[Any]) -> None:
    """Insert a new bank row (*values*: the columns ``ref, tenant, bank_id, name, mission,
    background, disposition, config, created_at, updated_at``). Raises :class:`BankTaken`
    when another bank holds ``(tenant, bank_id)``: another process created it after this
    one looked (the check-then-insert is atomic only within one process)."""
    cursor = conn.execute(
        "INSERT INTO memory_banks (ref, tenant, bank_id, name, mission, background,"
        " disposition, config, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?)"
        " ON CONFLICT (tenant, bank_id) DO NOTHING",
        tuple(values),
    )
    if cursor.rowcount != 1:
        raise BankTaken(bank.bank_id)


def _refuse_nul_in_value(value: Any, what: str) -> None:
    """NUL in a tag list or a metadata map (keys and values)."""
    if isinstance(value, str):
        refuse_nul(value, what)
    elif isinstance(value, dict):
        for key, item in value.items():
            refuse_nul(str(key), f"a key of {what}")
            _refuse_nul_in_value(item, f"{what}[{key!r}]")
    elif isinstance(value, list | tuple):
        for item in value:
            _refuse_nul_in_value(item, what)


def refuse_nul_in_document(document: PreparedDocument, ledger_key: str | None = None) -> None:
    """Raise :class:`~heed.errors.InvalidText` when any text of *document* holds NUL.

    Both stores call it before a write begins, so SQLite and PostgreSQL refuse the same
    documents (PostgreSQL's ``text`` cannot hold NUL; SQLite's can) and nothing is half
    written. The engine refuses such input earlier, naming the item's field; this covers
    every other way to a store."""
    refuse_nul(document.document_id, "document_id")
    refuse_nul(ledger_key, "the Idempotency-Key")
    refuse_nul(document.original_text, f"the text of document {document.document_id!r}")
    seen: set[int] = set()
    for value, what in ((document.tags, "tags"), (document.metadata, "metadata")):
        _refuse_nul_in_value(value, what)
        seen.add(id(value))
    for unit in document.units:
        refuse_nul(unit.text, "a memory's text")
        refuse_nul(unit.index_text, "a memory's index text")
        refuse_nul(unit.context, "context")
        refuse_nul(unit.fact_type, "fact_type")
        for entity in unit.entities:
            refuse_nul(entity.name, "an entity name")
            refuse_nul(entity.type, "an entity type")
        for value, what in ((unit.tags, "tags"), (unit.metadata, "metadata")):
            if id(value) not in seen:  # an item's units share their lists: check once
                _refuse_nul_in_value(value, what)
                seen.add(id(value))


def refuse_nul_in_bank(bank: Bank) -> None:
    """Raise :class:`~heed.errors.InvalidText` when a text of *bank* holds NUL (see
    :func:`refuse_nul_in_document`)."""
    for name in ("tenant", "bank_id", "name", "mission", "background"):
        refuse_nul(getattr(bank, name), name)
    _refuse_nul_in_value(bank.config, "config")
    _refuse_nul_in_value(bank.disposition, "disposition")


def now_iso() -> str:
    """Now, as the stores write timestamps."""
    return datetime.now(UTC).isoformat()


def iso(value: datetime | None) -> str | None:
    """*value* as the stores write timestamps (``None`` stays ``None``)."""
    return value.astimezone(UTC).isoformat() if value is not None else None


def loads(text: str | None) -> Any:
    """``json.loads`` with a fast path for the empty objects most units carry."""
    if text == "{}" or not text:
        return {}
    if text == "[]":
        return []
    return json.loads(text)


def bank_from_row(row: Any) -> Bank:
    """A ``memory_banks`` row."""
    return from_row(
        Bank, row, disposition=json.loads(row["disposition"]), config=json.loads(row["config"])
    )


def unit_from_row(row: Any) -> StoredUnit:
    """A ``memory_units`` row of :data:`UNIT_COLUMNS`, without its entities (the caller
    reads those from ``memory_unit_entities``)."""
    return from_row(
        StoredUnit,
        row,
        ints=("seq",),
        metadata=loads(row["metadata"]),
        tags=loads(row["tags"]),
        entities=[],
        source_ids=json.loads(row["source_ids"]) if row["source_ids"] else [],
        history=json.loads(row["history"]) if row["history"] else [],
    )


def document_from_row(row: Any, with_text: bool) -> DocumentInfo:
    """A ``memory_documents`` row with :data:`DOCUMENT_VALUES` and its unit count ``n``."""
    return from_row(
        DocumentInfo,
        row,
        unit_count=int(row["n"]),
        text_length=len(row["original_text"]),
        metadata=json.loads(row["metadata_json"]),
        tags=json.loads(row["tags_json"]),
        original_text=row["original_text"] if with_text else None,
    )
