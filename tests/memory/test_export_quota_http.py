"""Stored exports bounded per tenant, and an unchanged bank's export reused (issue 37,
finding 11), end to end over HTTP on SQLite and PostgreSQL.

The reproduction: 25 exports of one bank were all stored and downloadable for the TTL (a
1 GB bank exported 100 times held 100 GB for a day). Now an export of a bank whose records
and parameters are those of a stored export of it returns that archive (``reused``), and a
tenant's stored exports are bounded in count and bytes (429 naming the setting, with
``Retry-After`` until the oldest expires); expired archives never count and are deleted.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from heed.api.app import create_app
from heed.settings import Settings
from tests.pg_support import fresh_schema
from tests.support import LiveServer, live_server, wait_for

KEY_A, KEY_B = "export-key-a-0123456789", "export-key-b-0123456789"
A = {"Authorization": f"Bearer {KEY_A}"}
B = {"Authorization": f"Bearer {KEY_B}"}


@contextmanager
def _server(database: str, data_dir: Path, **overrides: Any) -> Iterator[LiveServer]:
    def settings(url: str | None) -> Settings:
        values: dict[str, Any] = {
            "data_dir": data_dir,
            "database_url": url,
            "api_keys": {KEY_A: "a", KEY_B: "b"},
            "run_reaper_interval": 0.2,
            **overrides,
        }
        return Settings(**values)

    if database == "sqlite":
        with live_server(create_app(settings(None))) as srv:
            yield srv
        return
    with fresh_schema() as url, live_server(create_app(settings(url))) as srv:
        yield srv


@pytest.fixture(params=["sqlite", "postgresql"], scope="module")
def database(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def server(database: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with _server(database, tmp_path_factory.mktemp("exports"), export_tenant_max_count=3) as srv:
        yield srv


def _bank(server: LiveServer, headers: dict[str, str] = A, text: str = "Alice has cats.") -> str:
    bank = "exp-" + uuid.uuid4().hex[:8]
    url = f"{server.url}/v1/default/banks/{bank}"
    httpx.put(url, json={}, headers=headers, timeout=30).raise_for_status()
    _retain(server, bank, text, headers)
    return bank


def _retain(server: LiveServer, bank: str, text: str, headers: dict[str, str] = A) -> None:
    httpx.post(
        f"{server.url}/v1/default/banks/{bank}/memories",
        json={"items": [{"content": text}]},
        headers=headers,
        timeout=30,
    ).raise_for_status()


def _export(
    server: LiveServer, bank: str, headers: dict[str, str] = A, **params: Any
) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/default/banks/{bank}/transfer/export",
        params=params,
        headers=headers,
        timeout=30,
    )


def _done(
    server: LiveServer, bank: str, response: httpx.Response, headers: dict[str, str] = A
) -> dict[str, Any]:
    assert response.status_code == 202, response.text
    operation = response.json()["operation_id"]

    def finished() -> dict[str, Any] | None:
        status: dict[str, Any] = httpx.get(
            f"{server.url}/v1/default/banks/{bank}/operations/{operation}",
            headers=headers,
            timeout=10,
        ).json()
        return status if status["status"] in ("completed", "failed", "cancelled") else None

    result: dict[str, Any] = wait_for(finished, 60, interval=0.05)
    return result


def _stored(server: LiveServer, tenant: str) -> int:
    with server.app.state.services.database.read() as conn:
        row = conn.execute(
            "SELECT COUNT(*) FROM transfer_archives WHERE tenant = ? AND kind = 'export'",
            (tenant,),
        ).fetchone()
    return int(row[0])


def test_an_unchanged_banks_export_is_reused_not_stored_again(server: LiveServer) -> None:
    bank = _bank(server)
    before = _stored(server, "a")
    first = _done(server, bank, _export(server, bank))
    assert first["status"] == "completed", first
    assert first["result_metadata"]["reused"] is False
    keys = {first["result_metadata"]["storage_key"]}
    for _ in range(4):  # the reproduction's repeated exports of one bank
        again = _done(server, bank, _export(server, bank))
        assert again["status"] == "completed", again
        assert again["result_metadata"]["reused"] is True
        keys.add(again["result_metadata"]["storage_key"])
    assert len(keys) == 1 and _stored(server, "a") == before + 1
    download = httpx.get(
        f"{server.url}{first['result_metadata']['download_url']}", headers=A, timeout=30
    )
    assert download.status_code == 200 and download.content[:2] == b"PK"

    # Other parameters are another export; a changed bank is another export.
    other = _done(server, bank, _export(server, bank, include_bank_config=False))
    assert other["result_metadata"]["reused"] is False
    _retain(server, bank, "Alice adopted a hamster.")
    changed = _done(server, bank, _export(server, bank))
    assert changed["status"] == "completed", changed
    assert changed["result_metadata"]["reused"] is False
    assert changed["result_metadata"]["storage_key"] not in keys
    assert _stored(server, "a") == before + 3
    _clear(server)


def _clear(server: LiveServer) -> None:
    with server.app.state.services.database.write() as conn:
        conn.execute("DELETE FROM transfer_archive_parts")
        conn.execute("DELETE FROM transfer_archives")


def test_past_the_count_quota_an_export_is_refused_naming_the_setting(
    server: LiveServer,
) -> None:
    _clear(server)
    banks = [_bank(server, text=f"Fact number {i}.") for i in range(3)]
    for bank in banks:
        assert _done(server, bank, _export(server, bank))["status"] == "completed"
    assert _stored(server, "a") == 3
    fourth = _bank(server)
    refused = _export(server, fourth)
    assert refused.status_code == 429, refused.text
    assert "HEED_EXPORT_TENANT_MAX_COUNT" in refused.json()["detail"]
    assert 60 < int(refused.headers["Retry-After"]) <= 86_400  # until the oldest expires
    # At the quota, an unchanged bank's export is still reused...
    reused = _done(server, banks[0], _export(server, banks[0]))
    assert reused["status"] == "completed" and reused["result_metadata"]["reused"] is True
    # ...a changed one's cannot be stored: its run fails with the same 429.
    _retain(server, banks[1], "A new fact.")
    failed = _done(server, banks[1], _export(server, banks[1]))
    assert failed["status"] == "failed", failed
    assert "HEED_EXPORT_TENANT_MAX_COUNT" in failed["error_message"]
    assert _stored(server, "a") == 3
    # Another tenant's exports are its own.
    other = _bank(server, B)
    assert _done(server, other, _export(server, other, B), B)["status"] == "completed"
    _clear(server)


def test_past_the_bytes_quota_an_export_is_refused_naming_the_setting(
    database: str, tmp_path: Path
) -> None:
    with _server(database, tmp_path, export_tenant_max_bytes=1024) as srv:
        bank = _bank(srv, text="Alice has two cats named Tom and Jerry. " * 20)
        failed = _done(srv, bank, _export(srv, bank))
        assert failed["status"] == "failed", failed
        assert "HEED_EXPORT_TENANT_MAX_BYTES" in failed["error_message"]
        assert _stored(srv, "a") == 0  # nothing stored


def test_expired_exports_do_not_count_and_are_deleted(database: str, tmp_path: Path) -> None:
    settings = {"export_tenant_max_count": 1, "transfer_archive_ttl_seconds": 1.0}
    with _server(database, tmp_path, **settings) as srv:
        first, second = _bank(srv), _bank(srv, text="Bob has a dog.")
        assert _done(srv, first, _export(srv, first))["status"] == "completed"
        assert _export(srv, second).status_code == 429  # one stored: the quota
        time.sleep(1.2)  # the first has expired
        done = _done(srv, second, _export(srv, second))
        assert done["status"] == "completed", done
        assert _stored(srv, "a") == 1  # the expired one was deleted
