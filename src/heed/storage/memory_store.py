"""The memory engine's storage on the embedded SQLite database.

Implements :class:`heed.memory.store.MemoryStore`. The SQL is portable except
the keyword index, an FTS5 table (``porter unicode61`` tokenizer) whose
``bank`` column holds one token per bank so a query only reads its own bank's
postings. Migrations run under component ``"memory"``.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from heed.memory.idempotency import KEY_TTL_SECONDS, IdempotencyConflict, LedgerEntry, RetainKey
from heed.memory.models import (
    Bank,
    BankStats,
    DocumentInfo,
    PreparedDocument,
    PreparedUnit,
    StoredUnit,
)
from heed.memory.store import BankGone, UnitFilter, VectorChanges, VectorRows, WriteResult
from heed.memory.units import with_neighbours
from heed.runtime import OperationCancelled, current_token, raise_if_cancelled
from heed.storage.database import Database, Migration
from heed.storage.memory_links import ENTITY_LINKS_PER_ENTITY, first_mentions, plan_links
from heed.storage.memory_rows import (
    DOCUMENT_VALUES,
    LAST_UNITS_OF_DOCUMENT,
    UNIT_COLUMNS,
    bank_from_row,
    document_from_row,
    insert_bank,
    iso,
    join_append,
    now_iso,
    read_generation,
    refuse_nul_in_bank,
    refuse_nul_in_document,
    touch_bank,
    unit_from_row,
)
from heed.storage.memory_values import ValueWriter, release

__all__ = ["MEMORY_MIGRATIONS", "SqliteMemoryStore"]

#: Units inserted per bulk insert; the token is checked between batches.
WRITE_BATCH = 256

MEMORY_MIGRATIONS = [
    Migration(
        "memory",
        1,
        """
        CREATE TABLE memory_banks (
            ref TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            bank_id TEXT NOT NULL,
            name TEXT NOT NULL DEFAULT '',
            mission TEXT NOT NULL DEFAULT '',
            background TEXT,
            disposition TEXT NOT NULL,
            config TEXT NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            last_write_at TEXT,
            UNIQUE (tenant, bank_id)
        );
        CREATE TABLE memory_documents (
            bank_ref TEXT NOT NULL REFERENCES memory_banks (ref) ON DELETE CASCADE,
            document_id TEXT NOT NULL,
            original_text TEXT NOT NULL,
            content_hash TEXT,
            metadata TEXT NOT NULL,
            tags TEXT NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            PRIMARY KEY (bank_ref, document_id)
        );
        CREATE TABLE memory_chunks (
            id TEXT PRIMARY KEY,
            bank_ref TEXT NOT NULL REFERENCES memory_banks (ref) ON DELETE CASCADE,
            document_id TEXT NOT NULL,
            chunk_index INTEGER NOT NULL,
            text TEXT NOT NULL
        );
        CREATE INDEX memory_chunks_doc ON memory_chunks (bank_ref, document_id);
        CREATE TABLE memory_units (
            seq INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            bank_ref TEXT NOT NULL REFERENCES memory_banks (ref) ON DELETE CASCADE,
            document_id TEXT,
            chunk_id TEXT,
            text TEXT NOT NULL,
            fact_type TEXT NOT NULL,
            context TEXT,
            occurred_start TEXT,
            occurred_end TEXT,
            mentioned_at TEXT,
            metadata TEXT NOT NULL,
            tags TEXT NOT NULL,
            embedding BLOB,
            created_at TEXT NOT NULL,
            updated_at TEXT
        );
        CREATE INDEX memory_units_bank ON memory_units (bank_ref, seq);
        CREATE INDEX memory_units_doc ON memory_units (bank_ref, document_id);
        CREATE INDEX memory_units_occurred ON memory_units (bank_ref, occurred_start);
        CREATE TABLE memory_entities (
            id TEXT PRIMARY KEY,
            bank_ref TEXT NOT NULL REFERENCES memory_banks (ref) ON DELETE CASCADE,
            canonical TEXT NOT NULL,
            name TEXT NOT NULL,
            type TEXT,
            UNIQUE (bank_ref, canonical)
        );
        CREATE TABLE memory_unit_entities (
            unit_seq INTEGER NOT NULL REFERENCES memory_units (seq) ON DELETE CASCADE,
            entity_id TEXT NOT NULL REFERENCES memory_entities (id) ON DELETE CASCADE,
            PRIMARY KEY (unit_seq, entity_id)
        );
        CREATE INDEX memory_unit_entities_entity ON memory_unit_entities (entity_id, unit_seq);
        CREATE TABLE memory_links (
            from_seq INTEGER NOT NULL REFERENCES memory_units (seq) ON DELETE CASCADE,
            to_seq INTEGER NOT NULL REFERENCES memory_units (seq) ON DELETE CASCADE,
            link_type TEXT NOT NULL,
            weight REAL NOT NULL,
            PRIMARY KEY (from_seq, to_seq, link_type)
        );
        CREATE INDEX memory_links_to ON memory_links (to_seq);
        CREATE VIRTUAL TABLE memory_fts USING fts5 (bank, body, tokenize = 'porter unicode61');
        """,
    ),
    Migration(
        "memory",
        2,
        """
        ALTER TABLE memory_units ADD COLUMN token_count INTEGER;
        """,
    ),
    Migration(
        "memory",
        3,
        """
        CREATE TABLE memory_retain_ledger (
            bank_ref TEXT NOT NULL REFERENCES memory_banks (ref) ON DELETE CASCADE,
            idempotency_key TEXT NOT NULL,
            document_index INTEGER NOT NULL,
            document_id TEXT NOT NULL,
            units INTEGER NOT NULL,
            fingerprint TEXT NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (bank_ref, idempotency_key, document_index)
        );
        CREATE INDEX memory_retain_ledger_age ON memory_retain_ledger (created_at);
        """,
    ),
    Migration(
        "memory",
        4,
        # A bank's generation counts the writes that changed its units; a unit keeps the
        # generation that wrote it. A process's vector index compares the two to catch up
        # with other processes' writes (heed.memory.vectors.BankIndexes).
        """
        ALTER TABLE memory_banks ADD COLUMN generation INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE memory_units ADD COLUMN generation INTEGER NOT NULL DEFAULT 0;
        CREATE INDEX memory_units_generation ON memory_units (bank_ref, generation);
        """,
    ),
    Migration(
        "memory",
        5,
        # Tags and metadata longer than a reference, stored once per bank
        # (heed.storage.memory_values); rows written before keep theirs inline.
        """
        CREATE TABLE memory_values (
            bank_ref TEXT NOT NULL REFERENCES memory_banks (ref) ON DELETE CASCADE,
            digest TEXT NOT NULL,
            body TEXT NOT NULL,
            PRIMARY KEY (bank_ref, digest)
        );
        ALTER TABLE memory_units ADD COLUMN tags_ref TEXT;
        ALTER TABLE memory_units ADD COLUMN metadata_ref TEXT;
        ALTER TABLE memory_documents ADD COLUMN tags_ref TEXT;
        ALTER TABLE memory_documents ADD COLUMN metadata_ref TEXT;
        CREATE INDEX memory_units_tags_ref ON memory_units (bank_ref, tags_ref)
            WHERE tags_ref IS NOT NULL;
        CREATE INDEX memory_units_metadata_ref ON memory_units (bank_ref, metadata_ref)
            WHERE metadata_ref IS NOT NULL;
        CREATE INDEX memory_documents_tags_ref ON memory_documents (bank_ref, tags_ref)
            WHERE tags_ref IS NOT NULL;
        CREATE INDEX memory_documents_metadata_ref ON memory_documents (bank_ref, metadata_ref)
            WHERE metadata_ref IS NOT NULL;
        """,
    ),
    Migration(
        "memory",
        6,
        # An item's context, copied onto each of its units, shared the same way.
        """
        ALTER TABLE memory_units ADD COLUMN context_ref TEXT;
        CREATE INDEX memory_units_context_ref ON memory_units (bank_ref, context_ref)
            WHERE context_ref IS NOT NULL;
        """,
    ),
]


def bank_token(bank_ref: str) -> str:
    """The FTS token that marks a bank's rows (letters and digits only)."""
    return "bank" + bank_ref.replace("-", "")


