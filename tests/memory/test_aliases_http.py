"""Bank aliases over a real server, on SQLite and PostgreSQL, through the unmodified
``hindsight-client`` (its banks API) and raw HTTP: an alias reaches its bank on every
route that takes a bank id, one alias may be shown in the bank list, a name is taken once
per tenant, and a removed alias (or a deleted bank's) reaches nothing."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest
from hindsight_client import Hindsight
from hindsight_client_api.models.create_bank_alias_request import CreateBankAliasRequest
from hindsight_client_api.models.set_bank_alias_primary_request import (
    SetBankAliasPrimaryRequest,
)

from tests.pg_support import DATABASES, heed_server
from tests.support import LiveServer


@pytest.fixture(params=DATABASES, scope="module")
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    with heed_server(request.param, tmp_path_factory.mktemp("aliases")) as srv:
        yield srv


def banks_api(server: LiveServer, call: Callable[[Any], Awaitable[Any]]) -> Any:
    """*call* on the client's banks API (async), on a loop of its own."""

    async def run() -> Any:
        client = Hindsight(base_url=server.url, timeout=30)
        try:
            return await call(client._banks_api)
        finally:
            await client.aclose()

    return asyncio.run(run())


def bank_url(server: LiveServer, bank: str, path: str = "") -> str:
    return f"{server.url}/v1/default/banks/{bank}{path}"


def new_bank(server: LiveServer) -> str:
    bank = "al-" + uuid.uuid4().hex[:8]
    httpx.put(bank_url(server, bank), json={"name": bank}, timeout=30).raise_for_status()
    return bank


def test_an_alias_reaches_its_bank_on_every_route(server: LiveServer) -> None:
    bank = new_bank(server)
    old = f"old-{bank}"
    created = banks_api(
        server, lambda api: api.create_bank_alias(bank, CreateBankAliasRequest(alias=old))
    )
    assert created.bank_id == bank
    assert [(a.alias, a.primary) for a in created.aliases] == [(old, False)]

    retained = httpx.post(
        bank_url(server, old, "/memories"),
        json={"items": [{"content": "Noor keeps bees on the roof."}]},
        timeout=60,
    )
    assert retained.status_code == 200, retained.text
    listed = httpx.get(bank_url(server, bank, "/memories/list"), timeout=30).json()
    assert [m["text"] for m in listed["items"]] == ["Noor keeps bees on the roof."]
    recalled = httpx.post(
        bank_url(server, old, "/memories/recall"), json={"query": "bees"}, timeout=30
    ).json()
    assert recalled["results"][0]["text"] == "Noor keeps bees on the roof."
    profile = httpx.get(bank_url(server, old, "/profile"), timeout=30).json()
    assert profile["bank_id"] == bank  # the bank keeps its own id
    # A PUT through the alias updates the bank; no bank of that id appears.
    httpx.put(bank_url(server, old), json={"mission": "bees"}, timeout=30).raise_for_status()
    assert httpx.get(bank_url(server, bank, "/profile"), timeout=30).json()["mission"] == "bees"
    ids = {b["bank_id"] for b in httpx.get(f"{server.url}/v1/default/banks").json()["banks"]}
    assert bank in ids and old not in ids


