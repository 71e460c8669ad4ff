"""``PUT .../profile`` (the client's ``BanksApi.update_bank_disposition``) over HTTP, on SQLite
and PostgreSQL: it sets the bank's disposition, which the bank then keeps (read back through
``GET .../profile`` and ``GET .../config``); a missing bank is a 404, a trait out of range a 422.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import httpx
import pytest
from hindsight_client_api.api.banks_api import BanksApi
from hindsight_client_api.api_client import ApiClient
from hindsight_client_api.configuration import Configuration
from hindsight_client_api.exceptions import ApiException
from hindsight_client_api.models.disposition_traits import DispositionTraits
from hindsight_client_api.models.update_disposition_request import UpdateDispositionRequest

from tests.pg_support import DATABASES, heed_server
from tests.support import LiveServer


@pytest.fixture(params=DATABASES, scope="module")
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    with heed_server(request.param, tmp_path_factory.mktemp("profile")) as srv:
        yield srv


def test_put_profile_sets_the_disposition(server: LiveServer) -> None:
    bank = "profile-" + uuid.uuid4().hex[:8]
    created = httpx.put(
        f"{server.url}/v1/default/banks/{bank}", json={"name": "Pets", "mission": "Cats."}
    )
    assert created.status_code == 200, created.text
    traits = DispositionTraits(skepticism=5, literalism=1, empathy=4)

    async def drive() -> None:
        async with ApiClient(Configuration(host=server.url)) as api_client:
            api = BanksApi(api_client)
            profile = await api.update_bank_disposition(
                bank, UpdateDispositionRequest(disposition=traits)
            )
            assert profile.bank_id == bank and profile.disposition == traits
            assert profile.name == "Pets" and profile.mission == "Cats."  # left as they were
            again = await api.get_bank_profile(bank)
            assert again.disposition == traits
            with pytest.raises(ApiException) as missing:
                await api.update_bank_disposition(
                    "no-such-" + bank, UpdateDispositionRequest(disposition=traits)
                )
            assert missing.value.status == 404

    asyncio.run(drive())
    config = httpx.get(f"{server.url}/v1/default/banks/{bank}/config").json()["config"]
    assert (
        config["disposition_skepticism"],
        config["disposition_literalism"],
        config["disposition_empathy"],
    ) == (5, 1, 4)
    bad = httpx.put(
        f"{server.url}/v1/default/banks/{bank}/profile",
        json={"disposition": {"skepticism": 9, "literalism": 1, "empathy": 1}},
    )
    assert bad.status_code == 422, bad.text
    assert httpx.get(f"{server.url}/v1/default/banks/{bank}/profile").json()["disposition"] == {
        "skepticism": 5,
        "literalism": 1,
        "empathy": 4,
    }