#: SQLite VM instructions between two token checks inside a recall query.
PROGRESS_STEPS = 20_000


@contextmanager
def _interruptible(database: Database) -> Iterator[sqlite3.Connection]:
    """A read connection whose queries stop when the active token is cancelled.

    SQLite's progress handler runs every :data:`PROGRESS_STEPS` VM instructions;
    once the token is cancelled it aborts the statement, which surfaces here as
    :class:`OperationCancelled` instead of ``sqlite3.OperationalError``.
    """
    token = current_token()
    with database.read() as conn:
        if token is None:
            yield conn
            return
        conn.set_progress_handler(lambda: 1 if token.cancelled else 0, PROGRESS_STEPS)
        try:
            yield conn
        except sqlite3.OperationalError as exc:
            if token.cancelled and "interrupt" in str(exc):
                raise OperationCancelled(token.reason or "cancelled") from exc
            raise
        finally:
            conn.set_progress_handler(None, 0)


def _placeholders(n: int) -> str:
    return ",".join("?" * n)


def _fts_quote(term: str) -> str:
    return '"' + term.replace('"', '""') + '"'


class SqliteMemoryStore:
    """See :class:`heed.memory.store.MemoryStore`."""

    def __init__(self, database: Database) -> None:
        self.db = database

    def migrate(self) -> None:
        """Apply the memory component's migrations."""
        self.db.migrate(MEMORY_MIGRATIONS)

    # -- banks -------------------------------------------------------------------

    def get_bank(self, tenant: str, bank_id: str) -> Bank | None:
        with self.db.read() as conn:
            row = conn.execute(
                "SELECT * FROM memory_banks WHERE tenant = ? AND bank_id = ?", (tenant, bank_id)
            ).fetchone()
        return bank_from_row(row) if row else None

    def list_banks(
        self, tenant: str, limit: int, offset: int
    ) -> tuple[list[tuple[Bank, int]], int]:
        with self.db.read() as conn:
            total = conn.execute(
                "SELECT COUNT(*) FROM memory_banks WHERE tenant = ?", (tenant,)
            ).fetchone()[0]
            rows = conn.execute(
                "SELECT b.*, (SELECT COUNT(*) FROM memory_units u WHERE u.bank_ref = b.ref) AS n"
                " FROM memory_banks b WHERE tenant = ? ORDER BY bank_id LIMIT ? OFFSET ?",
                (tenant, limit, offset),
            ).fetchall()
        return [(bank_from_row(r), int(r["n"])) for r in rows], int(total)

    def save_bank(self, bank: Bank) -> Bank:
        refuse_nul_in_bank(bank)
        now = now_iso()
        with self.db.write() as conn:
            row = conn.execute(
                "SELECT created_at FROM memory_banks WHERE ref = ?", (bank.ref,)
            ).fetchone()
            if row is None:
                if bank.created_at:
                    raise BankGone(bank.ref)  # read as existing, deleted since
                insert_bank(
                    conn,
                    bank,
                    (
                        bank.ref,
                        bank.tenant,
                        bank.bank_id,
                        bank.name,
                        bank.mission,
                        bank.background,
                        json.dumps(bank.disposition),
                        json.dumps(bank.config),
                        now,
                        now,
                    ),
                )
                bank.created_at = bank.updated_at = now
            else:
                bank.updated_at = now
                bank.created_at = row["created_at"]
                conn.execute(
                    "UPDATE memory_banks SET name = ?, mission = ?, background = ?,"
                    " disposition = ?,"
                    " config = ?, updated_at = ? WHERE ref = ?",
                    (
                        bank.name,
                        bank.mission,
                        bank.background,
                        json.dumps(bank.disposition),
                        json.dumps(bank.config),
                        now,
                        bank.ref,
                    ),
                )
        return bank

    def delete_bank(self, bank_ref: str) -> int:
        with self.db.write() as conn:
            count = conn.execute(
                "SELECT COUNT(*) FROM memory_units WHERE bank_ref = ?", (bank_ref,)
            ).fetchone()[0]
            conn.execute(
                "DELETE FROM memory_fts WHERE rowid IN"
                " (SELECT seq FROM memory_units WHERE bank_ref = ?)",
                (bank_ref,),
            )
            conn.execute(
                "DELETE FROM memory_links WHERE from_seq IN"
                " (SELECT seq FROM memory_units WHERE bank_ref = ?)",
                (bank_ref,),
            )
            conn.execute(
                "DELETE FROM memory_unit_entities WHERE unit_seq IN"
                " (SELECT seq FROM memory_units WHERE bank_ref = ?)",
                (bank_ref,),
            )
            conn.execute("DELETE FROM memory_units WHERE bank_ref = ?", (bank_ref,))
            conn.execute("DELETE FROM memory_retain_ledger WHERE bank_ref = ?", (bank_ref,))
            conn.execute("DELETE FROM memory_values WHERE bank_ref = ?", (bank_ref,))
            conn.execute("DELETE FROM memory_banks WHERE ref = ?", (bank_ref,))
        return int(count)

    def bank_stats(self, bank_ref: str) -> BankStats:
        with self.db.read() as conn:
            by_type = dict(
                conn.execute(
                    "SELECT fact_type, COUNT(*) FROM memory_units WHERE bank_ref = ?"
                    " GROUP BY fact_type",
                    (bank_ref,),
                ).fetchall()
            )
            links = dict(
                conn.execute(
                    "SELECT l.link_type, COUNT(*) FROM memory_links l JOIN memory_units u"
                    " ON u.seq = l.from_seq WHERE u.bank_ref = ? GROUP BY l.link_type",
                    (bank_ref,),
                ).fetchall()
            )
            docs = conn.execute(
                "SELECT COUNT(*) FROM memory_documents WHERE bank_ref = ?", (bank_ref,)
            ).fetchone()[0]
            last = conn.execute(
                "SELECT last_write_at FROM memory_banks WHERE ref = ?", (bank_ref,)
            ).fetchone()
        return BankStats(
            units_by_type={str(k): int(v) for k, v in by_type.items()},
            links_by_type={str(k): int(v) for k, v in links.items()},
            documents=int(docs),
            last_write_at=last[0] if last else None,
        )

    # -- retain ------------------------------------------------------------------

    def _remove_document(
        self, conn: sqlite3.Connection, bank_ref: str, document_id: str
    ) -> tuple[list[int], list[str | None]]:
        """Delete a document's units, chunks and row: the seqs removed, and the shared values
        the removed rows referenced (for :func:`~heed.storage.memory_values.release`)."""
        seqs = [
            int(r[0])
            for r in conn.execute(
                "SELECT seq FROM memory_units WHERE bank_ref = ? AND document_id = ?",
                (bank_ref, document_id),
            )
        ]
        refs = self._delete_seqs(conn, seqs)
        conn.execute(
            "DELETE FROM memory_chunks WHERE bank_ref = ? AND document_id = ?",
            (bank_ref, document_id),
        )
        for row in conn.execute(
            "DELETE FROM memory_documents WHERE bank_ref = ? AND document_id = ?"
            " RETURNING tags_ref, metadata_ref",
            (bank_ref, document_id),
        ).fetchall():
            refs.extend(row)
        return seqs, refs

    @staticmethod
    def _delete_seqs(conn: sqlite3.Connection, seqs: Sequence[int]) -> list[str | None]:
        """Delete units and what hangs on them; the shared values they referenced."""
        refs: list[str | None] = []
        for start in range(0, len(seqs), 500):
            part = list(seqs[start : start + 500])
            marks = _placeholders(len(part))
            for row in conn.execute(
                "SELECT tags_ref, metadata_ref, context_ref FROM memory_units"
                f" WHERE seq IN ({marks}) AND (tags_ref IS NOT NULL"
                " OR metadata_ref IS NOT NULL OR context_ref IS NOT NULL)",
                part,
            ).fetchall():
                refs.extend(row)
            conn.execute(f"DELETE FROM memory_fts WHERE rowid IN ({marks})", part)
            conn.execute(f"DELETE FROM memory_links WHERE from_seq IN ({marks})", part)
            conn.execute(f"DELETE FROM memory_links WHERE to_seq IN ({marks})", part)
            conn.execute(f"DELETE FROM memory_unit_entities WHERE unit_seq IN ({marks})", part)
            conn.execute(f"DELETE FROM memory_units WHERE seq IN ({marks})", part)
        return refs

    def retain_ledger(self, bank_ref: str, key: str) -> list[LedgerEntry]:
        with self.db.write() as conn:
            conn.execute(
                "DELETE FROM memory_retain_ledger WHERE created_at < ?",
                (time.time() - KEY_TTL_SECONDS,),
            )
            rows = conn.execute(
                "SELECT document_index, document_id, units, fingerprint FROM memory_retain_ledger"
                " WHERE bank_ref = ? AND idempotency_key = ? ORDER BY document_index",
                (bank_ref, key),
            ).fetchall()
        return [LedgerEntry(r[0], r[1], r[2], r[3]) for r in rows]

    def write_document(
        self,
        bank_ref: str,
        document: PreparedDocument,
        ledger: tuple[RetainKey, int] | None = None,
    ) -> WriteResult:
        """Write one document's chunks, units, entities and links in one transaction.

        The rows are built before the writer lock is taken, and go in with bulk inserts
        of :data:`WRITE_BATCH` units, the token checked between batches (a cancel rolls
        the whole document back); entities and links cost a statement per entity the bank
        knows already (:mod:`heed.storage.memory_links`), not one per unit and entity.

        The lock is held for the whole document, not released between batches: a document
        is whole or absent, and a recall never sees half of one. What keeps other writers
        (a session being created) from waiting long is that the work under the lock is
        linear in the document's rows, about 60 µs a unit (2,800 dialogue turns: 0.17 s;
        ``benchmarks/retain_amplification.py``).
        """
        refuse_nul_in_document(document, ledger[0].key if ledger is not None else None)
        now = now_iso()
        token = bank_token(bank_ref)
        values = ValueWriter()
        chunk_ids = {c.index: c.id for c in document.chunks}
        rows = [
            self._unit_row(bank_ref, document.document_id, unit, chunk_ids, now, values)
            for unit in document.units
        ]
        first = first_mentions(document.units)
        released: list[str | None] = []  # shared values of rows replaced or overwritten
        with self.db.write() as conn:
            generation = touch_bank(conn, bank_ref, now)
            if ledger is not None:
                self._record_ledger(conn, bank_ref, document, *ledger)
            removed: list[int] = []
            existing = conn.execute(
                "SELECT original_text, created_at, tags_ref, metadata_ref FROM memory_documents"
                " WHERE bank_ref = ? AND document_id = ?",
                (bank_ref, document.document_id),
            ).fetchone()
            text = document.original_text
            created_at = now
            first_chunk = 0
            units = list(document.units)
            if existing is not None and document.replace:
                removed, released = self._remove_document(conn, bank_ref, document.document_id)
            elif existing is not None:
                released = [existing["tags_ref"], existing["metadata_ref"]]
                if units:
                    units = self._join_stored_last(conn, bank_ref, document.document_id, units)
                text = existing["original_text"] + "\n" + text
                created_at = existing["created_at"]
                first_chunk = conn.execute(
                    "SELECT COALESCE(MAX(chunk_index) + 1, 0) FROM memory_chunks"
                    " WHERE bank_ref = ? AND document_id = ?",
                    (bank_ref, document.document_id),
                ).fetchone()[0]
            conn.execute(
                "INSERT INTO memory_documents (bank_ref, document_id, original_text, content_hash,"
                " metadata, metadata_ref, tags, tags_ref, created_at, updated_at)"
                " VALUES (?,?,?,?,?,?,?,?,?,?)"
                " ON CONFLICT (bank_ref, document_id) DO UPDATE SET"
                " original_text = excluded.original_text,"
                " content_hash = excluded.content_hash, metadata = excluded.metadata,"
                " metadata_ref = excluded.metadata_ref, tags = excluded.tags,"
                " tags_ref = excluded.tags_ref, updated_at = excluded.updated_at",
                (
                    bank_ref,
                    document.document_id,
                    text,
                    hashlib.sha256(text.encode()).hexdigest(),
                    *values.encode(document.metadata),
                    *values.encode(document.tags),
                    created_at,
                    now,
                ),
            )
            conn.executemany(
                "INSERT INTO memory_chunks (id, bank_ref, document_id, chunk_index, text)"
                " VALUES (?,?,?,?,?)",
                [
                    (c.id, bank_ref, document.document_id, first_chunk + c.index, c.text)
                    for c in document.chunks
                ],
            )
            # Seqs as SQLite's rowids would be (the largest plus one), known before the insert.
            last = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM memory_units").fetchone()
            after = int(last[0])
            seqs = list(range(after + 1, after + 1 + len(units)))
            for start in range(0, len(units), WRITE_BATCH):
                raise_if_cancelled()  # inside the transaction: a cancel rolls back everything
                end = start + WRITE_BATCH
                conn.executemany(
                    "INSERT INTO memory_units (seq, id, bank_ref, document_id, chunk_id, text,"
                    " fact_type, context, context_ref, occurred_start, occurred_end, mentioned_at,"
                    " metadata, metadata_ref, tags, tags_ref, embedding, created_at, token_count,"
                    " generation) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    [
                        (seq, *row, generation)
                        for seq, row in zip(seqs[start:end], rows[start:end], strict=True)
                    ],
                )
                conn.executemany(
                    "INSERT INTO memory_fts (rowid, bank, body) VALUES (?,?,?)",
                    [
                        (seq, token, unit.index_text)
                        for seq, unit in zip(seqs[start:end], units[start:end], strict=True)
                    ],
                )
            self._link(conn, bank_ref, seqs, units, first)
            values.store(conn, bank_ref)
            release(conn, bank_ref, released)
        return WriteResult(
            removed=removed,
            added=[(seq, unit.id) for seq, unit in zip(seqs, units, strict=True)],
            generation=generation,
        )

    @staticmethod
    def _join_stored_last(
        conn: sqlite3.Connection, bank_ref: str, document_id: str, units: list[PreparedUnit]
    ) -> list[PreparedUnit]:
        """Index an append's first units and the document's stored last units with each
        other's text, as neighbours within one retain are (see :mod:`heed.memory.units`)."""
        last = conn.execute(LAST_UNITS_OF_DOCUMENT, (bank_ref, document_id)).fetchall()
        updates, joined = join_append(last, units)
        for seq, texts in updates:
            body = conn.execute("SELECT body FROM memory_fts WHERE rowid = ?", (seq,)).fetchone()
            if body is not None:
                conn.execute(
                    "UPDATE memory_fts SET body = ? WHERE rowid = ?",
                    (with_neighbours(body[0], texts), seq),
                )
        return joined

    @staticmethod
    def _record_ledger(
        conn: sqlite3.Connection,
        bank_ref: str,
        document: PreparedDocument,
        key: RetainKey,
        index: int,
    ) -> None:
        try:
            conn.execute(
                "INSERT INTO memory_retain_ledger (bank_ref, idempotency_key, document_index,"
                " document_id, units, fingerprint, created_at) VALUES (?,?,?,?,?,?,?)",
                (
                    bank_ref,
                    key.key,
                    index,
                    document.document_id,
                    len(document.units),
                    key.fingerprint,
                    time.time(),
                ),
            )
        except sqlite3.IntegrityError as exc:
            raise IdempotencyConflict(
                f"a retain under Idempotency-Key {key.key!r} is already running; retry it "
                "after that one finishes"
            ) from exc

    @staticmethod
    def _unit_row(
        bank_ref: str,
        document_id: str,
        unit: PreparedUnit,
        chunk_ids: dict[int, str],
        now: str,
        values: ValueWriter,
    ) -> tuple[Any, ...]:
        """A ``memory_units`` row of *unit*, without its seq and generation."""
        embedding = (
            np.asarray(unit.embedding, dtype=np.float32).tobytes()
            if unit.embedding is not None
            else None
        )
        return (
            unit.id,
            bank_ref,
            document_id,
            chunk_ids.get(unit.chunk_index),
            unit.text,
            unit.fact_type,
            *values.encode_text(unit.context),
            iso(unit.occurred_start),
            iso(unit.occurred_end),
            iso(unit.mentioned_at),
            *values.encode(unit.metadata),
            *values.encode(unit.tags),
            embedding,
            now,
            unit.token_count,
        )

    @staticmethod
    def _link(
        conn: sqlite3.Connection,
        bank_ref: str,
        seqs: Sequence[int],
        units: Sequence[PreparedUnit],
        first: dict[str, tuple[str, str | None]],
    ) -> None:
        """Entities, memberships and links of the new units (see
        :mod:`heed.storage.memory_links`), in bulk, the token checked between batches."""
        entity_ids: dict[str, str] = {}
        keys = list(first)
        for start in range(0, len(keys), 500):
            part = keys[start : start + 500]
            for key, entity_id in conn.execute(
                "SELECT canonical, id FROM memory_entities WHERE bank_ref = ?"
                f" AND canonical IN ({_placeholders(len(part))})",
                (bank_ref, *part),
            ):
                entity_ids[str(key)] = str(entity_id)
        recent: dict[str, list[int]] = {}
        for entity_id in entity_ids.values():  # entities the bank knew: their latest units
            recent[entity_id] = [
                int(r[0])
                for r in conn.execute(
                    "SELECT unit_seq FROM memory_unit_entities WHERE entity_id = ?"
                    " ORDER BY unit_seq DESC LIMIT ?",
                    (entity_id, ENTITY_LINKS_PER_ENTITY),
                )
            ]
        new = [
            (str(uuid.uuid4()), bank_ref, key, name, kind)
            for key, (name, kind) in first.items()
            if key not in entity_ids
        ]
        raise_if_cancelled()
        conn.executemany(
            "INSERT INTO memory_entities (id, bank_ref, canonical, name, type) VALUES (?,?,?,?,?)",
            new,
        )
        entity_ids.update((row[2], row[0]) for row in new)
        memberships, links = plan_links(seqs, units, entity_ids, recent)
        for start in range(0, max(len(memberships), len(links)), 4 * WRITE_BATCH):
            raise_if_cancelled()
            end = start + 4 * WRITE_BATCH
            conn.executemany(
                "INSERT OR IGNORE INTO memory_unit_entities (unit_seq, entity_id) VALUES (?,?)",
                memberships[start:end],
            )
            conn.executemany(
                "INSERT OR IGNORE INTO memory_links (from_seq, to_seq, link_type, weight)"
                " VALUES (?,?,?,?)",
                links[start:end],
            )

    # -- recall ------------------------------------------------------------------

    def bank_generation(self, bank_ref: str) -> int | None:
        with self.db.read() as conn:
            return read_generation(conn, bank_ref)

    def load_vectors(self, bank_ref: str) -> VectorRows:
        with self.db.read() as conn:
            generation = read_generation(conn, bank_ref) or 0  # first: see VectorRows
            return self._vector_rows(conn, bank_ref, generation, None)

    def vectors_since(self, bank_ref: str, generation: int) -> VectorChanges | None:
        with _interruptible(self.db) as conn:
            now = read_generation(conn, bank_ref)
            if now is None:
                return None
            rows = self._vector_rows(conn, bank_ref, now, generation)
            count = conn.execute(
                "SELECT COUNT(*) FROM memory_units WHERE bank_ref = ?", (bank_ref,)
            ).fetchone()[0]
        return VectorChanges(rows, int(count))

    def unit_seqs(self, bank_ref: str) -> np.ndarray:
        with _interruptible(self.db) as conn:
            rows = conn.execute(
                "SELECT seq FROM memory_units WHERE bank_ref = ?", (bank_ref,)
            ).fetchall()
        return np.asarray([r[0] for r in rows], dtype=np.int64)

    @staticmethod
    def _vector_rows(
        conn: sqlite3.Connection, bank_ref: str, generation: int, since: int | None
    ) -> VectorRows:
        """The bank's vectors (of the units written after generation *since*, if given)."""
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

    def keyword_search(
        self, bank_ref: str, terms: Sequence[str], limit: int
    ) -> list[tuple[int, float]]:
        if not terms:
            return []
        match = f"bank : {bank_token(bank_ref)} AND ({' OR '.join(_fts_quote(t) for t in terms)})"
        with _interruptible(self.db) as conn:
            rows = conn.execute(
                "SELECT rowid, bm25(memory_fts, 0.0, 1.0) AS score FROM memory_fts"
                " WHERE memory_fts MATCH ? ORDER BY score LIMIT ?",
                (match, limit),
            ).fetchall()
        return [(int(r[0]), -float(r[1])) for r in rows]

    def units_by_entities(
        self, bank_ref: str, canonical_names: Sequence[str], limit: int
    ) -> list[tuple[int, float]]:
        if not canonical_names:
            return []
        marks = _placeholders(len(canonical_names))
        with _interruptible(self.db) as conn:
            rows = conn.execute(
                f"SELECT ue.unit_seq, COUNT(*) AS hits FROM memory_entities e"
                f" JOIN memory_unit_entities ue ON ue.entity_id = e.id"
                f" WHERE e.bank_ref = ? AND e.canonical IN ({marks})"
                f" GROUP BY ue.unit_seq ORDER BY hits DESC, ue.unit_seq DESC LIMIT ?",
                (bank_ref, *canonical_names, limit),
            ).fetchall()
        return [(int(r[0]), float(r[1])) for r in rows]

    def linked_units(
        self, bank_ref: str, seqs: Sequence[int], limit: int
    ) -> list[tuple[int, float]]:
        if not seqs:
            return []
        marks = _placeholders(len(seqs))
        with _interruptible(self.db) as conn:
            rows = conn.execute(
                f"SELECT to_seq, SUM(weight) AS w FROM memory_links WHERE from_seq IN ({marks})"
                f" GROUP BY to_seq ORDER BY w DESC LIMIT ?",
                (*seqs, limit),
            ).fetchall()
        return [(int(r[0]), float(r[1])) for r in rows]

    def units_in_window(
        self, bank_ref: str, start: str, end: str, limit: int
    ) -> list[tuple[int, str]]:
        with _interruptible(self.db) as conn:
            rows = conn.execute(
                "SELECT seq, occurred_start FROM memory_units WHERE bank_ref = ?"
                " AND occurred_start <= ? AND COALESCE(occurred_end, occurred_start) >= ?"
                " ORDER BY occurred_start DESC LIMIT ?",
                (bank_ref, end, start, limit),
            ).fetchall()
        return [(int(r[0]), str(r[1])) for r in rows]

    def _units(
        self, conn: sqlite3.Connection, where: str, params: Iterable[Any]
    ) -> list[StoredUnit]:
        rows = conn.execute(
            f"SELECT {UNIT_COLUMNS} FROM memory_units WHERE {where}",
            tuple(params),
        ).fetchall()
        units = [unit_from_row(r) for r in rows]
        if units:
            by_seq = {u.seq: u for u in units}
            marks = _placeholders(len(by_seq))
            for seq, name in conn.execute(
                f"SELECT ue.unit_seq, e.name FROM memory_unit_entities ue"
                f" JOIN memory_entities e ON e.id = ue.entity_id WHERE ue.unit_seq IN ({marks})",
                tuple(by_seq),
            ):
                by_seq[int(seq)].entities.append(str(name))
        return units

    def fetch_units(self, bank_ref: str, seqs: Sequence[int]) -> dict[int, StoredUnit]:
        if not seqs:
            return {}
        out: dict[int, StoredUnit] = {}
        with _interruptible(self.db) as conn:
            for start in range(0, len(seqs), 500):
                part = list(seqs[start : start + 500])
                for unit in self._units(
                    conn, f"bank_ref = ? AND seq IN ({_placeholders(len(part))})", (bank_ref, *part)
                ):
                    out[unit.seq] = unit
        return out

    def fetch_chunks(self, bank_ref: str, chunk_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        if not chunk_ids:
            return {}
        with _interruptible(self.db) as conn:
            rows = conn.execute(
                f"SELECT id, chunk_index, text FROM memory_chunks WHERE bank_ref = ?"
                f" AND id IN ({_placeholders(len(chunk_ids))})",
                (bank_ref, *chunk_ids),
            ).fetchall()
        return {
            r["id"]: {"id": r["id"], "chunk_index": r["chunk_index"], "text": r["text"]}
            for r in rows
        }

    def entity_states(
        self, bank_ref: str, canonical_names: Sequence[str], per_entity: int
    ) -> dict[str, dict[str, Any]]:
        if not canonical_names:
            return {}
        out: dict[str, dict[str, Any]] = {}
        with _interruptible(self.db) as conn:
            entities = conn.execute(
                f"SELECT id, name, canonical FROM memory_entities WHERE bank_ref = ?"
                f" AND canonical IN ({_placeholders(len(canonical_names))})",
                (bank_ref, *canonical_names),
            ).fetchall()
            for entity in entities:
                facts = conn.execute(
                    "SELECT u.text, u.mentioned_at FROM memory_unit_entities ue"
                    " JOIN memory_units u ON u.seq = ue.unit_seq WHERE ue.entity_id = ?"
                    " ORDER BY ue.unit_seq DESC LIMIT ?",
                    (entity["id"], per_entity),
                ).fetchall()
                out[entity["name"]] = {
                    "entity_id": entity["id"],
                    "canonical_name": entity["name"],
                    "observations": [{"text": f[0], "mentioned_at": f[1]} for f in facts],
                }
        return out

    # -- memories and documents --------------------------------------------------

    def list_units(
        self, bank_ref: str, flt: UnitFilter, limit: int, offset: int
    ) -> tuple[list[StoredUnit], int]:
        where = ["bank_ref = ?"]
        params: list[Any] = [bank_ref]
        if flt.fact_type:
            where.append("fact_type = ?")
            params.append(flt.fact_type)
        if flt.document_id:
            where.append("document_id = ?")
            params.append(flt.document_id)
        if flt.search:
            where.append("LOWER(text) LIKE ?")
            params.append(f"%{flt.search.lower()}%")
        if flt.entity_id:
            where.append("seq IN (SELECT unit_seq FROM memory_unit_entities WHERE entity_id = ?)")
            params.append(flt.entity_id)
        order = "seq DESC"
        if flt.time_field:
            column = {"mentioned_at": "mentioned_at", "occurred_start": "occurred_start",
                      "occurred_end": "occurred_end", "created_at": "created_at",
                      "updated_at": "updated_at"}[flt.time_field]  # fmt: skip
            where.append(f"{column} IS NOT NULL")
            if flt.start:
                where.append(f"{column} >= ?")
                params.append(flt.start)
            if flt.end:
                where.append(f"{column} < ?")
                params.append(flt.end)
            order = f"{column} DESC"
        clause = " AND ".join(where)
        with self.db.read() as conn:
            total = conn.execute(
                f"SELECT COUNT(*) FROM memory_units WHERE {clause}", params
            ).fetchone()[0]
            units = self._units(
                conn, f"{clause} ORDER BY {order} LIMIT ? OFFSET ?", (*params, limit, offset)
            )
        return units, int(total)

    def get_unit(self, bank_ref: str, unit_id: str) -> StoredUnit | None:
        with self.db.read() as conn:
            units = self._units(conn, "bank_ref = ? AND id = ?", (bank_ref, unit_id))
        return units[0] if units else None

    def delete_unit(self, bank_ref: str, unit_id: str) -> WriteResult | None:
        with self.db.write() as conn:
            row = conn.execute(
                "SELECT seq FROM memory_units WHERE bank_ref = ? AND id = ?", (bank_ref, unit_id)
            ).fetchone()
            if row is None:
                return None
            generation = touch_bank(conn, bank_ref)
            release(conn, bank_ref, self._delete_seqs(conn, [int(row[0])]))
        return WriteResult([int(row[0])], [], generation)

    def list_documents(
        self, bank_ref: str, search: str | None, limit: int, offset: int
    ) -> tuple[list[DocumentInfo], int]:
        where = "d.bank_ref = ?"
        params: list[Any] = [bank_ref]
        if search:
            where += " AND (LOWER(d.document_id) LIKE ? OR LOWER(d.original_text) LIKE ?)"
            params += [f"%{search.lower()}%"] * 2
        with self.db.read() as conn:
            total = conn.execute(
                f"SELECT COUNT(*) FROM memory_documents d WHERE {where}", params
            ).fetchone()[0]
            rows = conn.execute(
                f"SELECT d.*, {DOCUMENT_VALUES}, (SELECT COUNT(*) FROM memory_units u"
                " WHERE u.bank_ref = d.bank_ref"
                f" AND u.document_id = d.document_id) AS n FROM memory_documents d WHERE {where}"
                " ORDER BY d.updated_at DESC, d.document_id LIMIT ? OFFSET ?",
                (*params, limit, offset),
            ).fetchall()
        return [document_from_row(r, False) for r in rows], int(total)

    def get_document(self, bank_ref: str, document_id: str) -> DocumentInfo | None:
        with self.db.read() as conn:
            row = conn.execute(
                f"SELECT d.*, {DOCUMENT_VALUES}, (SELECT COUNT(*) FROM memory_units u"
                " WHERE u.bank_ref = d.bank_ref"
                " AND u.document_id = d.document_id) AS n FROM memory_documents d"
                " WHERE d.bank_ref = ? AND d.document_id = ?",
                (bank_ref, document_id),
            ).fetchone()
            if row is None:
                return None
            info = document_from_row(row, True)
            info.units_by_type = {
                str(k): int(v)
                for k, v in conn.execute(
                    "SELECT fact_type, COUNT(*) FROM memory_units"
                    " WHERE bank_ref = ? AND document_id = ?"
                    " GROUP BY fact_type",
                    (bank_ref, document_id),
                )
            }
        return info

    def delete_document(self, bank_ref: str, document_id: str) -> WriteResult | None:
        with self.db.write() as conn:
            exists = conn.execute(
                "SELECT 1 FROM memory_documents WHERE bank_ref = ? AND document_id = ?",
                (bank_ref, document_id),
            ).fetchone()
            if exists is None:
                return None
            generation = touch_bank(conn, bank_ref)
            seqs, refs = self._remove_document(conn, bank_ref, document_id)
            release(conn, bank_ref, refs)
            return WriteResult(seqs, [], generation)