def test_one_alias_is_shown_and_search_finds_banks_by_alias(server: LiveServer) -> None:
    bank = new_bank(server)
    first, second = f"first-{bank}", f"second-{bank}"
    banks_api(
        server,
        lambda api: api.create_bank_alias(bank, CreateBankAliasRequest(alias=first, primary=True)),
    )
    shown = banks_api(
        server,
        lambda api: api.create_bank_alias(bank, CreateBankAliasRequest(alias=second)),
    )
    assert [(a.alias, a.primary) for a in shown.aliases] == [(first, True), (second, False)]
    promoted = banks_api(
        server,
        lambda api: api.set_bank_alias_primary(
            bank, second, SetBankAliasPrimaryRequest(primary=True)
        ),
    )
    assert [(a.alias, a.primary) for a in promoted.aliases] == [(second, True), (first, False)]

    found = httpx.get(f"{server.url}/v1/default/banks", params={"q": f"FIRST-{bank}"}).json()
    assert [(b["bank_id"], b["display_alias"], b["matched_aliases"]) for b in found["banks"]] == [
        (bank, second, [first])
    ]
    by_id = httpx.get(f"{server.url}/v1/default/banks", params={"q": bank}).json()
    assert [(b["bank_id"], b["matched_aliases"]) for b in by_id["banks"]] == [(bank, [])]
    assert by_id["total"] == 1
    nothing = httpx.get(f"{server.url}/v1/default/banks", params={"q": "%_"}).json()
    assert nothing["banks"] == [] and nothing["total"] == 0  # LIKE's wildcards are literal

    hidden = banks_api(
        server,
        lambda api: api.set_bank_alias_primary(
            bank, second, SetBankAliasPrimaryRequest(primary=False)
        ),
    )
    assert not any(a.primary for a in hidden.aliases)
    again = httpx.get(f"{server.url}/v1/default/banks", params={"q": bank}).json()
    assert again["banks"][0]["display_alias"] is None


def test_a_name_is_taken_once_and_bad_aliases_are_refused(server: LiveServer) -> None:
    bank, other = new_bank(server), new_bank(server)
    alias = f"taken-{bank}"
    r = httpx.post(bank_url(server, bank, "/aliases"), json={"alias": alias}, timeout=30)
    assert r.status_code == 201, r.text
    cases: list[tuple[str, Any, int, str]] = [
        (other, {"alias": alias}, 409, "another bank's alias"),
        (bank, {"alias": alias}, 409, "this bank's alias"),
        (bank, {"alias": other}, 409, "already a bank's id"),
        (bank, {"alias": "has space"}, 422, "alias"),
        (bank, {}, 422, "alias"),
        ("no-such-bank", {"alias": "x-" + bank}, 404, "no-such-bank"),
    ]
    for target, body, status, named in cases:
        r = httpx.post(bank_url(server, target, "/aliases"), json=body, timeout=30)
        assert r.status_code == status, (body, r.text)
        assert named in r.text, (body, r.text)
    r = httpx.patch(bank_url(server, bank, "/aliases/nope"), json={"primary": True}, timeout=30)
    assert r.status_code == 404 and "nope" in r.text
    r = httpx.delete(bank_url(server, other, f"/aliases/{alias}"), timeout=30)
    assert r.status_code == 404  # not that bank's alias
    aliases = httpx.get(bank_url(server, bank, "/aliases"), timeout=30).json()["aliases"]
    assert [a["alias"] for a in aliases] == [alias]


def test_a_removed_alias_and_a_deleted_banks_alias_reach_nothing(server: LiveServer) -> None:
    bank = new_bank(server)
    alias = f"gone-{bank}"
    httpx.post(bank_url(server, bank, "/aliases"), json={"alias": alias}).raise_for_status()
    assert httpx.get(bank_url(server, alias, "/profile"), timeout=30).status_code == 200
    left = banks_api(server, lambda api: api.delete_bank_alias(bank, alias))
    assert left.aliases == []
    assert httpx.get(bank_url(server, alias, "/profile"), timeout=30).status_code == 404
    assert httpx.get(bank_url(server, bank, "/profile"), timeout=30).status_code == 200

    httpx.post(bank_url(server, bank, "/aliases"), json={"alias": alias}).raise_for_status()
    assert httpx.delete(bank_url(server, alias), timeout=60).status_code == 200  # the bank
    assert httpx.get(bank_url(server, bank, "/profile"), timeout=30).status_code == 404
    assert httpx.get(bank_url(server, alias, "/profile"), timeout=30).status_code == 404
    # The name is free again: a new bank may take it.
    httpx.put(bank_url(server, alias), json={}, timeout=30).raise_for_status()
    assert httpx.get(bank_url(server, alias, "/profile")).json()["bank_id"] == alias
