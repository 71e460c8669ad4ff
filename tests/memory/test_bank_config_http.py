"""A bank's settings end to end: hindsight-client's ``get_bank_config``,
``update_bank_config``, ``reset_bank_config`` and ``create_bank`` against a real server on
SQLite and PostgreSQL; every name heed does not honour refused by name with nothing
changed; and the settings doing what they say: recall's arms, ``recall_prefer_observations``,
the recall budget settings sizing a recall, ``recall_max_tokens`` bounding reflect's recalls,
the reflect mission and disposition in the prompt, ``mcp_enabled_tools`` over MCP.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import aiohttp
import httpx
import httpx2
import pytest
from hindsight_client import Hindsight
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from heed.api.app import create_app
from heed.llm import ScriptedProvider
from heed.memory.bank_config.settings import MCP_TOOLS, NOT_IMPLEMENTED, SETTINGS
from heed.settings import Settings
from tests.memory.test_learning_http import CONSOLIDATION, EXTRACTION, TURNS
from tests.pg_support import fresh_schema
from tests.support import LiveServer, live_server, wait_for

#: The server's own defaults here: extraction and observations on (HEED_RETAIN_EXTRACTION,
#: HEED_OBSERVATIONS), so observations can be made.
DEFAULTS: dict[str, Any] = {
    "reflect_mission": "",
    "disposition_skepticism": 3,
    "disposition_literalism": 3,
    "disposition_empathy": 3,
    "retain_mission": None,
    "retain_extraction_mode": "concise",
    "enable_observations": True,
    "observations_mission": None,
    "default_observation_scopes": "combined",
    "consolidation_strategies": [],
    "enable_text_search": True,
    "enable_temporal_retrieval": True,
    "enable_graph_retrieval": True,
    "enable_reranking": True,
    "recall_prefer_observations": False,
    "recall_budget_function": "fixed",
    "recall_budget_fixed_low": 40,
    "recall_budget_fixed_mid": 100,
    "recall_budget_fixed_high": 300,
    "recall_budget_adaptive_low": 0.025,
    "recall_budget_adaptive_mid": 0.075,
    "recall_budget_adaptive_high": 0.25,
    "recall_budget_min": 20,
    "recall_budget_max": 2000,
    "recall_semantic_weight": 0.6,
    "recall_speaker_weight": 0.2,
    "recall_temporal_weight": 0.2,
    "recall_max_tokens": None,
    "mental_model_min_refresh_interval_seconds": 0.0,
    "llm_budget_tokens_per_hour": None,
    "llm_budget_tokens_per_day": None,
    "mcp_enabled_tools": None,
}


@pytest.fixture(params=["sqlite", "postgresql"], scope="module")
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    def settings(url: str | None) -> Settings:
        return Settings(
            data_dir=tmp_path_factory.mktemp("config"),
            database_url=url,
            llm_provider="scripted",
            llm_script=json.dumps({"token_delay": 0, "replies": []}),
            retain_extraction="concise",
            observations="on",
            consolidation_debounce_seconds=0.05,
        )

    if request.param == "sqlite":
        with live_server(create_app(settings(None))) as srv:
            yield srv
        return
    with fresh_schema() as url, live_server(create_app(settings(url))) as srv:
        yield srv


@pytest.fixture
def client(server: LiveServer) -> Iterator[Hindsight]:
    c = Hindsight(base_url=server.url, timeout=30)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


@pytest.fixture
def bank(server: LiveServer, client: Hindsight) -> str:
    # Retains here extract no fact and make no observation unless a test scripts them.
    script(server, {"when": "new facts:", "json": {"actions": []}}, {"json": {"facts": []}})
    bank_id = "config-" + uuid.uuid4().hex[:8]
    client.create_bank(bank_id)
    return bank_id


def script(server: LiveServer, *replies: dict[str, Any]) -> ScriptedProvider:
    provider = ScriptedProvider({"replies": list(replies)})
    server.app.state.services.retain_provider.current = provider
    return provider


def config_of(http: httpx.Client, bank: str) -> dict[str, Any]:
    r = http.get(f"/v1/default/banks/{bank}/config")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def patch(http: httpx.Client, bank: str, updates: dict[str, Any]) -> httpx.Response:
    return http.patch(f"/v1/default/banks/{bank}/config", json={"updates": updates})


# -- the client's methods --------------------------------------------------------------------


def test_a_new_bank_has_the_server_defaults(client: Hindsight, bank: str) -> None:
    got = client.get_bank_config(bank)
    assert got == {"bank_id": bank, "config": DEFAULTS, "overrides": {}}
    assert set(DEFAULTS) == set(SETTINGS)


def test_update_bank_config_sets_what_it_is_given(
    client: Hindsight, http: httpx.Client, bank: str
) -> None:
    strategies = [{"scopes": [{"tags": ["user:*"]}], "observations_mission": "People."}]
    changed = client.update_bank_config(
        bank,
        reflect_mission="Answer as Alice's vet.",
        disposition_empathy=5,
        retain_extraction_mode="off",
        enable_observations=False,
        observations_mission="Keep pets.",
        default_observation_scopes=[["user:*"]],
        consolidation_strategies=strategies,
        enable_reranking=False,
        recall_prefer_observations=True,
        mcp_enabled_tools=["recall", "reflect", "recall"],
    )
    overrides = {
        "reflect_mission": "Answer as Alice's vet.",
        "disposition_empathy": 5,
        "retain_extraction_mode": "off",
        "enable_observations": False,
        "observations_mission": "Keep pets.",
        "default_observation_scopes": [["user:*"]],
        "consolidation_strategies": strategies,
        "enable_reranking": False,
        "recall_prefer_observations": True,
        "mcp_enabled_tools": ["recall", "reflect"],
    }
    assert changed == {"bank_id": bank, "config": {**DEFAULTS, **overrides}, "overrides": overrides}
    assert client.get_bank_config(bank) == changed
    profile = http.get(f"/v1/default/banks/{bank}").json()
    assert profile["mission"] == "Answer as Alice's vet."
    assert profile["disposition"] == {"skepticism": 3, "literalism": 3, "empathy": 5}

    # null: back to the default; Hindsight's environment spelling of a key works too.
    r = patch(http, bank, {"enable_reranking": None, "HINDSIGHT_API_RETAIN_MISSION": "Pets."})
    assert r.status_code == 200, r.text
    after = r.json()
    assert after["config"]["enable_reranking"] is True
    assert "enable_reranking" not in after["overrides"]
    assert after["overrides"]["retain_mission"] == "Pets."


def test_reset_bank_config_returns_to_the_server_defaults(
    client: Hindsight, http: httpx.Client, bank: str
) -> None:
    client.update_bank_config(
        bank, reflect_mission="m", disposition_skepticism=1, enable_text_search=False
    )
    reset = client.reset_bank_config(bank)
    assert reset == {"bank_id": bank, "config": DEFAULTS, "overrides": {}}
    profile = http.get(f"/v1/default/banks/{bank}").json()
    assert profile["mission"] == "" and profile["disposition"]["skepticism"] == 3
    assert client.get_bank_config(bank) == reset


@pytest.mark.parametrize(
    ("updates", "status", "needles"),
    [
        ({"retain_chunk_size": 800}, 400, ["retain_chunk_size", "does not implement"]),
        (
            {"recall_include_chunks": True, "recall_chunks_max_tokens": 500},
            400,
            ["does not implement", "recall_include_chunks (in Hindsight", "expand tool"],
        ),
        ({"recall_budget_fixed_low": -5}, 422, ["recall_budget_fixed_low"]),
        ({"recall_budget_fixed_high": 2001}, 422, ["recall_budget_fixed_high"]),
        ({"recall_budget_function": "fastest"}, 422, ["recall_budget_function"]),
        ({"recall_budget_adaptive_mid": "0.1"}, 422, ["recall_budget_adaptive_mid"]),
        ({"recall_budget_adaptive_low": 0}, 422, ["recall_budget_adaptive_low"]),
        ({"recall_max_tokens": 0}, 422, ["recall_max_tokens"]),
        ({"recall_semantic_weight": 1.5}, 422, ["recall_semantic_weight"]),
        ({"recall_speaker_weight": -0.1}, 422, ["recall_speaker_weight"]),
        ({"recall_temporal_weight": 11}, 422, ["recall_temporal_weight"]),
        ({"HINDSIGHT_API_RECALL_BUDGET_MIN": -1}, 400, ["recall_budget_min"]),
        ({"colour": "red"}, 400, ["unknown settings", "'colour'"]),
        (
            {"enable_reranking": False, "memory_defense": {}, "mood": 1},
            400,
            ["memory_defense", "'mood'"],
        ),
        ({"enable_reranking": 0}, 422, ["enable_reranking"]),
        ({"disposition_empathy": 6}, 422, ["disposition_empathy"]),
        ({"mcp_enabled_tools": ["rm_rf"]}, 422, ["mcp_enabled_tools"]),
        ({"retain_extraction_mode": "custom"}, 422, ["retain_extraction_mode"]),
        ({"consolidation_strategies": [{"max_observations": 3}]}, 422, ["max_observations"]),
        ({"HINDSIGHT_API_ENABLE_RERANKING": "no"}, 400, ["enable_reranking"]),
        (
            {"enable_reranking": True, "HINDSIGHT_API_ENABLE_RERANKING": False},
            400,
            ["enable_reranking is given twice"],
        ),
        ({f"knob{i}": i for i in range(40)}, 400, ["'knob9', and 30 more"]),
    ],
)
def test_refused_settings_are_named_and_nothing_changes(
    http: httpx.Client, bank: str, updates: dict[str, Any], status: int, needles: list[str]
) -> None:
    before = config_of(http, bank)
    r = patch(http, bank, updates)
    assert r.status_code == status, r.text
    for needle in needles:
        assert needle in r.text, r.text
    assert config_of(http, bank) == before


def test_the_client_gets_a_400_for_a_setting_heed_does_not_implement(
    client: Hindsight, http: httpx.Client, bank: str
) -> None:
    with pytest.raises(aiohttp.ClientResponseError) as refused:
        client.update_bank_config(bank, retain_chunk_size=800, enable_reranking=False)
    assert refused.value.status == 400
    assert config_of(http, bank)["overrides"] == {}
    with pytest.raises(aiohttp.ClientResponseError) as missing:
        client.get_bank_config("no-such-bank")
    assert missing.value.status == 404


def test_every_hindsight_setting_is_honoured_or_refused_by_name() -> None:
    """hindsight-client 1.1.0's update_bank_config names no setting heed would drop."""
    import inspect

    offered = set(inspect.signature(Hindsight.update_bank_config).parameters) - {"self", "bank_id"}
    assert offered <= set(SETTINGS) | set(NOT_IMPLEMENTED), offered - set(SETTINGS)
    assert not set(SETTINGS) & set(NOT_IMPLEMENTED)


