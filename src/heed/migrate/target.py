"""The target of ``heed migrate``: a PostgreSQL database with pgvector, prepared by the
stores themselves.

The target is probed first (reachable, pgvector installable or visible), then its schema is
created by the stores' own ``migrate()``, every store a server has: runs, sessions, UI
logouts, webhooks, bank archives, and memory sized to the source's vectors. A target
already holding vectors of another size is refused. :class:`Target` holds what the copier
writes with: the database and the memory store's PostgreSQL part (its seq allocation,
vector encoding, unit and bulk inserts).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg_pool import PoolTimeout

from heed.migrate.reports import MigrationError
from heed.storage.memory import SqlMemoryStore
from heed.storage.memory.postgres import PostgresMemory, SchemaMismatch
from heed.storage.observability_store import SqlObservabilityStore
from heed.storage.postgres import PostgresDatabase, is_postgres_url
from heed.storage.revocation_store import SqlRevocationStore
from heed.storage.run_store import SqlRunStore
from heed.storage.session_store import SqlSessionStore
from heed.storage.transfer.archives import SqlArchiveStore
from heed.storage.webhook_store import SqlWebhookStore

__all__ = ["Target", "open_target", "prepare_target", "url_without_password", "vector_size"]


def url_without_password(url: str) -> str:
    """*url* with its password, if any, as ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def _probe(url: str, connect_timeout: float) -> None:
    """Fail early, with the server's own words, when the target is unusable."""
    shown = url_without_password(url)
    if not is_postgres_url(url):
        raise MigrationError(f"the target {shown!r} is not a postgresql:// URL")
    try:
        with psycopg.connect(
            url, autocommit=True, connect_timeout=max(1, round(connect_timeout))
        ) as conn:
            installed = conn.execute(
                "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
            ).fetchone()
            if installed is None:
                available = conn.execute(
                    "SELECT default_version FROM pg_available_extensions WHERE name = 'vector'"
                ).fetchone()
                if available is None:
                    raise MigrationError(
                        f"the target PostgreSQL ({shown}) has no pgvector extension: "
                        "install pgvector 0.8 or later on that server"
                    )
                return  # the memory migration creates it (CREATE EXTENSION IF NOT EXISTS)
            visible = conn.execute("SELECT to_regtype('vector')").fetchone()
            if visible is None or visible[0] is None:
                raise MigrationError(
                    f"pgvector is installed in the target ({shown}) but its type is "
                    "not on the connection's search_path: add the extension's schema to it"
                )
    except psycopg.Error as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise MigrationError(f"cannot reach the target PostgreSQL {shown}: {detail}") from exc


def open_target(url: str, connect_timeout: float) -> PostgresDatabase:
    """The target database (see the module docstring); :class:`MigrationError` naming the
    problem when it cannot serve."""
    _probe(url, connect_timeout)
    try:
        return PostgresDatabase(url, pool_size=4, connect_timeout=connect_timeout)
    except (psycopg.Error, PoolTimeout) as exc:
        shown = url_without_password(url)
        raise MigrationError(f"cannot reach the target PostgreSQL {shown}: {exc}") from exc


def vector_size(db: PostgresDatabase) -> int | None:
    """The vector size of the target's ``memory_units.embedding``, if that table exists."""
    with db.read() as conn:
        row = conn.execute(
            "SELECT a.atttypmod FROM pg_attribute a"
            " WHERE a.attrelid = to_regclass('memory_units') AND a.attname = 'embedding'"
        ).fetchone()
    return int(row[0]) if row is not None and row[0] is not None and int(row[0]) > 0 else None


@dataclass(frozen=True, slots=True)
class Target:
    """The prepared target: its database, and the memory store's PostgreSQL part."""

    db: PostgresDatabase
    memory: PostgresMemory
    dim: int

    def columns(self, table: str) -> list[str]:
        """*table*'s columns, in order, as its schema stands in the target."""
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(?)"
                " AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                (table,),
            ).fetchall()
        return [str(r[0]) for r in rows]

    def tables(self) -> set[str]:
        """The tables of the target's schema (the first on its search path)."""
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            ).fetchall()
        return {str(r[0]) for r in rows}


def prepare_target(db: PostgresDatabase, dim: int) -> Target:
    """Create heed's schema in *db* through the stores (see the module docstring)."""
    try:
        SqlRunStore(db).migrate()
        SqlSessionStore(db).migrate()
        SqlRevocationStore(db).migrate()
        SqlWebhookStore(db).migrate()
        SqlArchiveStore(db).migrate()
        SqlObservabilityStore(db).migrate()  # its tables are left out, its schema made
        memory = SqlMemoryStore(db, dim)
        memory.migrate()
    except SchemaMismatch as exc:
        raise MigrationError(f"the target cannot take this source: {exc}") from exc
    except psycopg.Error as exc:
        raise MigrationError(f"could not create heed's schema in the target: {exc}") from exc
    return Target(db, _postgres_part(memory), dim)


def _postgres_part(store: SqlMemoryStore) -> PostgresMemory:
    assert isinstance(store.dialect, PostgresMemory)
    return store.dialect
