"""The memory engine's storage: one store over SQLite or PostgreSQL (see :mod:`.store`).

Modules: ``schema`` (the tables, stated once), ``store`` (the protocol's methods, portable
SQL), ``writes`` (a document's transaction, deletes), ``rows`` (rows to models and back),
``values`` (tags, metadata and contexts stored once per bank), ``dialect`` (what each
database's part provides), ``sqlite`` and ``postgres`` with ``pg_keywords`` (those parts).
"""

from heed.storage.memory.schema import DEFAULT_DIM, memory_migrations
from heed.storage.memory.store import SqlMemoryStore

__all__ = ["DEFAULT_DIM", "SqlMemoryStore", "memory_migrations"]
