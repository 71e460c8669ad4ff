"""A real PostgreSQL for tests: one fresh schema per test on the machine's server.

The server is the one these machines run (127.0.0.1:5432, trust auth); point
``HEED_TEST_POSTGRES_URL`` elsewhere to use another. A test that needs it and cannot
reach it fails: nothing is skipped for lack of a service.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote

import psycopg

__all__ = ["POSTGRES_URL", "fresh_schema", "with_search_path"]

POSTGRES_URL = os.environ.get("HEED_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def with_search_path(url: str, schema: str) -> str:
    """*url* whose connections use *schema* (libpq's ``options``)."""
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options={quote(f'-csearch_path={schema}')}"


@contextmanager
def fresh_schema() -> Iterator[str]:
    """A URL whose tables live in a new, empty schema; the schema is dropped afterwards."""
    schema = f"heed_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield with_search_path(POSTGRES_URL, schema)
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
