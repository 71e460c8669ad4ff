"""``POST .../consolidation-strategies/preview`` (the client's
``MemoryApi.preview_consolidation_strategies``) on a real server, on SQLite and PostgreSQL:
a draft of the bank's ``consolidation_strategies`` previewed over the observation scopes a
real consolidation wrote (the scripted provider creating a set number of observations per
scope), with consolidation's first-strategy-wins rule; a bad draft is a 400 naming its
problem, an unknown bank a 404, and nothing is saved.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hindsight_client_api.api.memory_api import MemoryApi
from hindsight_client_api.api_client import ApiClient
from hindsight_client_api.configuration import Configuration
from hindsight_client_api.models.consolidation_strategies_preview import (
    ConsolidationStrategiesPreview,
)
from hindsight_client_api.models.consolidation_strategies_preview_request import (
    ConsolidationStrategiesPreviewRequest,
)

from heed.llm import ScriptedProvider
from heed.memory.learning import strategy_preview
from tests.pg_support import DATABASES, heed_server
from tests.support import LiveServer, wait_for

#: (content, tags, observations the scripted consolidation creates for it)
ITEMS: list[tuple[str, list[str], int]] = [
    ("alpha one happened", ["user:a", "topic:x"], 3),
    ("bravo two happened", ["user:b"], 2),
    ("charlie three happened", [], 1),
    ("delta four happened", ["topic:y"], 1),
]


def _creates(content: str, n: int) -> dict[str, Any]:
    # The observations' texts must not hold *content*: the global scope's prompt lists
    # related observations, and "when" matches anywhere in it.
    actions = [{"action": "create", "text": f"note {i} of {n}", "facts": [0]} for i in range(n)]
    return {"when": content, "json": {"actions": actions}}


@pytest.fixture(params=DATABASES, scope="module")
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    with heed_server(
        request.param,
        tmp_path_factory.mktemp("preview"),
        llm_provider="scripted",
        retain_extraction="off",
        observations="on",
        consolidation_debounce_seconds=0.05,
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def bank(server: LiveServer) -> str:
    """A bank whose observations live in four scopes (3, 2, 1 and 1 observations)."""
    provider = ScriptedProvider({"replies": [_creates(c, n) for c, _, n in ITEMS]})
    server.app.state.services.retain_provider.current = provider
    bank = "preview-" + uuid.uuid4().hex[:8]
    httpx.put(f"{server.url}/v1/default/banks/{bank}", json={}, timeout=30).raise_for_status()
    for content, tags, _ in ITEMS:
        httpx.post(
            f"{server.url}/v1/default/banks/{bank}/memories",
            json={"items": [{"content": content, "tags": tags}]},
            timeout=30,
        ).raise_for_status()

    def scopes() -> bool:
        found = httpx.get(f"{server.url}/v1/default/banks/{bank}/observations/scopes", timeout=10)
        return sum(s["count"] for s in found.json()["scopes"]) == 7

    wait_for(scopes, seconds=30)
    return bank


def _preview(
    server: LiveServer, bank: str, strategies: list[dict[str, Any]], sample_limit: int = 5
) -> ConsolidationStrategiesPreview:
    async def call() -> ConsolidationStrategiesPreview:
        async with ApiClient(Configuration(host=server.url)) as api_client:
            request = ConsolidationStrategiesPreviewRequest.from_dict(
                {"strategies": strategies, "sample_limit": sample_limit}
            )
            assert request is not None
            return await MemoryApi(api_client).preview_consolidation_strategies(bank, request)

    return asyncio.run(call())


DRAFT: list[dict[str, Any]] = [
    {"scopes": [{"tags": ["user:*"]}], "observations_mission": "people"},
    {"scopes": [{"tags": ["topic:*"]}, {"tags": []}], "observations_mission": "topics"},
    {"scopes": [], "observations_mission": "never"},
]


def test_each_strategy_claims_the_scopes_consolidation_would_give_it(
    server: LiveServer, bank: str
) -> None:
    found = _preview(server, bank, DRAFT)
    assert found.scopes_scanned == 4
    assert found.complete is True
    users, topics, empty = found.strategies
    assert (users.active, users.claimed_count) == (True, 2)
    [rule] = users.rules
    assert (rule.match_count, rule.taken_count, rule.observation_count) == (2, 0, 5)
    assert [(s.tags, s.count, s.handled_by) for s in rule.samples] == [
        (["topic:x", "user:a"], 3, 0),
        (["user:b"], 2, 0),
    ]
    # topic:x's scope is the first strategy's: taken, so the second claims topic:y only.
    assert (topics.active, topics.claimed_count) == (True, 1)
    topic_rule, unfinished = topics.rules
    assert (topic_rule.match_count, topic_rule.taken_count) == (2, 1)
    assert topic_rule.observation_count == 4
    assert [(s.tags, s.handled_by) for s in topic_rule.samples] == [
        (["topic:x", "user:a"], 0),
        (["topic:y"], 1),
    ]
    assert (unfinished.match_count, unfinished.samples) == (0, [])
    assert (empty.active, empty.claimed_count, empty.rules) == (False, 0, [])
    assert found.default.match_count == 1
    assert found.default.observation_count == 1
    assert [(s.tags, s.handled_by) for s in found.default.samples] == [([], None)]


def test_sample_limit_and_any_match(server: LiveServer, bank: str) -> None:
    draft = [{"scopes": [{"tags": ["user:a", "topic:*"], "tags_match": "any"}]}]
    found = _preview(server, bank, draft, sample_limit=1)
    [rule] = found.strategies[0].rules
    assert rule.match_count == 2  # user:a+topic:x and topic:y
    assert [s.tags for s in rule.samples] == [["topic:x", "user:a"]]  # the most populous
    assert found.default.match_count == 2
    assert len(found.default.samples) == 1
    # "all" (the default) needs every pattern to match a tag of the scope.
    every = _preview(server, bank, [{"scopes": [{"tags": ["user:a", "topic:*"]}]}])
    assert every.strategies[0].rules[0].match_count == 1


def test_a_bad_draft_is_refused_naming_its_problem_and_nothing_is_saved(
    server: LiveServer, bank: str
) -> None:
    url = f"{server.url}/v1/default/banks/{bank}/consolidation-strategies/preview"
    cases: list[tuple[Any, str]] = [
        ([{"scopes": [{"tags": ["a"], "tags_match": "some"}]}], "strategies[0].scopes[0]"),
        ([{"max_observations_per_scope": 3}], "max_observations_per_scope"),
        ([{"scopes": [{"tags": "user:*"}]}], "strategies[0].scopes[0].tags"),
    ]
    for strategies, named in cases:
        response = httpx.post(url, json={"strategies": strategies}, timeout=10)
        assert response.status_code == 400, response.text
        assert named in response.json()["detail"]
    response = httpx.post(url, json={"strategies": [], "sample_limit": 51}, timeout=10)
    assert response.status_code == 422
    config = httpx.get(f"{server.url}/v1/default/banks/{bank}/config", timeout=10).json()
    assert config["config"]["consolidation_strategies"] == []
    gone = httpx.post(
        f"{server.url}/v1/default/banks/no-such-bank/consolidation-strategies/preview",
        json={"strategies": []},
        timeout=10,
    )
    assert gone.status_code == 404


def test_the_scan_is_bounded_and_says_when_it_is_incomplete(
    server: LiveServer, bank: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(strategy_preview, "SCAN_LIMIT", 2)
    found = _preview(server, bank, [{"scopes": [{"tags": ["*"]}]}])
    assert (found.scopes_scanned, found.complete) == (2, False)
    assert found.strategies[0].claimed_count == 2  # the two most populous scopes
    assert [s.count for s in found.strategies[0].rules[0].samples] == [3, 2]


def test_the_bank_setting_accepts_an_unimplemented_strategy_setting_only_as_null(
    server: LiveServer, bank: str
) -> None:
    url = f"{server.url}/v1/default/banks/{bank}/config"
    strategy = {"scopes": [{"tags": ["user:*"]}], "observations_mission": "people"}
    nulls = {**strategy, "max_observations_per_scope": None}
    try:
        ok = httpx.patch(url, json={"updates": {"consolidation_strategies": [nulls]}}, timeout=10)
        assert ok.status_code == 200, ok.text
        assert ok.json()["config"]["consolidation_strategies"] == [strategy]
        set_ = {**strategy, "consolidation_source_facts_max_tokens": 100}
        refused = httpx.patch(
            url, json={"updates": {"consolidation_strategies": [set_]}}, timeout=10
        )
        assert refused.status_code in (400, 422)
        assert "consolidation_source_facts_max_tokens" in refused.text
    finally:
        reset = {"updates": {"consolidation_strategies": None}}
        httpx.patch(url, json=reset, timeout=10).raise_for_status()
