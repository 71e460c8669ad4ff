"""Storage: the embedded database and the domain stores built on it.

Engines depend on narrow store interfaces (protocols in each domain package);
the SQLite implementations live here. A PostgreSQL implementation can be added
beside them without touching the engines.
"""

from heed.storage.database import Database, Migration, SqlDatabase

__all__ = ["Database", "Migration", "SqlDatabase"]
