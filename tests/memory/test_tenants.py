"""Every memory route is tenant-scoped: another tenant's bank does not exist."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hindsight_client import Hindsight
from hindsight_client_api.exceptions import ApiException

from heed.api.app import create_app
from heed.settings import Settings
from tests.support import LiveServer, live_server


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = Settings(
        data_dir=Path(tmp_path_factory.mktemp("tenants")),
        api_keys={"key-a": "tenant-a", "key-b": "tenant-b"},
    )
    with live_server(create_app(settings)) as srv:
        yield srv


async def test_tenants_do_not_see_each_other(keyed_server: LiveServer) -> None:
    a = Hindsight(base_url=keyed_server.url, api_key="key-a")
    b = Hindsight(base_url=keyed_server.url, api_key="key-b")
    try:
        await a._acreate_bank("shared-name")
        await a.aretain("shared-name", "Tenant A's secret: the code is 1234.")
        for call in (
            b.arecall("shared-name", "secret code"),
            b.alist_memories("shared-name"),
            b.documents.list_documents("shared-name"),
            b.operations.list_operations("shared-name"),
            b.adelete_bank("shared-name"),
        ):
            with pytest.raises(ApiException) as err:
                await call
            assert err.value.status == 404
        assert [x.bank_id for x in (await b.banks.list_banks()).banks] == []
        # B's bank of the same name is its own.
        await b._acreate_bank("shared-name")
        await b.aretain("shared-name", "Tenant B keeps notes about gardening.")
        seen_by_b = await b.arecall("shared-name", "secret code")
        assert all("1234" not in r.text for r in seen_by_b.results)
        seen_by_a = await a.arecall("shared-name", "secret code")
        assert "1234" in seen_by_a.results[0].text
    finally:
        await a.aclose()
        await b.aclose()


async def test_missing_key_is_refused(keyed_server: LiveServer) -> None:
    anonymous = Hindsight(base_url=keyed_server.url)
    try:
        with pytest.raises(ApiException) as err:
            await anonymous.banks.list_banks()
        assert err.value.status == 401
    finally:
        await anonymous.aclose()