# -- create_bank's fields follow the same rule ------------------------------------------------


def test_create_bank_refuses_what_heed_does_not_implement_and_creates_nothing(
    client: Hindsight, http: httpx.Client
) -> None:
    bank = "config-" + uuid.uuid4().hex[:8]
    with pytest.raises(aiohttp.ClientResponseError) as refused:
        client.create_bank(bank, retain_chunk_size=1000, enable_reranking=False)
    assert refused.value.status == 400
    assert http.get(f"/v1/default/banks/{bank}").status_code == 404
    r = http.put(f"/v1/default/banks/{bank}", json={"name": "x", "some_new_field": 1})
    assert r.status_code == 400 and "'some_new_field'" in r.text, r.text
    assert http.get(f"/v1/default/banks/{bank}").status_code == 404

    made = client.create_bank(bank, reflect_mission="Help Alice.", enable_graph_retrieval=False)
    assert made.mission == "Help Alice."
    r = http.put(
        f"/v1/default/banks/{bank}",
        json={"recall_prefer_observations": True, "mcp_enabled_tools": ["recall"]},
    )
    assert r.status_code == 200, r.text
    assert config_of(http, bank)["overrides"] == {
        "reflect_mission": "Help Alice.",
        "enable_graph_retrieval": False,
        "recall_prefer_observations": True,
        "mcp_enabled_tools": ["recall"],
    }
    r = http.patch(f"/v1/default/banks/{bank}", json={"name": "y", "store_document_text": True})
    assert r.status_code == 400 and "store_document_text" in r.text
    assert http.get(f"/v1/default/banks/{bank}").json()["name"] == bank


