"""Directives end to end: hindsight-client's own methods against a real server on SQLite and
PostgreSQL, reflect and bank-bound chat turns saying them to the model, and bad input.

The scripted provider records every request, so the tests read the prompts the model was
given. Which directives apply (:mod:`heed.memory.directives.rules`) is checked case by case at the
end, as the pure rule it is.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hindsight_client import Hindsight
from hindsight_client_api.exceptions import NotFoundException

from heed.api.app import create_app
from heed.llm import ScriptedProvider
from heed.llm.grounding import ANSWER_FROM_MEMORIES
from heed.memory.directives.rules import (
    MAX_DIRECTIVES,
    RULES_HEADING,
    Directive,
    DirectiveScope,
    rules_text,
    select,
)
from heed.settings import Settings
from tests.pg_support import fresh_schema
from tests.support import LiveServer, live_server, wait_for

FACTS = ["Alice has two cats named Tom and Luna.", "Alice works as a nurse in Lyon."]
FRENCH = "Always answer in French."
PROJECT = "Mention the project code X-17."
SILENT = "Never mention the weather."


@pytest.fixture(params=["sqlite", "postgresql"], scope="module")
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    def settings(url: str | None) -> Settings:
        return Settings(
            data_dir=tmp_path_factory.mktemp("directives"),
            database_url=url,
            llm_provider="scripted",
            llm_script=json.dumps({"token_delay": 0, "replies": []}),
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
def bank(client: Hindsight) -> str:
    bank_id = "rules-" + uuid.uuid4().hex[:8]
    client.create_bank(bank_id)
    client.retain_batch(bank_id, [{"content": fact} for fact in FACTS])
    return bank_id


def reflect_provider(server: LiveServer, script: dict[str, Any]) -> ScriptedProvider:
    provider = ScriptedProvider(script)
    server.app.state.services.reflect.provider = provider
    return provider


def system_prompts(provider: ScriptedProvider) -> list[str]:
    return [r.messages[0].content for r in provider.requests if r.messages[0].role == "system"]


# -- the client's methods --------------------------------------------------------------------


def all_directives(http: httpx.Client, bank: str, **params: Any) -> dict[str, Any]:
    """The bank's directives, inactive ones too (the client's sync methods do not ask)."""
    r = http.get(f"/v1/default/banks/{bank}/directives", params={"active_only": "false", **params})
    assert r.status_code == 200, r.text
    listing: dict[str, Any] = r.json()
    return listing


def test_create_list_get_update_delete_through_the_client(
    client: Hindsight, http: httpx.Client, bank: str
) -> None:
    made = client.create_directive(bank, name="french", content=FRENCH)
    assert (made.bank_id, made.name, made.content) == (bank, "french", FRENCH)
    assert made.priority == 0 and made.is_active is True and made.tags == []
    assert made.created_at and made.created_at == made.updated_at
    top = client.create_directive(bank, name="x17", content=PROJECT, priority=5, tags=["p:x"])
    off = client.create_directive(bank, name="weather", content=SILENT, is_active=False)

    listed = client.list_directives(bank)
    assert [d.id for d in listed.items] == [top.id, made.id]  # active only, priority first
    assert (listed.total, listed.limit, listed.offset) == (2, 100, 0)
    everything = all_directives(http, bank)
    assert [d["id"] for d in everything["items"]] == [top.id, made.id, off.id]
    page = all_directives(http, bank, limit=1, offset=1)
    assert [d["id"] for d in page["items"]] == [made.id] and page["total"] == 3
    # In a tag scope: the untagged directives and the tagged ones it matches.
    assert [d.id for d in client.list_directives(bank, tags=["p:x"]).items] == [top.id, made.id]
    assert [d.id for d in client.list_directives(bank, tags=["p:y"]).items] == [made.id]

    got = client.get_directive(bank, top.id)
    assert got == top
    renamed = client.update_directive(bank, top.id, name="project")
    assert (renamed.name, renamed.content, renamed.priority, renamed.tags) == (
        "project",
        PROJECT,
        5,
        ["p:x"],
    )
    assert renamed.updated_at >= top.updated_at and renamed.created_at == top.created_at
    cleared = client.update_directive(bank, top.id, tags=[], priority=-1, is_active=False)
    assert (cleared.tags, cleared.priority, cleared.is_active, cleared.name) == (
        [],
        -1,
        False,
        "project",
    )
    assert [d.id for d in client.list_directives(bank).items] == [made.id]

    client.delete_directive(bank, top.id)
    with pytest.raises(NotFoundException):
        client.get_directive(bank, top.id)
    with pytest.raises(NotFoundException):
        client.delete_directive(bank, top.id)
    assert all_directives(http, bank)["total"] == 2


def test_deleting_the_bank_deletes_its_directives(
    client: Hindsight, http: httpx.Client, bank: str
) -> None:
    made = client.create_directive(bank, name="french", content=FRENCH)
    client.delete_bank(bank)
    with pytest.raises(NotFoundException):
        client.list_directives(bank)
    client.create_bank(bank)  # the same id, a new bank
    assert all_directives(http, bank)["total"] == 0
    with pytest.raises(NotFoundException):
        client.get_directive(bank, made.id)


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"name": "  ", "content": FRENCH}, 400, "name is empty"),
        ({"name": "n", "content": " \n "}, 400, "content is empty"),
        ({"name": "n", "content": "x" * 5001}, 422, "content"),
        ({"name": "n", "content": FRENCH, "tags": [" "]}, 400, "tags[0] is empty"),
        ({"name": "n", "content": FRENCH, "priority": 2**31}, 422, "priority"),
        ({"name": "n", "content": FRENCH, "priority": "1"}, 422, "priority"),
        ({"name": "n", "content": FRENCH, "is_active": 1}, 422, "is_active"),
        ({"name": "n", "content": FRENCH, "scope": "global"}, 422, "scope"),
        ({"content": FRENCH}, 422, "name"),
    ],
)
def test_bad_directives_are_named_and_write_nothing(
    http: httpx.Client, bank: str, body: dict[str, Any], status: int, needle: str
) -> None:
    r = http.post(f"/v1/default/banks/{bank}/directives", json=body)
    assert r.status_code == status, r.text
    assert needle in r.text
    listed = http.get(f"/v1/default/banks/{bank}/directives", params={"active_only": "false"})
    assert listed.json()["total"] == 0


def test_bad_updates_and_unknown_ids_change_nothing(http: httpx.Client, bank: str) -> None:
    base = f"/v1/default/banks/{bank}/directives"
    made = http.post(base, json={"name": "french", "content": FRENCH}).json()
    for body, status, needle in (
        ({"content": ""}, 422, "content"),
        ({"name": "\t"}, 400, "name is empty"),
        ({"tags": ["ok", ""]}, 422, "tags"),
        ({"colour": "red"}, 422, "colour"),
    ):
        r = http.patch(f"{base}/{made['id']}", json=body)
        assert r.status_code == status and needle in r.text, (body, r.text)
    assert http.get(f"{base}/{made['id']}").json() == made
    missing = http.patch(f"{base}/nope", json={"name": "x"})
    assert missing.status_code == 404 and "'nope'" in missing.text
    assert http.delete(f"{base}/nope").status_code == 404
    assert http.get("/v1/default/banks/no-such-bank/directives").status_code == 404
    gone = http.post(
        "/v1/default/banks/no-such-bank/directives", json={"name": "n", "content": "c"}
    )
    assert gone.status_code == 404 and "no-such-bank" in gone.text


def test_a_bank_holds_at_most_max_directives(http: httpx.Client, bank: str) -> None:
    base = f"/v1/default/banks/{bank}/directives"
    for i in range(MAX_DIRECTIVES):
        assert http.post(base, json={"name": f"r{i}", "content": f"rule {i}"}).status_code == 200
    refused = http.post(base, json={"name": "one more", "content": "rule"})
    assert refused.status_code == 400 and str(MAX_DIRECTIVES) in refused.text
    assert http.get(base, params={"limit": 1000}).json()["total"] == MAX_DIRECTIVES


# -- reflect and chat turns say them ---------------------------------------------------------


def test_reflect_says_the_directives_that_apply_and_cites_them(
    server: LiveServer, client: Hindsight, bank: str
) -> None:
    french = client.create_directive(bank, name="french", content=FRENCH, priority=1)
    project = client.create_directive(bank, name="x17", content=PROJECT, priority=9, tags=["p:x"])
    client.create_directive(bank, name="weather", content=SILENT, is_active=False)
    provider = reflect_provider(
        server, {"replies": [{"text": "unused"}, {"text": "Elle a deux chats."}]}
    )

    answer = client.reflect(bank, "How many cats does Alice have?", include_facts=True)
    assert answer.text == "Elle a deux chats."
    [system] = system_prompts(provider)
    assert RULES_HEADING in system and f"1. {FRENCH}" in system
    assert PROJECT not in system and SILENT not in system  # tagged, inactive
    assert answer.based_on is not None
    assert [(d.id, d.name, d.content) for d in answer.based_on.directives or []] == [
        (french.id, "french", FRENCH)
    ]

    # A reflect in the directive's tag scope says it too, first (its priority is higher).
    provider.requests.clear()
    scoped = client.reflect(bank, "How many cats?", tags=["p:x"], include_facts=True)
    [system] = system_prompts(provider)
    assert system.index(f"1. {PROJECT}") < system.index(f"2. {FRENCH}")
    assert [d.id for d in scoped.based_on.directives or []] == [project.id, french.id]
    # apply_all_directives: every active one, whatever the tags.
    provider.requests.clear()
    everything = client.reflect(
        bank, "How many cats?", apply_all_directives=True, include_facts=True
    )
    assert [d.id for d in everything.based_on.directives or []] == [project.id, french.id]
    assert SILENT not in system_prompts(provider)[0]
    # Without include_facts there is no based_on, as before.
    assert client.reflect(bank, "How many cats?").based_on is None


def test_a_model_without_tools_gets_the_directives_with_the_memories(
    server: LiveServer, client: Hindsight, bank: str
) -> None:
    client.create_directive(bank, name="french", content=FRENCH)
    provider = reflect_provider(
        server, {"follows_tools": False, "replies": [{"text": "Elle a deux chats."}]}
    )
    answer = client.reflect(bank, "How many cats does Alice have?", include_facts=True)
    assert answer.text == "Elle a deux chats."
    [system] = system_prompts(provider)
    assert system.startswith(ANSWER_FROM_MEMORIES) and f"1. {FRENCH}" in system
    assert [d.content for d in answer.based_on.directives or []] == [FRENCH]


def test_a_streamed_reflect_cites_its_directives_in_the_result(
    server: LiveServer, client: Hindsight, http: httpx.Client, bank: str
) -> None:
    french = client.create_directive(bank, name="french", content=FRENCH)
    reflect_provider(server, {"replies": [{"text": "unused"}, {"text": "Deux."}]})
    body = {"query": "How many cats?", "stream": True, "include": {"facts": {}}}
    with http.stream("POST", f"/v1/default/banks/{bank}/reflect", json=body) as r:
        assert r.status_code == 200
        run_id = r.headers["X-Heed-Run-Id"]
        r.read()
    run = wait_for(
        lambda: (x := http.get(f"/v1/runs/{run_id}").json())["phase"] == "completed" and x
    )
    assert [d["id"] for d in run["result"]["based_on"]["directives"]] == [french.id]


def test_a_bank_bound_chat_turn_says_the_global_directives(
    server: LiveServer, client: Hindsight, http: httpx.Client, bank: str
) -> None:
    french = client.create_directive(bank, name="french", content=FRENCH, priority=2)
    client.create_directive(bank, name="x17", content=PROJECT, tags=["p:x"])
    provider = ScriptedProvider({"replies": [{"text": "Bonjour."}]})
    server.app.state.services.turn_provider.current = provider
    session = http.post("/v1/sessions", json={"bank_id": bank}).json()["id"]
    run_id = http.post(f"/v1/sessions/{session}/turns", json={"content": "Hello"}).json()["run_id"]
    run = wait_for(
        lambda: (x := http.get(f"/v1/runs/{run_id}").json())["phase"] == "completed" and x
    )
    assert run["result"]["trace"]["directives"] == [french.id]
    system = provider.requests[-1].messages[0]
    assert system.role == "system" and system.content.endswith(rules_text_of([FRENCH]))
    assert PROJECT not in system.content
    # An unbound session says none.
    provider.requests.clear()
    alone = http.post("/v1/sessions", json={}).json()["id"]
    run_id = http.post(f"/v1/sessions/{alone}/turns", json={"content": "Hello"}).json()["run_id"]
    run = wait_for(
        lambda: (x := http.get(f"/v1/runs/{run_id}").json())["phase"] == "completed" and x
    )
    assert "directives" not in run["result"]["trace"]
    assert RULES_HEADING not in provider.requests[-1].messages[0].content


def test_a_chat_turn_of_a_model_without_tools_says_them_with_the_memories(
    server: LiveServer, client: Hindsight, http: httpx.Client, bank: str
) -> None:
    client.create_directive(bank, name="french", content=FRENCH)
    provider = ScriptedProvider({"follows_tools": False, "replies": [{"text": "Deux chats."}]})
    server.app.state.services.turn_provider.current = provider
    session = http.post("/v1/sessions", json={"bank_id": bank}).json()["id"]
    body = {"content": "How many cats does Alice have?"}
    run_id = http.post(f"/v1/sessions/{session}/turns", json=body).json()["run_id"]
    run = wait_for(
        lambda: (x := http.get(f"/v1/runs/{run_id}").json())["phase"] == "completed" and x
    )
    assert run["result"]["text"] == "Deux chats."
    system = provider.requests[-1].messages[0].content
    assert system.startswith(ANSWER_FROM_MEMORIES) and system.endswith(f"1. {FRENCH}")


def rules_text_of(contents: list[str]) -> str:
    return rules_text([Directive(str(i), "b", "n", c) for i, c in enumerate(contents)])


# -- which directives apply: the rule ---------------------------------------------------------


def _d(
    content: str, *tags: str, priority: int = 0, active: bool = True, age: str = "1"
) -> Directive:
    return Directive(content, "bank", content, content, priority, active, list(tags), age, age)


@pytest.mark.parametrize(
    ("scope", "applies"),
    [
        (DirectiveScope(), {"global"}),
        (DirectiveScope(["a"]), {"global", "a", "a+b"}),
        (DirectiveScope(["a", "c"], "any_strict"), {"global", "a", "a+b"}),
        (DirectiveScope(["a", "b"], "all"), {"global", "a+b"}),
        (DirectiveScope(["a"], "all_strict"), {"global", "a", "a+b"}),
        (DirectiveScope(["a"], "exact"), {"global", "a"}),
        (DirectiveScope(["z"]), {"global"}),
        (DirectiveScope(apply_all=True), {"global", "a", "a+b"}),
    ],
)
def test_which_directives_apply(scope: DirectiveScope, applies: set[str]) -> None:
    directives = [_d("global"), _d("a", "a"), _d("a+b", "a", "b"), _d("off", active=False)]
    assert {d.content for d in select(directives, scope)} == applies


def test_directives_are_said_by_priority_then_age_then_id() -> None:
    directives = [
        _d("late", priority=1, age="2"),
        _d("early", priority=1, age="1"),
        _d("low", priority=-3, age="0"),
        _d("top", priority=7, age="9"),
    ]
    assert [d.content for d in select(directives, DirectiveScope())] == [
        "top",
        "early",
        "late",
        "low",
    ]
    assert rules_text([]) == ""
    text = rules_text(select(directives, DirectiveScope()))
    assert text.splitlines() == [RULES_HEADING, "1. top", "2. early", "3. late", "4. low"]
