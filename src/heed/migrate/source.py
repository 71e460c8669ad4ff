"""The source of ``heed migrate``: a heed SQLite file, read as one consistent snapshot.

The file is opened read-only and read inside one transaction. It must be a heed database at
the schema versions this heed writes (the stores' own migrations say which): an older one
is upgraded by starting this heed on it once, a newer one is migrated by the heed that
wrote it. Tables are read in pages by an integer key (keyset paging), so each page is one
index range scan however far in.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

from heed.migrate.reports import MigrationError
from heed.storage.memory import memory_migrations
from heed.storage.run_store import MIGRATIONS as RUN_MIGRATIONS
from heed.storage.session_store import MIGRATIONS as SESSION_MIGRATIONS
from heed.storage.transfer.archives import MIGRATIONS as ARCHIVE_MIGRATIONS
from heed.storage.webhook_store import MIGRATIONS as WEBHOOK_MIGRATIONS

__all__ = ["SOURCE_SCHEMA", "Snapshot", "sqlite_source_path"]

#: The schema version of each component this heed writes; a source at another is refused.
SOURCE_SCHEMA: Final = {
    "memory": max(m.version for m in memory_migrations()),
    "runs": max(m.version for m in RUN_MIGRATIONS),
    "sessions": max(m.version for m in SESSION_MIGRATIONS),
    "webhooks": max(m.version for m in WEBHOOK_MIGRATIONS),
    "transfer_archives": max(m.version for m in ARCHIVE_MIGRATIONS),
}


def sqlite_source_path(value: str | Path) -> Path:
    """The file a ``--from`` value names: a plain path or a ``sqlite:///`` URL.

    URLs follow SQLAlchemy's convention: ``sqlite:///relative.db``,
    ``sqlite:////absolute.db``. When the relative reading names no file but the absolute
    one does (``sqlite:///home/me/heed.db``), the absolute one is used. Raises
    :class:`MigrationError` when the file does not exist.
    """
    text = str(value)
    if text.startswith("sqlite:"):
        rest = text.removeprefix("sqlite:")
        if not rest.startswith("///"):
            raise MigrationError(
                f"{text!r} is not a sqlite:/// URL: use sqlite:///relative/path.db, "
                "sqlite:////absolute/path.db or a plain path"
            )
        rest = rest[3:].split("?", 1)[0]
        path = Path(rest)
        if not path.is_absolute() and not path.exists() and Path("/" + rest).exists():
            path = Path("/" + rest)
    else:
        path = Path(text)
    path = path.expanduser()
    if not path.exists():
        raise MigrationError(f"source database {path} does not exist")
    if not path.is_file():
        raise MigrationError(f"source database {path} is not a file")
    return path


class Snapshot:
    """The SQLite file, read-only, inside one read transaction (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.conn = sqlite3.connect(
                f"{path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None
            )
            self.conn.row_factory = sqlite3.Row
            self.conn.execute("PRAGMA busy_timeout = 10000")
            self.conn.execute("BEGIN")
            names = {
                str(r[0])
                for r in self.conn.execute(
                    "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')"
                )
            }
        except sqlite3.DatabaseError as exc:
            raise MigrationError(f"cannot read {path} as a SQLite database: {exc}") from exc
        if "schema_migrations" not in names:
            self.close()
            raise MigrationError(f"{path} is not a heed database (no schema_migrations table)")
        versions = {
            str(r[0]): int(r[1])
            for r in self.conn.execute(
                "SELECT component, MAX(version) FROM schema_migrations GROUP BY component"
            )
        }
        for component, expected in SOURCE_SCHEMA.items():
            found = versions.get(component)
            if found is None or found == expected:
                continue
            self.close()
            if found < expected:
                raise MigrationError(
                    f"{path}: its {component} schema is at version {found}, this heed writes "
                    f"version {expected}; start this heed version on it once (heed serve) to "
                    "upgrade it, then migrate"
                )
            raise MigrationError(
                f"{path}: its {component} schema is at version {found}, newer than this heed "
                f"knows ({expected}); migrate with the heed version that wrote it"
            )
        self.components = {c for c in SOURCE_SCHEMA if c in versions}

    def has(self, component: str) -> bool:
        """Whether the file holds *component*'s tables."""
        return component in self.components

    def columns(self, table: str) -> list[str]:
        """*table*'s columns, in order, as its schema stands in the file."""
        return [str(r["name"]) for r in self.conn.execute(f"PRAGMA table_info('{table}')")]

    def scalar(self, sql: str, params: Sequence[Any] = ()) -> int:
        row = self.conn.execute(sql, tuple(params)).fetchone()
        return int(row[0] or 0) if row is not None else 0

    def pages(
        self, sql: str, params: Sequence[Any], batch: int, key: str
    ) -> Iterator[list[sqlite3.Row]]:
        """Rows of *sql* in pages of *batch*, by the integer expression *key* ascending.

        *sql* selects *key* as its column ``_k`` and ends in a ``WHERE`` clause, to which
        ``AND key > ? ORDER BY key LIMIT ?`` is added (keyset paging: each page is an
        index range scan however far in).
        """
        after = -(2**63)
        while True:
            rows = self.conn.execute(
                f"{sql} AND {key} > ? ORDER BY {key} LIMIT ?", (*params, after, batch)
            ).fetchall()
            if not rows:
                return
            yield rows
            after = int(rows[-1]["_k"])
            if len(rows) < batch:
                return

    def vector_size(self) -> int | None:
        """The size of the file's unit vectors (``None`` without any); refuses a file
        holding several sizes (a PostgreSQL bank holds one)."""
        if not self.has("memory"):
            return None
        sizes = sorted(
            int(r[0])
            for r in self.conn.execute(
                "SELECT DISTINCT length(embedding) FROM memory_units WHERE embedding IS NOT NULL"
            )
        )
        if not sizes:
            return None
        if len(sizes) > 1 or sizes[0] % 4:
            raise MigrationError(
                f"{self.path} holds unit vectors of several sizes "
                f"({', '.join(map(str, sizes))} bytes); a PostgreSQL bank holds one size: "
                "re-embed the banks first"
            )
        return sizes[0] // 4

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.conn.execute("ROLLBACK")
        self.conn.close()
