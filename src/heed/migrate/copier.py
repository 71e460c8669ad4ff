"""The copy of ``heed migrate``: every table, in batches, idempotent, seqs remapped.

Every table is read in pages by rowid (units by seq) over the whole file, not bank by bank:
each page is then one range scan of the table, however many banks there are. Each batch is
one transaction. Values are copied as they are (the same JSON text, ISO timestamps, epoch
floats), except that NUL, which PostgreSQL text cannot hold, becomes U+FFFD
(:func:`heed.errors.replace_nul`).

Idempotency: every row copied as it is goes in with ``ON CONFLICT DO NOTHING`` on its
table's keys, and units are matched by id, so running the migration again copies nothing
and an interrupted run resumes where it stopped; rows already there are counted as
``existing``.

Units are written by the memory store's PostgreSQL part, as a retain writes them: its seq
allocation, vector encoding and unit insert (the keywords built from SQLite's index text).
Their seqs are the target's to assign. The source units are read in seq order and cut into
*runs*: units of one bank and one document with consecutive source seqs (a document written
at once is one run; an appended document or a deleted unit starts a new run). Each run is
allocated like a document, so units that were neighbours in the source (recall's
``seq +- 1`` expansion, same document) are neighbours in the target and no others are, and
the order of seqs is kept. A batch holds whole runs, so a run is written whole or not at
all. Units whose id is already in the target keep their seq there. Entity rows and links
are then translated batch by batch, source seq -> unit id -> target seq, and entity ids
through the target's ``(bank_ref, canonical)`` row (the same id after a plain copy; the
target's own when it already had that entity); rows that point at no unit are left out and
counted.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import psycopg.errors

from heed.errors import replace_nul
from heed.migrate.reports import MigrationError, Progress
from heed.migrate.source import Snapshot
from heed.migrate.tables import (
    ARCHIVE_TABLES,
    MEMORY_TABLES,
    RUN_TABLES,
    TERMINAL_SQL,
    WEBHOOK_TABLES,
    TableCopy,
    live_archive,
)
from heed.migrate.target import Target
from heed.storage.memory.dialect import Column
from heed.storage.memory.rows import bank_token
from heed.storage.memory.sqlite import INDEX_TEXT_OF_UNIT
from heed.storage.memory.writes import LINK_COLUMNS, MEMBERSHIP_COLUMNS

__all__ = ["KEY_BATCH", "Copier", "storable"]

#: Keys per lookup in the target.
KEY_BATCH: Final = 2000
#: Values per ``IN (...)`` list on SQLite (older builds allow 999 parameters).
_SQLITE_IN: Final = 500


def storable(value: Any) -> Any:
    """*value* as PostgreSQL can store it (text without NUL)."""
    return replace_nul(value) if isinstance(value, str) else value


def _insert_sql(table: str, columns: Sequence[str]) -> str:
    marks = ", ".join("?" * len(columns))
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks}) ON CONFLICT DO NOTHING"


@dataclass(eq=False)
class Copier:
    """One migration's copy: the two databases, the columns, the counters, the progress."""

    src: Snapshot
    dst: Target
    columns: dict[str, list[str]]
    batch: int
    progress: Progress
    #: The time of the copy: which archives are still live (epoch seconds).
    now: float = field(init=False, default_factory=time.time)
    copied: dict[str, int] = field(init=False, default_factory=dict)
    existing: dict[str, int] = field(init=False, default_factory=dict)
    left_out: dict[str, int] = field(init=False, default_factory=dict)

    def _count(self, table: str, offered: int, inserted: int, read: int | None = None) -> None:
        """*offered* rows written with ON CONFLICT DO NOTHING, *inserted* of them new;
        *read* source rows done (more than offered when some were left out)."""
        self.copied[table] = self.copied.get(table, 0) + inserted
        self.existing[table] = self.existing.get(table, 0) + offered - inserted
        self.progress.advance(table, offered if read is None else read)

    def _leave_out(self, table: str, n: int) -> None:
        if n:
            self.left_out[table] = self.left_out.get(table, 0) + n

    def plan(self) -> int:
        """Source rows to read (the progress total); fills ``left_out`` with the runs."""
        total = 0
        for spec in (*RUN_TABLES, *MEMORY_TABLES, *WEBHOOK_TABLES, *ARCHIVE_TABLES):
            self.copied[spec.table] = 0
            self.existing[spec.table] = 0
            if self.src.has(spec.component):
                total += self.src.scalar(spec.count(self.now))
        for table in ("memory_units", "memory_unit_entities", "memory_links"):
            self.copied[table] = 0
            self.existing[table] = 0
            if self.src.has("memory"):
                total += self.src.scalar(f"SELECT COUNT(*) FROM {table}")
        if self.src.has("runs"):
            self.left_out["runs"] = self.src.scalar(
                f"SELECT COUNT(*) FROM runs WHERE phase NOT IN ({TERMINAL_SQL})"
            )
            self.left_out["run_events"] = self.src.scalar(
                "SELECT COUNT(*) FROM run_events e JOIN runs r ON r.id = e.run_id"
                f" WHERE r.phase NOT IN ({TERMINAL_SQL})"
            )
        if self.src.has("transfer_archives"):
            gone = f"NOT ({live_archive('a', self.now)})"
            self.left_out["transfer_archives"] = self.src.scalar(
                f"SELECT COUNT(*) FROM transfer_archives a WHERE {gone}"
            )
            self.left_out["transfer_archive_parts"] = self.src.scalar(
                "SELECT COUNT(*) FROM transfer_archive_parts t"
                f" JOIN transfer_archives a ON a.id = t.archive_id WHERE {gone}"
            )
        return total

    # -- tables copied row for row -------------------------------------------------------

    def _copy_plain(self, spec: TableCopy) -> None:
        if not self.src.has(spec.component):
            return
        columns = self.columns[spec.table]
        insert = _insert_sql(spec.table, columns)
        batch = min(self.batch, spec.max_batch or self.batch)
        for rows in self.src.pages(spec.select(columns, self.now), (), batch, "t.rowid"):
            values = [tuple(storable(r[c]) for c in columns) for r in rows]
            with self.dst.db.write() as conn:
                inserted = conn.executemany(insert, values).rowcount
            self._count(spec.table, len(values), max(0, inserted))

    def copy_sessions_and_runs(self) -> None:
        for spec in RUN_TABLES:
            self._copy_plain(spec)

    def copy_webhooks_and_archives(self) -> None:
        """The banks' webhooks with their events and deliveries, and the archives still downloadable
        (see :data:`~heed.migrate.tables.WEBHOOK_TABLES`, :data:`~.tables.ARCHIVE_TABLES`)."""
        for spec in (*WEBHOOK_TABLES, *ARCHIVE_TABLES):
            self._copy_plain(spec)

    # -- memory --------------------------------------------------------------------------

    def check_banks(self) -> None:
        """Refuse banks whose ``(tenant, bank_id)`` the target holds under another ref."""
        if not self.src.has("memory"):
            return
        banks = self.src.conn.execute("SELECT ref, tenant, bank_id FROM memory_banks").fetchall()
        clashes: list[str] = []
        with self.dst.db.read() as conn:
            for start in range(0, len(banks), KEY_BATCH):
                part = banks[start : start + KEY_BATCH]
                rows = conn.execute(
                    "SELECT b.ref, b.tenant, b.bank_id FROM memory_banks b"
                    " JOIN unnest(?::text[], ?::text[]) AS k(tenant, bank_id)"
                    " ON b.tenant = k.tenant AND b.bank_id = k.bank_id",
                    ([storable(b["tenant"]) for b in part], [storable(b["bank_id"]) for b in part]),
                ).fetchall()
                theirs = {(r[1], r[2]): r[0] for r in rows}
                for b in part:
                    ref = theirs.get((storable(b["tenant"]), storable(b["bank_id"])))
                    if ref is not None and ref != b["ref"]:
                        clashes.append(f"{b['tenant']}/{b['bank_id']}")
        if clashes:
            raise MigrationError(
                "the target already has other banks named "
                + ", ".join(sorted(clashes)[:10])
                + (" ..." if len(clashes) > 10 else "")
                + " (tenant/bank_id); delete or rename them there first"
            )

    def copy_memory(self) -> None:
        if not self.src.has("memory"):
            return
        banks, values, documents, chunks, entities, ledger, *per_bank = MEMORY_TABLES
        for spec in (banks, values, documents, chunks):
            self._copy_plain(spec)
        self._copy_units()
        self._copy_plain(entities)
        self._copy_memberships()
        self._copy_links()
        self._copy_plain(ledger)
        for spec in per_bank:  # tables that hang off the bank alone (directives)
            self._copy_plain(spec)

    def _unit_runs(self) -> Iterator[list[sqlite3.Row]]:
        """The units in seq order, cut into runs (see the module docstring)."""
        columns = ", ".join(f"u.{c}" for c in self.columns["memory_units"] if c != "seq")
        select = (
            f"SELECT u.seq AS _k, {columns}, {INDEX_TEXT_OF_UNIT} AS _index_text"
            " FROM memory_units u WHERE 1 = 1"
        )
        run: list[sqlite3.Row] = []
        for rows in self.src.pages(select, (), self.batch, "u.seq"):
            for row in rows:
                last = run[-1] if run else None
                if last is not None and (
                    row["_k"] != last["_k"] + 1
                    or row["bank_ref"] != last["bank_ref"]
                    or row["document_id"] != last["document_id"]
                ):
                    yield run
                    run = []
                run.append(row)
        if run:
            yield run

    def _copy_units(self) -> None:
        """Copy the units in batches of whole runs."""
        pending: list[list[sqlite3.Row]] = []
        size = 0
        for run in self._unit_runs():
            if pending and size + len(run) > self.batch:
                self._write_units(pending)
                pending, size = [], 0
            pending.append(run)
            size += len(run)
        if pending:
            self._write_units(pending)

    def _unit_row(self, seq: int, unit: sqlite3.Row) -> tuple[Any, ...]:
        """The target row of a source unit: its columns as they are, the vector encoded as
        the store encodes one."""
        memory = self.dst.memory
        return (
            seq,
            *(
                memory.encode_vector(_vector_of(unit[c])) if c == "embedding" else storable(unit[c])
                for c in self.columns["memory_units"][1:]
            ),
        )

    def _write_units(self, runs: list[list[sqlite3.Row]]) -> None:
        """One transaction: skip the runs' units already in the target, insert the others
        with seqs allocated run by run."""
        ids = [storable(u["id"]) for run in runs for u in run]
        with self.dst.db.write() as conn:
            there = {
                str(r[0]): str(r[1])
                for r in conn.execute(
                    "SELECT id, bank_ref FROM memory_units WHERE id = ANY(?::text[])", (ids,)
                ).fetchall()
            }
            missing: list[list[sqlite3.Row]] = []
            for run in runs:
                new = []
                for unit in run:
                    bank = there.get(storable(unit["id"]))
                    if bank is None:
                        new.append(unit)
                    elif bank != unit["bank_ref"]:
                        raise MigrationError(
                            f"unit {unit['id']} is in the target under another bank ({bank})"
                        )
                if new:
                    missing.append(new)
            seqs = self.dst.memory.allocate_seqs(conn, [len(run) for run in missing])
            units = [u for run in missing for u in run]
            rows = [
                self._unit_row(seq, unit)
                for run_seqs, run in zip(seqs, missing, strict=True)
                for seq, unit in zip(run_seqs, run, strict=True)
            ]
            keywords = [
                (
                    bank_token(str(u["bank_ref"])),
                    storable(u["_index_text"] if u["_index_text"] is not None else u["text"]),
                )
                for u in units
            ]
            try:
                if rows:
                    self.dst.memory.insert_units(conn, rows, keywords)
            except psycopg.errors.UniqueViolation as exc:
                raise MigrationError(
                    "units appeared in the target while this migration wrote them; "
                    "stop the servers writing to it and run the migration again"
                ) from exc
        self._count("memory_units", len(ids), len(rows))

    def _target_seqs(self, conn: Any, seqs: set[int]) -> dict[int, int]:
        """Source seq -> target seq of the units with these source seqs (by unit id)."""
        ids: dict[str, int] = {}
        ordered = sorted(seqs)
        for start in range(0, len(ordered), _SQLITE_IN):
            part = ordered[start : start + _SQLITE_IN]
            for seq, unit_id in self.src.conn.execute(
                f"SELECT seq, id FROM memory_units WHERE seq IN ({', '.join('?' * len(part))})",
                part,
            ):
                ids[storable(unit_id)] = int(seq)
        if not ids:
            return {}
        return {
            ids[str(r[0])]: int(r[1])
            for r in conn.execute(
                "SELECT id, seq FROM memory_units WHERE id = ANY(?::text[])", (list(ids),)
            ).fetchall()
        }

    def _target_entities(self, conn: Any, entity_ids: set[str]) -> dict[str, str]:
        """Source entity id -> the target's id for the same ``(bank_ref, canonical)``."""
        keys: dict[tuple[str, str], str] = {}
        ordered = sorted(entity_ids)
        for start in range(0, len(ordered), _SQLITE_IN):
            part = ordered[start : start + _SQLITE_IN]
            for entity_id, ref, name in self.src.conn.execute(
                "SELECT id, bank_ref, canonical FROM memory_entities"
                f" WHERE id IN ({', '.join('?' * len(part))})",
                part,
            ):
                keys[(str(ref), storable(name))] = str(entity_id)
        if not keys:
            return {}
        return {
            keys[(str(r[0]), str(r[1]))]: str(r[2])
            for r in conn.execute(
                "SELECT e.bank_ref, e.canonical, e.id FROM memory_entities e"
                " JOIN unnest(?::text[], ?::text[]) AS k(bank_ref, canonical)"
                " ON e.bank_ref = k.bank_ref AND e.canonical = k.canonical",
                ([k[0] for k in keys], [k[1] for k in keys]),
            ).fetchall()
        }

    def _copy_remapped(self, table: str, columns: Sequence[Column]) -> None:
        """Copy the entity rows or the links: their seqs and entity ids translated to the
        target's (see the module docstring); a row pointing at no unit is left out."""
        names = self.columns[table]
        select = f"SELECT x.rowid AS _k, {', '.join(f'x.{c}' for c in names)} FROM {table} x"
        for rows in self.src.pages(f"{select} WHERE 1 = 1", (), self.batch, "x.rowid"):
            with self.dst.db.write() as conn:
                seqs = self._target_seqs(
                    conn, {int(r[c]) for r in rows for c in names if c in _SEQ_COLUMNS}
                )
                entities = (
                    self._target_entities(conn, {str(r["entity_id"]) for r in rows})
                    if "entity_id" in names
                    else {}
                )
                values = []
                for r in rows:
                    value = tuple(_translated(r, c, seqs, entities) for c in names)
                    if None not in value:
                        values.append(value)
                inserted = self.dst.memory.insert_rows(conn, table, columns, values)
            self._leave_out(table, len(rows) - len(values))  # dangling rows
            self._count(table, len(values), inserted, len(rows))

    def _copy_memberships(self) -> None:
        self._copy_remapped("memory_unit_entities", MEMBERSHIP_COLUMNS)

    def _copy_links(self) -> None:
        self._copy_remapped("memory_links", LINK_COLUMNS)


#: Columns holding a unit's seq, which the target assigns.
_SEQ_COLUMNS: Final = frozenset({"unit_seq", "from_seq", "to_seq"})


def _translated(
    row: sqlite3.Row, column: str, seqs: dict[int, int], entities: dict[str, str]
) -> Any:
    """A remapped row's value of *column* in the target (``None``: it points at nothing)."""
    if column in _SEQ_COLUMNS:
        return seqs.get(int(row[column]))
    if column == "entity_id":
        return entities.get(str(row[column]))
    return storable(row[column])


def _vector_of(blob: bytes | None) -> np.ndarray | None:
    """A SQLite unit's float32 blob as a vector."""
    return None if blob is None else np.frombuffer(blob, dtype=np.float32)
