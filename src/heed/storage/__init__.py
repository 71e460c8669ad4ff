"""Storage: the adapters below the domains' store protocols, on SQLite or PostgreSQL.

Each domain store is one class over a :class:`SqlDatabase` (the embedded file,
:class:`SqliteDatabase`, or :class:`heed.storage.postgres.PostgresDatabase`), its schema
stated once for both (:class:`Migration`, :func:`apply_migrations`). Engines depend on the
protocols in their own packages, never on this one.
"""

from heed.storage.database import Migration, SqlDatabase, apply_migrations, schema_version
from heed.storage.sqlite import SqliteDatabase

__all__ = [
    "Migration",
    "SqlDatabase",
    "SqliteDatabase",
    "apply_migrations",
    "schema_version",
]
