"""A refresh of a mental model whose sources have not changed is skipped without an LLM call,
end to end over HTTP on SQLite and PostgreSQL (issue 41: "a refresh of an unchanged mental
model costs 0 LLM tokens").

The reflect provider is the scripted one; its ``requests`` are the LLM calls made. Covered:
a second refresh of an unchanged model makes no LLM call, completes with ``skipped``, leaves
content and history alone and is counted in ``/metrics``; a retain outside the model's tag
scope still skips; a retain into the scope, a changed ``source_query``, a changed bank
mission, a new directive and a clear each make the next refresh ask the LLM again.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from heed.api.app import create_app
from heed.llm import ScriptedProvider
from heed.settings import Settings
from tests.pg_support import fresh_schema
from tests.support import LiveServer, live_server, wait_for

ANSWER = "Alice has two cats named Tom and Jerry."


@pytest.fixture(params=["sqlite", "postgresql"], scope="module")
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    def settings(url: str | None) -> Settings:
        return Settings(
            data_dir=tmp_path_factory.mktemp("skip"),
            database_url=url,
            llm_provider="scripted",
            mental_model_refresh_debounce_seconds=0.05,
            mental_model_min_refresh_interval_seconds=0,
        )

    if request.param == "sqlite":
        with live_server(create_app(settings(None))) as srv:
            yield srv
        return
    with fresh_schema() as url, live_server(create_app(settings(url))) as srv:
        yield srv


@pytest.fixture
def provider(server: LiveServer) -> ScriptedProvider:
    scripted = ScriptedProvider({"select": "turn", "replies": [{"text": ANSWER}]})
    server.app.state.services.reflect.provider = scripted
    return scripted


def _bank(server: LiveServer) -> str:
    bank = "skip-" + uuid.uuid4().hex[:8]
    httpx.put(f"{server.url}/v1/default/banks/{bank}", json={}, timeout=30).raise_for_status()
    return bank


def _retain(server: LiveServer, bank: str, content: str, tags: list[str]) -> None:
    httpx.post(
        f"{server.url}/v1/default/banks/{bank}/memories",
        json={"items": [{"content": content, "tags": tags}]},
        timeout=60,
    ).raise_for_status()


def _finished(server: LiveServer, run_id: str) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        run: dict[str, Any] = httpx.get(f"{server.url}/v1/runs/{run_id}", timeout=10).json()
        return run if run["phase"] in ("completed", "failed", "cancelled", "interrupted") else None

    result: dict[str, Any] = wait_for(ended, seconds=30)
    return result


def _model_url(server: LiveServer, bank: str, model_id: str) -> str:
    return f"{server.url}/v1/default/banks/{bank}/mental-models/{model_id}"


def _create(server: LiveServer, bank: str) -> str:
    response = httpx.post(
        f"{server.url}/v1/default/banks/{bank}/mental-models",
        json={"name": "Pets", "source_query": "What pets does Alice have?", "tags": ["pets"]},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    created = response.json()
    run = _finished(server, created["operation_id"])
    assert run["phase"] == "completed" and run["result"]["outcome"] == "content_written", run
    model_id: str = created["mental_model_id"]
    return model_id


def _refresh(
    server: LiveServer, provider: ScriptedProvider, bank: str, model_id: str
) -> tuple[dict[str, Any], int]:
    """A refresh by hand: its ended run's result and the LLM calls it made."""
    before = len(provider.requests)
    response = httpx.post(f"{_model_url(server, bank, model_id)}/refresh", timeout=30)
    assert response.status_code == 200, response.text
    run = _finished(server, response.json()["operation_id"])
    assert run["phase"] == "completed", run
    result: dict[str, Any] = run["result"]
    return result, len(provider.requests) - before


def _skipped_total(server: LiveServer) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    found = re.findall(
        r'^heed_mental_model_refresh_skipped_total\{trigger="manual"\} (\S+)$', text, re.M
    )
    assert found, "heed_mental_model_refresh_skipped_total is not exported"
    return float(found[0])


def test_an_unchanged_models_refresh_makes_no_llm_call_and_is_counted(
    server: LiveServer, provider: ScriptedProvider
) -> None:
    bank = _bank(server)
    _retain(server, bank, "Alice has two cats, Tom and Jerry.", ["pets"])
    model_id = _create(server, bank)
    assert provider.requests, "the first refresh asked the LLM"
    first = httpx.get(_model_url(server, bank, model_id), timeout=10).json()
    counted = _skipped_total(server)

    result, calls = _refresh(server, provider, bank, model_id)
    assert calls == 0
    assert result["skipped"] == "sources unchanged" and result["llm_calls"] == 0
    assert result["outcome"] == "content_preserved_no_new_facts"
    assert _skipped_total(server) == counted + 1
    after = httpx.get(_model_url(server, bank, model_id), timeout=10).json()
    assert after["content"] == first["content"] == ANSWER
    assert after["last_refreshed_at"] > first["last_refreshed_at"]
    history = httpx.get(f"{_model_url(server, bank, model_id)}/history", timeout=10).json()
    assert history == []

    # A memory outside the model's scope (another tag) is not one of its sources.
    _retain(server, bank, "Bob plays the violin.", ["music"])
    result, calls = _refresh(server, provider, bank, model_id)
    assert calls == 0 and result["skipped"] == "sources unchanged"


def test_a_retain_into_the_scope_makes_the_next_refresh_ask_the_llm(
    server: LiveServer, provider: ScriptedProvider
) -> None:
    bank = _bank(server)
    _retain(server, bank, "Alice has two cats, Tom and Jerry.", ["pets"])
    model_id = _create(server, bank)
    _retain(server, bank, "Alice adopted a hamster named Fluff.", ["pets"])
    result, calls = _refresh(server, provider, bank, model_id)
    assert calls > 0 and "skipped" not in result
    # ... and, nothing changed since, the one after it is skipped again.
    result, calls = _refresh(server, provider, bank, model_id)
    assert calls == 0 and result["skipped"] == "sources unchanged"


def test_a_changed_question_mission_directive_or_a_clear_asks_the_llm_again(
    server: LiveServer, provider: ScriptedProvider
) -> None:
    bank = _bank(server)
    _retain(server, bank, "Alice has two cats, Tom and Jerry.", ["pets"])
    model_id = _create(server, bank)
    url = _model_url(server, bank, model_id)

    def changed(change: Any) -> None:
        change()
        result, calls = _refresh(server, provider, bank, model_id)
        assert calls > 0 and "skipped" not in result, change
        result, calls = _refresh(server, provider, bank, model_id)
        assert calls == 0 and result["skipped"] == "sources unchanged", change

    changed(
        lambda: httpx.patch(
            url, json={"source_query": "Which animals live with Alice?"}, timeout=30
        ).raise_for_status()
    )
    changed(
        lambda: httpx.patch(
            f"{server.url}/v1/default/banks/{bank}/config",
            json={"updates": {"reflect_mission": "Keep track of Alice's household."}},
            timeout=30,
        ).raise_for_status()
    )
    changed(
        lambda: httpx.post(
            f"{server.url}/v1/default/banks/{bank}/directives",
            json={"name": "tone", "content": "Answer in one sentence."},
            timeout=30,
        ).raise_for_status()
    )
    changed(lambda: httpx.post(f"{url}/clear", timeout=30).raise_for_status())
    assert httpx.get(url, timeout=10).json()["content"] == ANSWER
