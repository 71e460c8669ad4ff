"""``heed migrate``: copy a heed SQLite database into PostgreSQL (pgvector), then check it.

For a user who outgrows one machine: ``heed migrate`` (:mod:`heed.cli.migrate`, the front
end) calls :func:`migrate` with the SQLite file of a stopped server and the URL of the
PostgreSQL database several servers will share. It works on the two databases, not through
a server, so it sits beside the adapters rather than in them:

- :mod:`.source`: the SQLite file, read-only, as one consistent snapshot;
- :mod:`.target`: the target, probed, its schema made by the stores' own migrations;
- :mod:`.tables`: what is copied, in what order, with the columns the schemas have;
- :mod:`.copier`: the copy (batches, idempotency, seq and entity remapping), writing units
  through the memory store's PostgreSQL part;
- :mod:`.checks`: counts and recall compared through two memory engines;
- :mod:`.reports`: what it reports.

What is copied: memory banks, documents, chunks, units (with their vectors and keyword
text), entities, unit-entity rows, links, shared values, the retain ledger, directives,
mental models with their history and knowledge folders; sessions with their transcripts and
wakeups; runs whose phase is terminal, with their journals and summaries but not their
payloads; the banks' webhooks with their events and deliveries (pending ones are sent by
the servers on the target); exported bank archives not yet expired, with their parts (a finished
export's ``download_url`` names one). Unfinished runs are left out and counted: the server
that owned them is stopped, so they are stale; so are expired or unfinished archives. Left
out on purpose (:data:`~heed.migrate.tables.LEFT_OUT`): run payloads, UI logouts. The
copier takes no locks in the target: servers may use it meanwhile, but none should write to
the banks, sessions or runs being copied. A bank whose ``(tenant, bank_id)`` the target
holds under another ref is refused before anything is written. Everything here blocks (the
recall check runs its own event loop).
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import psycopg

from heed.migrate.checks import (
    DEFAULT_VERIFY_QUERIES,
    EngineFactory,
    check_copy,
    engine_factory_for,
)
from heed.migrate.copier import Copier
from heed.migrate.reports import (
    MIN_TOP1_AGREEMENT,
    BankRecall,
    CountCheck,
    MigrationError,
    MigrationSummary,
    NoProgress,
    Progress,
    Verification,
)
from heed.migrate.source import Snapshot, sqlite_source_path
from heed.migrate.tables import copy_columns
from heed.migrate.target import open_target, prepare_target, url_without_password, vector_size
from heed.storage.memory import DEFAULT_DIM
from heed.storage.postgres import PostgresDatabase

__all__ = [
    "DATABASE_ERRORS",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_VERIFY_QUERIES",
    "MIN_TOP1_AGREEMENT",
    "BankRecall",
    "CountCheck",
    "EngineFactory",
    "MigrationError",
    "MigrationSummary",
    "Progress",
    "Verification",
    "database_name",
    "engine_factory_for",
    "migrate",
    "sqlite_source_path",
    "verify",
]

#: The errors either database's driver raises (a connection refused, a statement failed).
DATABASE_ERRORS: Final = (psycopg.Error, sqlite3.Error)


def database_name(exc: BaseException) -> str:
    """Which database raised *exc*, one of :data:`DATABASE_ERRORS` (``PostgreSQL`` or
    ``SQLite``): how the command names it."""
    return "PostgreSQL" if isinstance(exc, psycopg.Error) else "SQLite"


DEFAULT_BATCH_SIZE: Final = 500


@contextlib.contextmanager
def _opened(
    source: str | Path, target: str, connect_timeout: float
) -> Iterator[tuple[Snapshot, PostgresDatabase]]:
    src = Snapshot(sqlite_source_path(source))
    try:
        dst = open_target(target, connect_timeout)
        try:
            yield src, dst
        finally:
            dst.close()
    finally:
        src.close()


def migrate(
    source: str | Path,
    target: str,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    verify_queries: int = DEFAULT_VERIFY_QUERIES,
    engine_factory: EngineFactory | None = None,
    progress: Progress | None = None,
    connect_timeout: float = 10.0,
) -> MigrationSummary:
    """Copy *source* (a SQLite file or ``sqlite:///`` URL) into *target* (a
    ``postgresql://`` URL), then verify (see the module docstring).

    The recall check needs *engine_factory* (:func:`engine_factory_for`); without one
    only counts are verified. Raises :class:`MigrationError` for a problem the user must
    fix; the summary's ``verification.ok`` says whether the copy checked out.
    """
    if batch_size < 1:
        raise MigrationError(f"the batch size must be at least 1, got {batch_size}")
    sink = progress or NoProgress()
    started = time.perf_counter()
    with _opened(source, target, connect_timeout) as (src, db):
        source_dim, target_dim = src.vector_size(), vector_size(db)
        if source_dim is not None and target_dim is not None and source_dim != target_dim:
            raise MigrationError(
                f"the target's memory_units holds {target_dim}-dimensional vectors and the "
                f"source's {source_dim}-dimensional ones: migrate into a new database (or "
                "schema), or re-embed one side"
            )
        dim = source_dim or target_dim or DEFAULT_DIM
        dst = prepare_target(db, dim)
        copier = Copier(src, dst, copy_columns(src, dst), batch_size, sink)
        copier.check_banks()
        total = copier.plan()
        sink.start("copy", total)
        try:
            copier.copy_sessions_and_runs()
            copier.copy_memory()
            copier.copy_webhooks_and_archives()
        finally:
            sink.finish()
        verification = check_copy(src, db, dim, verify_queries, engine_factory, sink)
        return MigrationSummary(
            source=str(src.path),
            target=url_without_password(target),
            dim=dim,
            copied=copier.copied,
            existing=copier.existing,
            left_out=copier.left_out,
            seconds=time.perf_counter() - started,
            verification=verification,
        )


def verify(
    source: str | Path,
    target: str,
    *,
    queries: int = DEFAULT_VERIFY_QUERIES,
    engine_factory: EngineFactory | None = None,
    progress: Progress | None = None,
    connect_timeout: float = 10.0,
) -> Verification:
    """Compare *target* with *source* without copying anything (see the module docstring)."""
    with _opened(source, target, connect_timeout) as (src, db):
        dim = src.vector_size() or vector_size(db) or DEFAULT_DIM
        return check_copy(src, db, dim, queries, engine_factory, progress or NoProgress())
