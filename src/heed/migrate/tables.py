"""Which tables ``heed migrate`` copies, in what order, and with which columns.

The columns are never listed here: they are the tables' columns as the stores' migrations
made them, read from both databases (:func:`copy_columns`). A column a store adds is copied
with no change here; a column that could not be copied (in the source but not the target,
or in the target with nothing to fill it) refuses the migration before anything is written.
The tables the memory store writes itself (units, their entity rows, links) are written
through its PostgreSQL part with the store's own column lists, checked against the schema
the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from heed.migrate.reports import MigrationError
from heed.migrate.source import Snapshot
from heed.migrate.target import Target
from heed.runs.model import TERMINAL_PHASES
from heed.storage.memory.rows import UNIT_WRITE_COLUMNS
from heed.storage.memory.writes import LINK_COLUMNS, MEMBERSHIP_COLUMNS

__all__ = [
    "ARCHIVE_PART_BATCH",
    "ARCHIVE_TABLES",
    "BANK_TABLES",
    "DERIVED",
    "LEFT_OUT",
    "MEMORY_TABLES",
    "NOW",
    "REMAPPED",
    "RUN_TABLES",
    "TERMINAL_SQL",
    "WEBHOOK_TABLES",
    "TableCopy",
    "copy_columns",
    "live_archive",
]

#: The finished phases, as an SQL list.
TERMINAL_SQL: Final = ", ".join(f"'{p.value}'" for p in sorted(TERMINAL_PHASES))
_TERMINAL_RUN: Final = f"phase IN ({TERMINAL_SQL})"


#: Where a :class:`TableCopy`'s ``where`` names the time of the copy (epoch seconds).
NOW: Final = "{now}"
#: Archive parts (a MiB each) copied per transaction.
ARCHIVE_PART_BATCH: Final = 4


@dataclass(frozen=True, slots=True)
class TableCopy:
    """A table copied row for row: which rows (``FROM`` and ``WHERE`` over alias ``t``, the
    copied table), which component holds it, and at most how many rows a batch takes
    (``None``: the migration's batch size)."""

    table: str
    component: str
    source: str = ""
    where: str = "1 = 1"
    max_batch: int | None = None

    @property
    def rows_from(self) -> str:
        return self.source or f"{self.table} t"

    def where_at(self, now: float) -> str:
        """The ``WHERE`` condition for a copy at *now* (epoch seconds; see :data:`NOW`)."""
        return self.where.replace(NOW, repr(float(now)))

    def select(self, columns: list[str], now: float) -> str:
        """The source rows' *columns*, keyed by rowid as ``_k`` (for :meth:`Snapshot.pages`)."""
        named = ", ".join(f"t.{c}" for c in columns)
        return f"SELECT t.rowid AS _k, {named} FROM {self.rows_from} WHERE {self.where_at(now)}"

    def count(self, now: float) -> str:
        return f"SELECT COUNT(*) FROM {self.rows_from} WHERE {self.where_at(now)}"


def live_archive(alias: str, now: float | str = NOW) -> str:
    """The condition that the archive *alias* names is one a server still serves at *now*:
    stored whole, not expired
    (:meth:`heed.storage.transfer.archives.SqlArchiveStore.get_archive`)."""
    when = now if isinstance(now, str) else repr(float(now))
    return f"{alias}.complete = 1 AND {alias}.expires_at > {when}"


#: Sessions and runs, in copy order. Only finished runs are copied (an unfinished one's
#: server is stopped, so it is stale), and their journals; the others' journals stay behind.
RUN_TABLES: Final = (
    TableCopy("sessions", "sessions"),
    TableCopy("session_messages", "sessions"),
    TableCopy("session_wakeups", "sessions"),
    TableCopy("runs", "runs", where=f"t.{_TERMINAL_RUN}"),
    TableCopy(
        "run_events",
        "runs",
        source="run_events t JOIN runs r ON r.id = t.run_id",
        where=f"r.{_TERMINAL_RUN}",
    ),
)

#: Memory tables copied row for row, in copy order (foreign keys: banks first; units come
#: after the chunks, entities before their memberships).
MEMORY_TABLES: Final = (
    TableCopy("memory_banks", "memory"),
    TableCopy("memory_values", "memory"),
    TableCopy("memory_documents", "memory"),
    TableCopy("memory_chunks", "memory"),
    TableCopy("memory_entities", "memory"),
    TableCopy("memory_retain_ledger", "memory"),
    TableCopy("memory_directives", "memory"),
    TableCopy("memory_mental_models", "memory"),
    TableCopy("memory_mental_model_history", "memory"),
    TableCopy("memory_knowledge_folders", "memory"),
    TableCopy("memory_invalidated_units", "memory"),
    TableCopy("memory_bank_aliases", "memory"),
)

#: A bank's webhooks, their events (each body stored once; one not yet fanned out is
#: fanned out by the servers on the target) and deliveries (the outbox and its log), every
#: row: a pending delivery is sent by the servers on the target (its old lease expires), a
#: finished one stays in the webhook's log. Keyed by the bank's ref, which the copy keeps.
WEBHOOK_TABLES: Final = (
    TableCopy("webhooks", "webhooks"),
    TableCopy("webhook_events", "webhooks"),
    TableCopy("webhook_deliveries", "webhooks"),
)

#: Exported bank archives still downloadable (a finished export run's ``download_url``
#: names one), with their parts; expired and unfinished ones are left out and counted.
ARCHIVE_TABLES: Final = (
    TableCopy("transfer_archives", "transfer_archives", where=live_archive("t")),
    TableCopy(
        "transfer_archive_parts",
        "transfer_archives",
        source="transfer_archive_parts t JOIN transfer_archives a ON a.id = t.archive_id",
        where=live_archive("a"),
        max_batch=ARCHIVE_PART_BATCH,
    ),
)

#: The tables whose seqs the target assigns, with the columns the memory store writes.
REMAPPED: Final[Mapping[str, tuple[str, ...]]] = {
    "memory_units": UNIT_WRITE_COLUMNS,
    "memory_unit_entities": tuple(name for name, _ in MEMBERSHIP_COLUMNS),
    "memory_links": tuple(name for name, _ in LINK_COLUMNS),
}

#: Target columns with no source column: what the copier builds (a unit's keywords, from
#: its index text in SQLite's keyword index).
DERIVED: Final[Mapping[str, frozenset[str]]] = {"memory_units": frozenset({"keywords"})}

#: Tables not copied, and why.
LEFT_OUT: Final[Mapping[str, str]] = {
    "schema_migrations": "the target's own, written by the stores' migrations",
    "run_payloads": "a run's input, read only by the worker that runs it: finished runs need none",
    "ui_revocations": "logouts of the old server's web UI sessions, which expire",
}

#: The memory tables (what verification counts per bank).
BANK_TABLES: Final = (
    "memory_banks",
    "memory_values",
    "memory_documents",
    "memory_chunks",
    "memory_units",
    "memory_entities",
    "memory_unit_entities",
    "memory_links",
    "memory_retain_ledger",
    "memory_directives",
    "memory_mental_models",
    "memory_mental_model_history",
    "memory_knowledge_folders",
    "memory_invalidated_units",
    "memory_bank_aliases",
)


def copy_columns(src: Snapshot, dst: Target) -> dict[str, list[str]]:
    """Per copied table of a component the source holds, the columns copied: the source
    table's, in its order. Raises :class:`MigrationError` when a column cannot be copied
    (see the module docstring)."""
    components = {
        spec.table: spec.component
        for spec in (*RUN_TABLES, *MEMORY_TABLES, *WEBHOOK_TABLES, *ARCHIVE_TABLES)
    }
    components.update({table: "memory" for table in REMAPPED})
    plan: dict[str, list[str]] = {}
    for table, component in components.items():
        if not src.has(component):
            continue
        ours, theirs = src.columns(table), dst.columns(table)
        lost = [c for c in ours if c not in theirs]
        unfilled = [c for c in theirs if c not in ours and c not in DERIVED.get(table, ())]
        if lost or unfilled:
            raise MigrationError(
                f"{table} differs between the source and the target: only in the source "
                f"{lost or 'nothing'}, only in the target {unfilled or 'nothing'}"
            )
        written = REMAPPED.get(table)
        if written is not None and sorted(written) != sorted(ours):
            raise MigrationError(
                f"the memory store writes {table} as {list(written)}, but its schema has "
                f"{ours}: heed migrate cannot copy it"
            )
        plan[table] = list(written) if written is not None else ours
    return plan