# -- what the settings do ---------------------------------------------------------------------


def test_recall_runs_only_the_arms_the_bank_enables(
    client: Hindsight, http: httpx.Client, bank: str
) -> None:
    client.retain(bank, "Alice adopted a cat named Pixel in Lyon.")

    def arms() -> set[str]:
        r = http.post(
            f"/v1/default/banks/{bank}/memories/recall",
            json={"query": "Alice cat Pixel", "trace": True},
        )
        assert r.status_code == 200, r.text
        stage = next(s for s in r.json()["trace"]["stages"] if s["stage"] == "retrieval")
        return set(stage["arms"])

    assert {"semantic", "keyword", "graph"} <= arms()
    client.update_bank_config(bank, enable_text_search=False, enable_graph_retrieval=False)
    assert arms() == {"semantic"}
    client.reset_bank_config(bank)
    assert {"semantic", "keyword", "graph"} <= arms()


def test_the_recall_budget_settings_size_each_recall(
    client: Hindsight, http: httpx.Client, bank: str
) -> None:
    # No consolidation: it would be work in the background of the tests after this one.
    client.update_bank_config(bank, enable_observations=False)
    client.retain_batch(
        bank, [{"content": f"Alice's cat number {i} is called Pixel-{i}."} for i in range(8)]
    )

    def size(**body: Any) -> tuple[dict[str, Any], int]:
        """The size the recall's trace reports, and how many units its semantic arm found."""
        r = http.post(
            f"/v1/default/banks/{bank}/memories/recall",
            json={"query": "Alice cat Pixel", "trace": True, **body},
        )
        assert r.status_code == 200, r.text
        trace = r.json()["trace"]
        stage = next(s for s in trace["stages"] if s["stage"] == "retrieval")
        keys = ("budget", "budget_function", "candidates_per_arm", "candidates_reranked")
        return {k: trace["query"][k] for k in keys}, stage["arms"]["semantic"]

    assert size(budget="low") == (
        {
            "budget": "low",
            "budget_function": "fixed",
            "candidates_per_arm": 40,
            "candidates_reranked": 30,
        },
        8,
    )

    # hindsight-client's update_bank_config sends them; GET shows them; the recall follows.
    changed = client.update_bank_config(bank, recall_budget_fixed_low=3, recall_budget_fixed_mid=5)
    assert changed["overrides"] == {
        "enable_observations": False,
        "recall_budget_fixed_low": 3,
        "recall_budget_fixed_mid": 5,
    }
    assert config_of(http, bank) == changed
    assert changed["config"]["recall_budget_fixed_high"] == 300
    assert size(budget="low") == (
        {
            "budget": "low",
            "budget_function": "fixed",
            "candidates_per_arm": 3,
            "candidates_reranked": 3,
        },
        3,
    )
    assert size()[0]["candidates_per_arm"] == 5  # mid, the default budget
    assert size(budget="high")[0]["candidates_per_arm"] == 300

    # adaptive: a share of the recall's own max_tokens, within recall_budget_min/max.
    r = patch(
        http,
        bank,
        {
            "recall_budget_function": "adaptive",
            "recall_budget_adaptive_low": 0.01,
            "recall_budget_min": 2,
            "recall_budget_max": 6,
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["config"]["recall_budget_function"] == "adaptive"
    assert size(budget="low", max_tokens=400) == (
        {
            "budget": "low",
            "budget_function": "adaptive",
            "candidates_per_arm": 4,
            "candidates_reranked": 3,
        },
        4,
    )
    assert size(budget="low", max_tokens=100)[1] == 2  # round(1.0): the floor
    assert size(budget="low", max_tokens=4096)[1] == 6  # round(40.96): the ceiling
    traced = client.recall(bank, "Alice cat Pixel", budget="low", max_tokens=500, trace=True)
    assert traced.trace is not None and traced.trace["query"]["candidates_per_arm"] == 5

    client.reset_bank_config(bank)
    assert size(budget="low")[0]["candidates_per_arm"] == 40


def test_recall_max_tokens_is_the_token_budget_of_reflects_recalls(
    server: LiveServer, client: Hindsight, http: httpx.Client, bank: str
) -> None:
    server.app.state.services.reflect.provider = ScriptedProvider(
        {"replies": [{"text": "Pixel is Alice's cat."}]}
    )
    client.update_bank_config(bank, enable_observations=False)
    client.retain(bank, "Alice adopted a cat named Pixel in Lyon.")

    def used() -> list[str]:
        answer = client.reflect(bank, "What is Alice's cat called?", include_facts=True)
        return [m.text for m in (answer.based_on.memories if answer.based_on else None) or []]

    assert used() == ["Alice adopted a cat named Pixel in Lyon."]
    client.update_bank_config(bank, recall_max_tokens=1)  # no memory fits in one token
    assert used() == []
    assert patch(http, bank, {"recall_max_tokens": None}).is_success  # back to the default
    assert used() == ["Alice adopted a cat named Pixel in Lyon."]


def test_recall_prefer_observations_is_the_default_of_a_recall_that_does_not_say(
    server: LiveServer, client: Hindsight, http: httpx.Client
) -> None:
    script(server, EXTRACTION, CONSOLIDATION)
    bank = "config-" + uuid.uuid4().hex[:8]
    client.create_bank(bank)
    client.retain(bank, "\n".join(TURNS), context="chat")

    def observations() -> list[dict[str, Any]]:
        r = http.get(f"/v1/default/banks/{bank}/memories/list", params={"type": "observation"})
        items: list[dict[str, Any]] = r.json()["items"]
        return items

    [observation] = wait_for(observations, seconds=30)
    sources = set(observation["source_memory_ids"])
    types = ["world", "experience", "observation"]

    def recalled(**kw: Any) -> set[str]:
        return {r.id for r in client.recall(bank, "Caroline's dog Rex", types=types, **kw).results}

    assert sources <= recalled()  # the default: facts and their observation
    client.update_bank_config(bank, recall_prefer_observations=True)
    preferred = recalled()
    assert observation["id"] in preferred and not preferred & sources
    assert sources <= recalled(prefer_observations=False)  # a recall that says wins


def test_reflect_says_the_bank_mission_and_disposition(
    server: LiveServer, client: Hindsight, bank: str
) -> None:
    provider = ScriptedProvider({"replies": [{"text": "unused"}, {"text": "Two cats."}]})
    server.app.state.services.reflect.provider = provider
    client.update_bank_config(
        bank, reflect_mission="Answer as Alice's vet.", disposition_skepticism=5
    )
    client.reflect(bank, "How many cats?")
    system = provider.requests[-1].messages[0].content
    assert "Bank mission: Answer as Alice's vet." in system
    assert "Disposition (1-5): skepticism 5, literalism 3, empathy 3" in system
    client.reset_bank_config(bank)
    client.reflect(bank, "How many cats?")
    system = provider.requests[-1].messages[0].content
    assert "Bank mission" not in system and "Disposition" not in system


def test_a_bank_minimum_refresh_interval_holds_its_mental_models_back(
    server: LiveServer, http: httpx.Client, bank: str
) -> None:
    provider = ScriptedProvider({"replies": [{"text": "unused"}, {"text": "Alice has cats."}]})
    server.app.state.services.reflect.provider = provider
    base = f"/v1/default/banks/{bank}/mental-models"
    made = http.post(base, json={"name": "Alice", "source_query": "Who is Alice?"})
    assert made.status_code == 200, made.text
    run = made.json()["operation_id"]
    wait_for(lambda: http.get(f"/v1/runs/{run}").json()["phase"] == "completed", 30)
    refresh = f"{base}/{made.json()['mental_model_id']}/refresh"

    assert patch(http, bank, {"mental_model_min_refresh_interval_seconds": 3600}).is_success
    early = http.post(refresh)
    assert early.status_code == 409 and "retry-after" in early.headers, early.text
    assert patch(http, bank, {"mental_model_min_refresh_interval_seconds": None}).is_success
    assert http.post(refresh).status_code == 200  # the server's default: no interval


# -- mcp_enabled_tools --------------------------------------------------------------------------


def _text(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


async def test_mcp_enabled_tools_lets_only_the_listed_tools_act_on_the_bank(
    server: LiveServer,
) -> None:
    bank, other = ("config-" + uuid.uuid4().hex[:8] for _ in range(2))
    item = {"items": [{"content": "Bob likes skiing."}]}
    async with (
        httpx.AsyncClient(base_url=server.url, timeout=30) as http,
        httpx2.AsyncClient(timeout=httpx2.Timeout(30.0, read=60.0)) as mcp_http,
        Client(streamable_http_client(f"{server.url}/mcp", http_client=mcp_http)) as mcp,
    ):
        for bank_id in (bank, other):
            assert (await http.put(f"/v1/default/banks/{bank_id}", json={})).status_code == 200
        body = {"items": [{"content": "Alice has two cats."}]}
        assert (await http.post(f"/v1/default/banks/{bank}/memories", json=body)).is_success
        config = f"/v1/default/banks/{bank}/config"
        set_tools = await http.patch(config, json={"updates": {"mcp_enabled_tools": ["recall"]}})
        assert set_tools.status_code == 200, set_tools.text

        tools = sorted(t.name for t in (await mcp.list_tools()).tools)
        assert tools == sorted(MCP_TOOLS)  # the names a bank may list are the server's tools
        recalled = await mcp.call_tool("recall", {"bank_id": bank, "query": "cats"})
        assert not recalled.is_error and recalled.structured_content["results"]
        for tool, arguments in (
            ("retain", {"bank_id": bank, **item}),
            ("reflect", {"bank_id": bank, "query": "cats?"}),
            ("start_turn", {"bank_id": bank, "message": "hi"}),
            ("create_bank", {"bank_id": bank, "name": "renamed"}),
        ):
            refused = await mcp.call_tool(tool, arguments)
            assert refused.is_error, tool
            assert f"'{tool}' is not enabled for bank '{bank}'" in _text(refused)
        elsewhere = await mcp.call_tool("retain", {"bank_id": other, **item})
        assert not elsewhere.is_error  # a bank that lists no tools: every tool may act
        listed = (await http.get(f"/v1/default/banks/{bank}/memories/list")).json()["items"]
        assert [m["text"] for m in listed] == ["Alice has two cats."]
        assert (await http.get(f"/v1/default/banks/{bank}")).json()["name"] == bank
        sessions = (await http.get("/v1/sessions")).json()["sessions"]
        assert not [x for x in sessions if x.get("bank_id") == bank]  # refused before any

        none = await http.patch(config, json={"updates": {"mcp_enabled_tools": []}})
        assert none.status_code == 200
        refused = await mcp.call_tool("recall", {"bank_id": bank, "query": "cats"})
        assert refused.is_error and "(its mcp_enabled_tools: none)" in _text(refused)
        back = await http.patch(config, json={"updates": {"mcp_enabled_tools": None}})
        assert back.json()["overrides"] == {}
        assert not (await mcp.call_tool("recall", {"bank_id": bank, "query": "cats"})).is_error


def test_get_config_shows_the_settings_the_engine_applies(
    server: LiveServer, client: Hindsight, http: httpx.Client, bank: str
) -> None:
    engine = server.app.state.services.memory

    def applied() -> dict[str, Any]:
        """What the engine applies to the bank now (its one reader of a bank's settings)."""
        row = engine.store.get_bank("default", bank)
        assert row is not None
        settings: dict[str, Any] = engine.settings(row).as_dict()
        return settings

    assert config_of(http, bank)["config"] == applied() == DEFAULTS
    changed = client.update_bank_config(
        bank,
        enable_observations=False,
        recall_budget_fixed_mid=7,
        reflect_mission="Answer as a nurse.",
        disposition_empathy=5,
        mental_model_min_refresh_interval_seconds=60,
    )
    shown = config_of(http, bank)["config"]
    assert shown == changed["config"] == applied()
    assert shown != DEFAULTS
    assert (shown["enable_observations"], shown["recall_budget_fixed_mid"]) == (False, 7)
    assert shown["mental_model_min_refresh_interval_seconds"] == 60
