"""Bank templates over a real server, on SQLite and PostgreSQL, through the unmodified
``hindsight-client`` (its bank templates API): a bank's setup exported and imported into
another bank (created), imported again (updated, nothing doubled), checked with
``dry_run`` (nothing written), and bad manifests refused by name with nothing written."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest
from hindsight_client import Hindsight
from hindsight_client_api.api.bank_templates_api import BankTemplatesApi
from hindsight_client_api.models.bank_template_manifest import BankTemplateManifest

from heed.llm import ScriptedProvider
from tests.pg_support import DATABASES, heed_server
from tests.support import LiveServer, wait_for


@pytest.fixture(params=DATABASES, scope="module")
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    data_dir = tmp_path_factory.mktemp("templates")
    settings = {"llm_provider": "scripted", "mental_model_min_refresh_interval_seconds": 0}
    with heed_server(request.param, data_dir, **settings) as srv:
        srv.app.state.services.reflect.provider = ScriptedProvider(
            {"select": "turn", "replies": [{"text": "Ivy bakes."}]}
        )
        yield srv


def templates_api(server: LiveServer, call: Callable[[BankTemplatesApi], Awaitable[Any]]) -> Any:
    """*call* on the client's bank templates API (async), on a loop of its own."""

    async def run() -> Any:
        client = Hindsight(base_url=server.url, timeout=30)
        try:
            return await call(BankTemplatesApi(client._api_client))
        finally:
            await client.aclose()

    return asyncio.run(run())


def bank_url(server: LiveServer, bank: str, path: str = "") -> str:
    return f"{server.url}/v1/default/banks/{bank}{path}"


def source_bank(server: LiveServer) -> str:
    """A bank with settings of its own, a mental model, a knowledge page and directives."""
    bank = "tpl-" + uuid.uuid4().hex[:8]
    httpx.put(bank_url(server, bank), json={}, timeout=30).raise_for_status()
    httpx.patch(
        bank_url(server, bank, "/config"),
        json={"updates": {"reflect_mission": "Help the bakery.", "disposition_empathy": 5}},
        timeout=30,
    ).raise_for_status()
    created = httpx.post(
        bank_url(server, bank, "/mental-models"),
        json={
            "id": "baking",
            "name": "Baking",
            "source_query": "What does Ivy bake?",
            "tags": ["work"],
            "trigger": {"refresh_after_consolidation": True},
        },
        timeout=30,
    )
    assert created.status_code == 200, created.text
    for name, priority in (("Be brief", 3), ("Cite dates", 1)):
        httpx.post(
            bank_url(server, bank, "/directives"),
            json={"name": name, "content": f"{name}.", "priority": priority, "tags": ["t"]},
            timeout=30,
        ).raise_for_status()
    return bank


def test_export_then_import_replicates_a_banks_setup(server: LiveServer) -> None:
    source = source_bank(server)
    manifest = templates_api(server, lambda api: api.export_bank_template(source))
    assert manifest.version == "1"
    assert manifest.bank.reflect_mission == "Help the bakery."
    assert manifest.bank.disposition_empathy == 5
    [model] = manifest.mental_models
    assert (model.id, model.name, model.source_query, model.tags) == (
        "baking",
        "Baking",
        "What does Ivy bake?",
        ["work"],
    )
    assert model.trigger.refresh_after_consolidation is True
    assert [(d.name, d.priority) for d in manifest.directives] == [
        ("Be brief", 3),
        ("Cite dates", 1),
    ]

    target = "tpl-copy-" + uuid.uuid4().hex[:8]
    done = templates_api(server, lambda api: api.import_bank_template(target, manifest))
    assert done.bank_id == target and done.config_applied and not done.dry_run
    assert done.mental_models_created == ["baking"] and done.mental_models_updated == []
    assert done.directives_created == ["Be brief", "Cite dates"]
    [run_id] = done.operation_ids

    config = httpx.get(bank_url(server, target, "/config"), timeout=30).json()
    assert config["overrides"]["reflect_mission"] == "Help the bakery."
    assert config["overrides"]["disposition_empathy"] == 5
    ended = wait_for(
        lambda: (
            httpx.get(f"{server.url}/v1/runs/{run_id}").json()["phase"] in ("completed", "failed")
        ),
        seconds=30,
    )
    assert ended
    copied = httpx.get(bank_url(server, target, "/mental-models/baking"), timeout=30).json()
    assert copied["source_query"] == "What does Ivy bake?" and copied["tags"] == ["work"]
    assert copied["trigger"]["refresh_after_consolidation"] is True

    # Again: everything matched and updated, nothing doubled, no new refresh.
    again = templates_api(server, lambda api: api.import_bank_template(target, manifest))
    assert again.mental_models_updated == ["baking"] and again.mental_models_created == []
    assert again.directives_updated == ["Be brief", "Cite dates"] and again.operation_ids == []
    directives = httpx.get(bank_url(server, target, "/directives"), timeout=30).json()["items"]
    assert sorted(d["name"] for d in directives) == ["Be brief", "Cite dates"]


