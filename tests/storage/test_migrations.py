"""Schemas stated once and the one migration runner (:mod:`heed.storage.database`), on both
databases."""

from __future__ import annotations

from typing import Any

import pytest

from heed.storage import Migration, SqlDatabase, apply_migrations, schema_version
from heed.storage.database import split_statements
from heed.storage.memory import SqlMemoryStore, memory_migrations
from heed.storage.revocation_store import SqlRevocationStore
from heed.storage.run_store import SqlRunStore
from heed.storage.session_store import SqlSessionStore


def test_a_step_is_spelled_in_each_dialect() -> None:
    step = Migration(
        "t",
        1,
        "CREATE TABLE t (x {real} NOT NULL DEFAULT '{}', y {extra});",
        words={"sqlite": {"extra": "BLOB"}, "postgresql": {"extra": "BYTEA"}},
    )
    assert step.sql_for("sqlite") == "CREATE TABLE t (x REAL NOT NULL DEFAULT '{}', y BLOB);"
    assert step.sql_for("postgresql") == (
        "CREATE TABLE t (x DOUBLE PRECISION NOT NULL DEFAULT '{}', y BYTEA);"
    )
    with pytest.raises(KeyError, match="no sqlite word 'nope'"):
        Migration("t", 2, "ALTER TABLE t ADD COLUMN z {nope};").sql_for("sqlite")


def test_statements_are_split_where_they_end() -> None:
    script = """
        -- a comment; not the end of anything
        CREATE TABLE a (x TEXT DEFAULT 'a;b');
        CREATE INDEX a_x ON a (x);
        -- a comment alone at the end
    """
    assert split_statements(script) == [
        "-- a comment; not the end of anything\n        CREATE TABLE a (x TEXT DEFAULT 'a;b');",
        "CREATE INDEX a_x ON a (x);",
    ]


def test_the_runner_applies_each_step_once_and_a_failed_step_not_at_all(
    sql_database: SqlDatabase,
) -> None:
    first = Migration("demo", 1, "CREATE TABLE demo (id TEXT PRIMARY KEY, at {real});")
    second = Migration("demo", 2, "ALTER TABLE demo ADD COLUMN n INTEGER;")
    assert apply_migrations(sql_database, [second, first]) == [first, second]
    assert apply_migrations(sql_database, [first, second]) == []
    assert schema_version(sql_database, "demo") == 2
    broken = Migration(
        "demo",
        3,
        "ALTER TABLE demo ADD COLUMN m INTEGER;\nALTER TABLE nowhere ADD COLUMN x INTEGER;",
    )
    with pytest.raises(Exception):  # noqa: B017 (either driver's error)
        apply_migrations(sql_database, [first, second, broken])
    assert schema_version(sql_database, "demo") == 2
    with sql_database.write() as conn:  # the step's first statement rolled back with it
        conn.execute("ALTER TABLE demo ADD COLUMN m INTEGER")


def _columns(db: SqlDatabase) -> dict[str, set[str]]:
    """Every table's columns, as the database holds them."""
    with db.read() as conn:
        if db.dialect == "sqlite":
            tables = [
                str(r[0])
                for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            ]
            return {
                t: {str(r[1]) for r in conn.execute(f"PRAGMA table_info('{t}')")} for t in tables
            }
        rows: list[Any] = conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = current_schema()"
        ).fetchall()
    columns: dict[str, set[str]] = {}
    for table, column in rows:
        columns.setdefault(str(table), set()).add(str(column))
    return columns


def test_both_databases_hold_the_same_tables_and_columns(tmp_path: Any) -> None:
    """What the stores' schemas make is alike on both, but for what only one database's
    search needs: SQLite's FTS5 tables, PostgreSQL's keyword column."""
    from heed.storage import SqliteDatabase
    from heed.storage.postgres import PostgresDatabase
    from tests.pg_support import fresh_schema

    made: dict[str, dict[str, set[str]]] = {}
    lite = SqliteDatabase(tmp_path / "heed.db")
    with fresh_schema() as url:
        pg = PostgresDatabase(url, pool_size=2)
        try:
            for db in (lite, pg):
                for store in (
                    SqlMemoryStore(db),
                    SqlRunStore(db),
                    SqlSessionStore(db),
                    SqlRevocationStore(db),
                ):
                    store.migrate()
                made[db.dialect] = _columns(db)
        finally:
            pg.close()
            lite.close()
    sqlite = {t: c for t, c in made["sqlite"].items() if not t.startswith("memory_fts")}
    postgres = made["postgresql"]
    postgres["memory_units"] = postgres["memory_units"] - {"keywords"}
    assert sqlite == postgres
    assert {m.version for m in memory_migrations()} == set(range(1, 13))
