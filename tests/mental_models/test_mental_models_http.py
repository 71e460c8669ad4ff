"""Mental models and the knowledge base, end to end over HTTP on SQLite and PostgreSQL.

A real server on a socket; the reflect provider is the scripted one (an LLM is outside
heed), with ``latency`` where a refresh must be caught mid-call. Covered: a refresh run
writes the content and journals its progress; the unmodified ``hindsight-client`` drives
every mental-model and knowledge-base method; a cancel while processing stops the LLM call
(run cancelled, slot freed, content unchanged); a bank delete during a refresh stops it and
leaves nothing; a dry run writes nothing; the history grows and is bounded; the minimum
interval refuses an early refresh; a retain triggers a refresh; reflect cites a mental
model and ``exclude_*`` leave it out; the tree, search, export and delete of a folder with
its children.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hindsight_client import Hindsight

from heed.api.app import create_app
from heed.llm import ScriptedProvider
from heed.mental_models.values import HISTORY_LIMIT
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
            data_dir=tmp_path_factory.mktemp("mental"),
            database_url=url,
            llm_provider="scripted",
            mental_model_refresh_debounce_seconds=0.05,
            run_reaper_interval=0.2,
        )

    if request.param == "sqlite":
        with live_server(create_app(settings(None))) as srv:
            yield srv
        return
    with fresh_schema() as url, live_server(create_app(settings(url))) as srv:
        yield srv


def script(
    server: LiveServer, *replies: dict[str, Any], select: str = "turn", model: str = "scripted"
) -> ScriptedProvider:
    """Play *replies* as the reflect provider, named *model* (another model than the one a
    content was written with makes a refresh ask it again: the provider is one of a
    refresh's sources, :mod:`heed.mental_models.fingerprint`)."""
    provider = ScriptedProvider({"select": select, "model": model, "replies": list(replies)})
    server.app.state.services.reflect.provider = provider
    return provider


def new_bank(server: LiveServer, *facts: str) -> str:
    bank = "mm-" + uuid.uuid4().hex[:8]
    httpx.put(f"{server.url}/v1/default/banks/{bank}", json={}, timeout=30).raise_for_status()
    if facts:
        items = [{"content": f} for f in facts]
        httpx.post(
            f"{server.url}/v1/default/banks/{bank}/memories", json={"items": items}, timeout=30
        ).raise_for_status()
    return bank


def run_of(server: LiveServer, run_id: str) -> dict[str, Any]:
    response = httpx.get(f"{server.url}/v1/runs/{run_id}", timeout=10)
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


def finished(server: LiveServer, run_id: str, seconds: float = 30) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        run = run_of(server, run_id)
        done = run["phase"] in ("completed", "failed", "cancelled", "interrupted")
        return run if done else None

    result: dict[str, Any] = wait_for(ended, seconds=seconds)
    return result


def model(server: LiveServer, bank: str, model_id: str) -> dict[str, Any]:
    response = httpx.get(
        f"{server.url}/v1/default/banks/{bank}/mental-models/{model_id}", timeout=10
    )
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


def create(server: LiveServer, bank: str, **fields: Any) -> dict[str, Any]:
    body = {"name": "Alice's pets", "source_query": "What pets does Alice have?", **fields}
    response = httpx.post(
        f"{server.url}/v1/default/banks/{bank}/mental-models", json=body, timeout=30
    )
    assert response.status_code == 200, response.text
    created: dict[str, Any] = response.json()
    return created


def journal(server: LiveServer, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    import json

    with httpx.stream("GET", f"{server.url}/v1/runs/{run_id}/stream", timeout=30) as r:
        text = r.read().decode()
    events = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in fields and "data" in fields:
            events.append((fields["event"], json.loads(fields["data"]).get("data") or {}))
    return events


def test_create_refreshes_in_a_run_that_writes_the_content_and_journals_progress(
    server: LiveServer,
) -> None:
    script(server, {"when": "pets", "text": ANSWER})
    bank = new_bank(server, "Alice has two cats, Tom and Jerry.")
    created = create(server, bank, tags=None)
    run = finished(server, created["operation_id"])
    assert run["kind"] == "mental_model_refresh" and run["phase"] == "completed", run
    assert run["result"]["outcome"] == "content_written"
    stored = model(server, bank, created["mental_model_id"])
    assert stored["content"] == ANSWER and stored["last_refreshed_at"]
    assert stored["reflect_response"]["text"] == ANSWER
    events = journal(server, created["operation_id"])
    stages = [data["stage"] for kind, data in events if kind == "progress"]
    assert stages == ["reflecting", "writing", "done"]
    assert any(kind == "tool_call" for kind, _ in events)  # the reflect's recall
    operations = httpx.get(f"{server.url}/v1/default/banks/{bank}/operations", timeout=10).json()
    assert created["operation_id"] in {o["id"] for o in operations["operations"]}


def test_the_unmodified_client_drives_mental_models_and_the_knowledge_base(
    server: LiveServer,
) -> None:
    script(server, {"when": "pets", "text": ANSWER}, {"when": "alice", "text": "Alice is a nurse."})
    bank = new_bank(server, "Alice has two cats, Tom and Jerry.", "Alice works as a nurse.")
    client = Hindsight(base_url=server.url, timeout=30)
    try:
        made = client.create_mental_model(
            bank, name="Pets", source_query="What pets does Alice have?", id="alice-pets"
        )
        assert made.mental_model_id == "alice-pets"
        finished(server, made.operation_id)
        got = client.get_mental_model(bank, "alice-pets")
        assert got.content == ANSWER and got.trigger is not None and got.trigger.mode == "full"
        listed = client.list_mental_models(bank)
        assert [m.id for m in listed.items] == ["alice-pets"] and listed.items[0].content is None
        assert client.list_mental_models(bank, detail="content").items[0].content == ANSWER
        updated = client.update_mental_model(
            bank, "alice-pets", name="Alice's pets", trigger={"refresh_after_consolidation": True}
        )
        assert updated.name == "Alice's pets" and updated.trigger is not None
        assert updated.trigger.refresh_after_consolidation is True
        again = client.refresh_mental_model(bank, "alice-pets")
        assert finished(server, again.operation_id)["phase"] == "completed"
        dry = client.dry_run_refresh_mental_model(bank, "alice-pets")
        assert dry.candidate_content == ANSWER and dry.outcome == "content_unchanged"
        cleared = client.clear_mental_model(bank, "alice-pets")
        assert cleared.content == ""
        history = client.get_mental_model_history(bank, "alice-pets")
        assert history[0]["previous_content"] == ANSWER and history[0]["reason"] == "cleared"

        folder = client.create_knowledge_folder(bank, "People")
        sub = client.create_knowledge_folder(bank, "Work", parent_id=folder.id)
        page = client.create_knowledge_page(
            bank, "Alice", "Who is Alice?", parent_id=sub.id, tags=["person"]
        )
        assert page.page_id == page.mental_model_id and page.operation_id
        finished(server, page.operation_id)
        tree = client.get_knowledge_base_tree(bank)
        [people] = tree.roots
        assert people.name == "People" and people.children[0].name == "Work"
        assert people.children[0].children[0].id == page.page_id
        assert (
            client.get_knowledge_base_tree(bank, tags=["other"], tags_match="all_strict").roots
            == []
        )
        rendered = client.get_knowledge_page(bank, page.page_id)
        assert rendered.body == "Alice is a nurse." and rendered.markdown.startswith("---\n")
        found = client.search_knowledge_base(bank, "nurse Alice")
        assert [r.id for r in found.results] == [page.page_id] and found.results[0].score > 0
        paths = [f.path for f in client.export_knowledge_base(bank).files]
        assert paths[0] == "index.md" and "pages/people/work/alice.md" in paths
        moved = client.update_knowledge_node(bank, page.page_id, name="Alice B", parent_id=None)
        assert moved.parent_id is None and moved.name == "Alice B"
        # Standalone models are not pages.
        standalone = client.list_mental_models(bank, exclude_knowledge_pages=True)
        assert [m.id for m in standalone.items] == ["alice-pets"]
        client.update_knowledge_node(bank, page.page_id, parent_id=sub.id)
        client.delete_knowledge_node(bank, folder.id)  # the folder, its sub-folder, its page
        assert client.get_knowledge_base_tree(bank).roots == []
        assert [m.id for m in client.list_mental_models(bank).items] == ["alice-pets"]
        client.delete_mental_model(bank, "alice-pets")
        assert client.list_mental_models(bank).total == 0
    finally:
        client.close()


def test_a_refresh_is_cancelled_while_processing_and_frees_its_slot(server: LiveServer) -> None:
    script(server, {"when": "pets", "text": ANSWER})
    bank = new_bank(server, "Alice has two cats.")
    created = create(server, bank)
    finished(server, created["operation_id"])
    script(server, {"when": "pets", "latency": 60, "text": "never written"}, model="slow")
    refresh = httpx.post(
        f"{server.url}/v1/default/banks/{bank}/mental-models/{created['mental_model_id']}/refresh",
        timeout=30,
    ).json()
    lane = server.app.state.services.lanes["reflect"]
    wait_for(
        lambda: (
            lane.stats().in_use and run_of(server, refresh["operation_id"])["phase"] == "running"
        ),
        30,
    )
    started = time.monotonic()
    response = httpx.post(f"{server.url}/v1/runs/{refresh['operation_id']}/cancel", timeout=30)
    assert response.status_code in (200, 202), response.text
    run = finished(server, refresh["operation_id"], 10)
    assert run["phase"] == "cancelled"
    assert time.monotonic() - started < 5  # not the 60 s the model would have taken
    wait_for(lambda: lane.stats().in_use == 0, 5)
    assert model(server, bank, created["mental_model_id"])["content"] == ANSWER
    # The operations route cancels the same way.
    refresh = httpx.post(
        f"{server.url}/v1/default/banks/{bank}/mental-models/{created['mental_model_id']}/refresh",
        timeout=30,
    ).json()
    wait_for(lambda: run_of(server, refresh["operation_id"])["phase"] == "running", 30)
    httpx.delete(
        f"{server.url}/v1/default/banks/{bank}/operations/{refresh['operation_id']}", timeout=30
    ).raise_for_status()
    assert finished(server, refresh["operation_id"], 10)["phase"] == "cancelled"


def test_deleting_the_bank_stops_a_refresh_and_leaves_nothing(server: LiveServer) -> None:
    script(server, {"when": "pets", "latency": 60, "text": "never written"})
    bank = new_bank(server, "Alice has two cats.")
    created = create(server, bank)
    lane = server.app.state.services.lanes["reflect"]
    wait_for(lambda: lane.stats().in_use, 30)
    started = time.monotonic()
    httpx.delete(f"{server.url}/v1/default/banks/{bank}", timeout=30).raise_for_status()
    assert time.monotonic() - started < 5
    assert run_of(server, created["operation_id"])["phase"] == "cancelled"
    assert lane.stats().in_use == 0
    httpx.put(f"{server.url}/v1/default/banks/{bank}", json={}, timeout=30).raise_for_status()
    listed = httpx.get(f"{server.url}/v1/default/banks/{bank}/mental-models", timeout=10).json()
    assert listed["total"] == 0


def test_a_dry_run_writes_nothing_and_history_is_bounded(server: LiveServer) -> None:
    replies = [{"text": f"version {i}"} for i in range(HISTORY_LIMIT + 4)]
    script(server, *replies, select="sequence")
    bank = new_bank(server, "Alice has two cats.")
    created = create(server, bank)
    model_id = created["mental_model_id"]
    finished(server, created["operation_id"])
    before = model(server, bank, model_id)
    dry = httpx.post(
        f"{server.url}/v1/default/banks/{bank}/mental-models/{model_id}/dry-run-refresh",
        timeout=30,
    )
    assert dry.status_code == 200, dry.text
    assert dry.json()["would_persist"] is True and dry.json()["diff"]
    assert model(server, bank, model_id)["content"] == before["content"]  # nothing written
    for i in range(HISTORY_LIMIT + 2):
        # A changed budget, so each refresh asks the LLM (an unchanged model is skipped).
        httpx.patch(
            f"{server.url}/v1/default/banks/{bank}/mental-models/{model_id}",
            json={"max_tokens": 1000 + i},
            timeout=30,
        ).raise_for_status()
        r = httpx.post(
            f"{server.url}/v1/default/banks/{bank}/mental-models/{model_id}/refresh", timeout=30
        ).json()
        finished(server, r["operation_id"])
    history = httpx.get(
        f"{server.url}/v1/default/banks/{bank}/mental-models/{model_id}/history", timeout=10
    ).json()
    assert len(history) == HISTORY_LIMIT
    current = model(server, bank, model_id)["content"]
    assert history[0]["previous_content"] != current and current.startswith("version")


def test_the_minimum_interval_refuses_an_early_refresh_and_a_retain_triggers_one(
    server: LiveServer,
) -> None:
    script(server, {"when": "pets", "text": ANSWER})
    bank = new_bank(server, "Alice has two cats.")
    slow = create(server, bank, trigger={"min_refresh_interval_seconds": 3600})
    finished(server, slow["operation_id"])
    early = httpx.post(
        f"{server.url}/v1/default/banks/{bank}/mental-models/{slow['mental_model_id']}/refresh",
        timeout=30,
    )
    assert early.status_code == 409 and "minimum refresh interval" in early.json()["detail"]
    assert int(early.headers["Retry-After"]) > 3000
    refused = httpx.post(
        f"{server.url}/v1/default/banks/{bank}/mental-models",
        json={"name": "x", "source_query": "pets?", "trigger": {"refresh_cron": "0 * * * *"}},
        timeout=30,
    )
    assert refused.status_code == 400 and "refresh_cron" in refused.json()["detail"]

    watched = create(server, bank, name="Watched", trigger={"refresh_after_retain": True})
    finished(server, watched["operation_id"])
    first = model(server, bank, watched["mental_model_id"])["last_refreshed_at"]
    httpx.post(
        f"{server.url}/v1/default/banks/{bank}/memories",
        json={"items": [{"content": "Alice adopted a hamster."}]},
        timeout=30,
    ).raise_for_status()
    wait_for(
        lambda: model(server, bank, watched["mental_model_id"])["last_refreshed_at"] != first, 30
    )
    # The model with the hour-long interval was not triggered (nor asked to be).
    assert model(server, bank, slow["mental_model_id"])["last_refreshed_at"]


def test_reflect_cites_a_mental_model_and_exclusions_leave_it_out(server: LiveServer) -> None:
    script(server, {"when": "pets", "text": ANSWER})
    bank = new_bank(server, "Alice has two cats.")
    created = create(server, bank)
    finished(server, created["operation_id"])
    url = f"{server.url}/v1/default/banks/{bank}/reflect"
    question = {"query": "What pets does Alice have?", "include": {"facts": {}}}
    cited = httpx.post(url, json=question, timeout=30).json()
    [used] = cited["based_on"]["mental_models"]
    assert used["id"] == created["mental_model_id"] and used["text"] == ANSWER
    for exclusion in (
        {"exclude_mental_models": True},
        {"exclude_mental_model_ids": [created["mental_model_id"]]},
    ):
        answer = httpx.post(url, json={**question, **exclusion}, timeout=30).json()
        assert answer["based_on"]["mental_models"] == []


@pytest.mark.parametrize(
    "value", ["model-1", 7, {"id": "model-1"}, [1], [""], ["x" * 257], ["m"] * 65]
)
def test_a_wrong_exclude_mental_model_ids_is_refused_naming_it(
    server: LiveServer, value: Any
) -> None:
    """In a reflect request and in a trigger (created or patched): a value that is not a
    list of at most 64 ids is refused before any work, naming the field (a 422, as every
    value the request model types; the domain refuses what reaches it otherwise with a
    400: ``tests/mental_models/test_triggers_values.py``), and nothing is created."""
    script(server, {"when": "pets", "text": ANSWER})
    bank = new_bank(server)
    base = f"{server.url}/v1/default/banks/{bank}"
    question = {"query": "What pets does Alice have?", "exclude_mental_model_ids": value}
    refused = [
        httpx.post(f"{base}/reflect", json=question, timeout=30),
        httpx.post(f"{base}/reflect", json={**question, "stream": True}, timeout=30),
        httpx.post(
            f"{base}/mental-models",
            json={
                "name": "n",
                "source_query": "q?",
                "trigger": {"exclude_mental_model_ids": value},
            },
            timeout=30,
        ),
    ]
    created = create(server, bank, trigger={"exclude_mental_model_ids": ["other"]})
    finished(server, created["operation_id"])
    patch = {"trigger": {"exclude_mental_model_ids": value}}
    refused.append(
        httpx.patch(f"{base}/mental-models/{created['mental_model_id']}", json=patch, timeout=30)
    )
    for response in refused:
        assert response.status_code == 422, response.text
        assert "exclude_mental_model_ids" in response.text
    listed = httpx.get(f"{base}/mental-models", timeout=30).json()["items"]
    assert [m["id"] for m in listed] == [created["mental_model_id"]]  # nothing else made
    stored = model(server, bank, created["mental_model_id"])["trigger"]
    assert stored["exclude_mental_model_ids"] == ["other"]  # the patch changed nothing
    runs = httpx.get(f"{server.url}/v1/runs", params={"kind": "reflect"}, timeout=30).json()
    assert all(r.get("summary", {}).get("bank_id") != bank for r in runs["runs"])