def test_a_dry_run_checks_and_writes_nothing(server: LiveServer) -> None:
    target = "tpl-dry-" + uuid.uuid4().hex[:8]
    manifest = {
        "version": "1",
        "bank": {"retain_mission": "Only facts about baking."},
        "mental_models": [{"id": "m1", "name": "M", "source_query": "What is baked?"}],
        "directives": [{"name": "D", "content": "Say D."}],
    }
    r = httpx.post(
        bank_url(server, target, "/import"), params={"dry_run": "true"}, json=manifest, timeout=30
    )
    assert r.status_code == 200, r.text
    assert r.json() == {
        "bank_id": target,
        "config_applied": True,
        "mental_models_created": ["m1"],
        "mental_models_updated": [],
        "directives_created": ["D"],
        "directives_updated": [],
        "operation_ids": [],
        "dry_run": True,
    }
    assert httpx.get(bank_url(server, target, "/profile"), timeout=30).status_code == 404


@pytest.mark.parametrize(
    ("manifest", "status", "named"),
    [
        ({"version": "2"}, 400, "version '2'"),
        ({"version": "1", "bank": {"no_such_setting": 1}}, 400, "no_such_setting"),
        ({"version": "1", "bank": {"reflect_mission": 5}}, 400, "reflect_mission"),
        (
            {"version": "1", "mental_models": [{"id": "Bad Id", "name": "M", "source_query": "q"}]},
            400,
            "Bad Id",
        ),
        (
            {
                "version": "1",
                "mental_models": [
                    {"id": "m", "name": "M", "source_query": "q", "trigger": {"mode": "delta"}}
                ],
            },
            400,
            "trigger.mode",
        ),
        (
            {
                "version": "1",
                "directives": [{"name": "D", "content": "a"}, {"name": "D", "content": "b"}],
            },
            400,
            "repeated: D",
        ),
        ({"version": "1", "directives": [{"name": "D"}]}, 422, "content"),
    ],
)
def test_a_bad_manifest_is_refused_by_name_and_nothing_is_written(
    server: LiveServer, manifest: dict[str, Any], status: int, named: str
) -> None:
    target = "tpl-bad-" + uuid.uuid4().hex[:8]
    r = httpx.post(bank_url(server, target, "/import"), json=manifest, timeout=30)
    assert r.status_code == status, r.text
    assert named in r.text, r.text
    assert httpx.get(bank_url(server, target, "/profile"), timeout=30).status_code == 404


def test_the_schema_describes_the_manifest_and_an_unknown_bank_has_no_template(
    server: LiveServer,
) -> None:
    schema = templates_api(server, lambda api: api.get_bank_template_schema())
    assert set(schema["properties"]) == {"version", "bank", "mental_models", "directives"}
    # The client's own manifest model reads a manifest shaped by this schema.
    assert BankTemplateManifest.from_dict({"version": "1"}).version == "1"
    r = httpx.get(bank_url(server, "tpl-none-" + uuid.uuid4().hex[:8], "/export"), timeout=30)
    assert r.status_code == 404
