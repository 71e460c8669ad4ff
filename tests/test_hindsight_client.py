"""Every public method of the unmodified ``hindsight-client`` 1.1.0 against a real server.

Issue 31's bar: each method of the client's high-level ``Hindsight`` class, and of its
``webhooks`` API, is called against ``heed serve`` (uvicorn on a loopback socket, SQLite and
PostgreSQL) and gives a sensible result: ids round-trip, content comes back, counts add up.

Each scenario runs twice, once through the sync methods and once through their ``a*``
twins (:class:`Twin` maps a name to the one its mode calls, and records it), with the
same assertions. ``DRIVES`` says which methods each scenario calls; a scenario fails if it
did not call exactly those, and :func:`test_every_public_method_is_driven_or_listed` fails
when the client has a public method that no scenario drives and ``UNSUPPORTED`` does not
list (with the 4xx heed answers and why), so the coverage cannot silently rot.

The LLM is the scripted provider (one script for retain, reflect and mental models,
matched on the prompt), so answers are known.
"""

from __future__ import annotations

import asyncio
import inspect
import io
import json
import uuid
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hindsight_client import Hindsight
from hindsight_client_api.api.webhooks_api import WebhooksApi
from hindsight_client_api.exceptions import NotFoundException
from hindsight_client_api.models.create_webhook_request import CreateWebhookRequest
from hindsight_client_api.models.update_webhook_request import UpdateWebhookRequest
from hindsight_client_api.models.webhook_http_config import WebhookHttpConfig

from heed.api.app import create_app
from heed.settings import Settings
from heed.webhooks import SIGNATURE_HEADER, verify
from tests.pg_support import fresh_schema
from tests.support import LiveServer, live_server, wait_for
from tests.webhooks.receiver import Receiver, receiver

PETS = "Alice has two cats named Tom and Jerry."
PETS_ANSWER = "Alice has two cats, Tom and Jerry."
ANIMALS_ANSWER = "Two cats live with Alice: Tom and Jerry."
WORK = "Alice works as a nurse in Lyon."
SKI = "Bob skis in the Alps every winter."
TRIP = "Bob went sailing to Brest in May."
NURSE_PAGE = "Alice is a nurse in Lyon."
PETS_JSON = {"pets": 2, "names": ["Tom", "Jerry"]}
PETS_SCHEMA = {
    "type": "object",
    "properties": {"pets": {"type": "integer"}, "names": {"type": "array"}},
    "required": ["pets"],
}

#: One script for every model call: the first reply whose ``when`` occurs in the prompt's
#: last user message; anything else is echoed.
SCRIPT = {
    "token_delay": 0,
    "replies": [
        {"when": "JSON Schema:", "json": PETS_JSON},  # reflect's structured-output call
        {"when": "what pets", "text": PETS_ANSWER},  # reflect and the mental model
        {"when": "which animals", "text": ANIMALS_ANSWER},  # the model, asked anew
        {"when": "who is alice", "text": NURSE_PAGE},  # the knowledge page
    ],
}

#: The methods each scenario drives, by their sync name; in the ``async`` mode the scenario
#: calls the ``a*`` twin instead (``SYNC_ONLY`` have none).
DRIVES: dict[str, frozenset[str]] = {
    "memories": frozenset(
        {
            "get_version",
            "create_bank",
            "set_mission",
            "set_reflect_mission",
            "retain",
            "retain_batch",
            "retain_files",
            "suspend_retains",
            "list_memories",
            "recall",
            "reflect",
            "get_bank_config",
            "update_bank_config",
            "reset_bank_config",
            "delete_bank",
            "close",
        }
    ),
    "directives": frozenset(
        {
            "create_bank",
            "retain_batch",
            "create_directive",
            "list_directives",
            "get_directive",
            "update_directive",
            "reflect",
            "delete_directive",
            "close",
        }
    ),
    "mental_models": frozenset(
        {
            "create_bank",
            "retain",
            "create_mental_model",
            "get_mental_model",
            "list_mental_models",
            "update_mental_model",
            "refresh_mental_model",
            "dry_run_refresh_mental_model",
            "clear_mental_model",
            "get_mental_model_history",
            "reflect",
            "delete_mental_model",
            "close",
        }
    ),
    "knowledge_base": frozenset(
        {
            "create_bank",
            "retain",
            "create_knowledge_folder",
            "create_knowledge_page",
            "get_knowledge_base_tree",
            "get_knowledge_page",
            "search_knowledge_base",
            "export_knowledge_base",
            "update_knowledge_node",
            "list_mental_models",
            "delete_knowledge_node",
            "close",
        }
    ),
    "transfer": frozenset(
        {
            "create_bank",
            "retain",
            "create_directive",
            "list_directives",
            "list_memories",
            "export_bank",
            "import_bank",
            "clone_bank",
            "export_documents",
            "close",
        }
    ),
    "webhooks": frozenset({"create_bank", "retain", "close"}),
}

#: Public methods with no ``a*`` twin.
SYNC_ONLY = frozenset({"suspend_retains"})

#: The ``Hindsight`` properties that hand out a generated low-level API (not methods).
SUB_APIS = frozenset(
    {
        "audit",
        "bank_transfer",
        "banks",
        "directives",
        "document_transfer",
        "documents",
        "entities",
        "files",
        "knowledge_base",
        "memory",
        "mental_models",
        "monitoring",
        "operations",
        "webhooks",
    }
)

#: Methods heed deliberately does not support: name -> (status heed answers, why), each
#: with the call that shows it in ``UNSUPPORTED_CALLS``. None: every method is driven.
UNSUPPORTED: dict[str, tuple[int, str]] = {}
UNSUPPORTED_CALLS: dict[str, Callable[[Hindsight, str], Any]] = {}

#: The webhooks API's operations; each is called in its three generated forms.
WEBHOOK_OPERATIONS = (
    "create_webhook",
    "list_webhooks",
    "update_webhook",
    "list_webhook_deliveries",
    "delete_webhook",
)
WEBHOOK_FORMS = ("", "_with_http_info", "_without_preload_content")
UNSUPPORTED_WEBHOOKS: dict[str, tuple[int, str]] = {}

MODES = ("sync", "async")


def twin_name(name: str, mode: str) -> str:
    """The method a scenario in *mode* calls for the sync method *name*."""
    return name if mode == "sync" or name in SYNC_ONLY else f"a{name}"


def expected_calls(area: str, mode: str) -> set[str]:
    return {twin_name(n, mode) for n in DRIVES[area]}


def public_methods(cls: type) -> set[str]:
    return {
        name
        for name, value in vars(cls).items()
        if not name.startswith("_") and inspect.isfunction(value)
    }


class Twin:
    """The client seen through one mode: ``twin.recall(...)`` calls ``recall`` (sync) or
    awaits ``arecall`` on the test's event loop (async), and records which it called."""

    def __init__(self, client: Hindsight, mode: str, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.mode = mode
        self.loop = loop
        self.called: set[str] = set()

    def __getattr__(self, name: str) -> Callable[..., Any]:
        target = twin_name(name, self.mode)
        method = getattr(self.client, target)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.called.add(target)
            result = method(*args, **kwargs)
            if inspect.iscoroutine(result):
                return self.loop.run_until_complete(result)
            return result

        return call

    def run(self, awaitable: Any) -> Any:
        """Await a low-level (async-only) API call on the test's loop."""
        return self.loop.run_until_complete(awaitable)


# -- the server ---------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"], scope="module")
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    def settings(url: str | None) -> Settings:
        return Settings(
            data_dir=tmp_path_factory.mktemp("client"),
            database_url=url,
            llm_provider="scripted",
            llm_script=json.dumps(SCRIPT),
            webhook_allow_private=True,  # the receiver is on loopback
            webhook_poll_seconds=0.05,
            webhook_backoff_seconds=0.05,
            mental_model_refresh_debounce_seconds=0.05,
            run_reaper_interval=0.2,
        )

    if request.param == "sqlite":
        with live_server(create_app(settings(None))) as srv:
            yield srv
        return
    with fresh_schema() as url, live_server(create_app(settings(url))) as srv:
        yield srv


@pytest.fixture(scope="module")
def hook_receiver() -> Iterator[Receiver]:
    with receiver() as rec:
        yield rec


@pytest.fixture(params=MODES)
def twin(request: pytest.FixtureRequest, server: LiveServer) -> Iterator[Twin]:
    """The client in one mode, on an event loop of its own (the sync methods use the
    thread's current loop, the async ones are awaited on it: one loop, one session)."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    client = Hindsight(base_url=server.url, timeout=60)
    try:
        yield Twin(client, request.param, loop)
    finally:
        loop.run_until_complete(client.aclose())  # idempotent: a scenario closes it too
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
        asyncio.set_event_loop(None)


def new_bank_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def get(server: LiveServer, path: str, **params: Any) -> Any:
    response = httpx.get(f"{server.url}{path}", params=params, timeout=30)
    response.raise_for_status()
    return response.json()


def operation_done(server: LiveServer, bank: str, operation_id: str) -> dict[str, Any]:
    """The bank operation *operation_id* once it ended (completed, failed or cancelled)."""

    def ended() -> dict[str, Any] | None:
        status: dict[str, Any] = get(server, f"/v1/default/banks/{bank}/operations/{operation_id}")
        return status if status["status"] in ("completed", "failed", "cancelled") else None

    done: dict[str, Any] = wait_for(ended, seconds=120, interval=0.05)
    return done


def completed(server: LiveServer, bank: str, operation_id: str) -> dict[str, Any]:
    status = operation_done(server, bank, operation_id)
    assert status["status"] == "completed", status
    return status


def finish(twin: Twin, area: str) -> None:
    """Close the client through the mode's method; the scenario drove exactly its list."""
    twin.close()
    assert twin.called == expected_calls(area, twin.mode)


# -- the scenarios ------------------------------------------------------------------------------


def test_memories(server: LiveServer, twin: Twin, tmp_path: Path) -> None:
    """Banks, retain (single, batch, files, suspended), list, recall, reflect, missions,
    the bank config and delete."""
    hs = twin
    version = hs.get_version()
    assert version.api_version
    flags = version.features.to_dict()
    # This server does not learn (scripted provider, HEED_OBSERVATIONS=auto); the
    # capabilities this file drives through the client are on.
    assert flags["observations"] is False
    on = ("mcp", "worker", "bank_config_api", "file_upload_api", "document_export_api")
    assert all(flags[name] for name in (*on, "document_import_api", "store_document_text"))
    # The flags for routes heed may not serve say so: on exactly when the route answers.
    for name, path in (
        ("bank_llm_health", "/v1/default/banks/none/health/llm"),
        ("audit_log", "/v1/default/banks/none/audit-logs"),
        ("llm_trace", "/v1/default/banks/none/llm-requests"),
    ):
        method = "POST" if name == "bank_llm_health" else "GET"
        answer = httpx.request(method, f"{server.url}{path}", timeout=30)
        assert flags[name] is (answer.json() != {"detail": "Not Found"}), (name, answer.text)
    bank = new_bank_id("client")

    made = hs.create_bank(
        bank, name="Alice's notes", reflect_mission="Help Alice.", disposition_empathy=4
    )
    assert (made.bank_id, made.name, made.mission) == (bank, "Alice's notes", "Help Alice.")
    assert made.disposition.empathy == 4

    one = hs.retain(
        bank,
        PETS,
        context="chat",
        document_id="pets",
        tags=["pets"],
        metadata={"source": "chat"},
        timestamp="2024-05-01T10:00:00Z",
    )
    assert (one.success, one.bank_id, one.items_count) == (True, bank, 1)
    batch = hs.retain_batch(
        bank,
        [{"content": WORK, "tags": ["work"], "document_id": "work"}, {"content": SKI}],
        document_id="ski",  # the items without one
        document_tags=["batch"],
    )
    assert (batch.success, batch.items_count) == (True, 2)

    notes = tmp_path / "garden.md"
    notes.write_text("# Garden\n\nAlice grows **tomatoes** on her balcony.\n")
    plain = tmp_path / "trip.txt"
    plain.write_text(TRIP + "\n")
    files = hs.retain_files(bank, [notes, plain], context="my files")
    assert files.operation_ids == []  # retained before the answer: nothing to track

    with hs.suspend_retains():
        suspended = hs.retain(bank, "Never stored.")
        assert suspended.items_count == 0 and not suspended.operation_ids

    listed = hs.list_memories(bank)
    texts = [m.text for m in listed.items]
    garden_texts = ["# Garden", "Alice grows **tomatoes** on her balcony."]  # one per block
    assert sorted(texts) == sorted([PETS, WORK, SKI, TRIP, *garden_texts])
    assert listed.total == 6  # and nothing of the suspended retain
    [pets_unit] = hs.list_memories(bank, document_id="pets").items
    assert pets_unit.text == PETS and pets_unit.context == "chat"
    assert pets_unit.tags == ["pets"] and pets_unit.metadata == {"source": "chat"}
    assert pets_unit.mentioned_at and pets_unit.mentioned_at.startswith("2024-05-01")
    [work_unit] = hs.list_memories(bank, document_id="work").items
    assert work_unit.text == WORK and sorted(work_unit.tags) == ["batch", "work"]
    assert [m.tags for m in hs.list_memories(bank, document_id="ski").items] == [["batch"]]
    garden = hs.list_memories(bank, document_id="garden.md").items
    assert sorted(m.text for m in garden) == garden_texts
    assert all(m.context == "my files" for m in garden)
    assert [m.text for m in hs.list_memories(bank, search_query="nurse").items] == [WORK]
    page = hs.list_memories(bank, limit=2, offset=1)
    assert [m.id for m in page.items] == [m.id for m in listed.items[1:3]] and page.total == 6

    recalled = hs.recall(bank, "Which cats does Alice have?", trace=True, include_chunks=True)
    assert recalled.results and recalled.results[0].text == PETS
    assert recalled.results[0].id == pets_unit.id and recalled.trace and recalled.chunks
    tagged = hs.recall(bank, "What does Alice do?", tags=["work"], tags_match="all_strict")
    assert [r.text for r in tagged.results] == [WORK]
    batched = hs.recall(bank, "What do they do?", tags=["batch"], tags_match="any_strict")
    assert sorted(r.text for r in batched.results) == sorted([WORK, SKI])

    answer = hs.reflect(
        bank,
        "What pets does Alice have?",
        include_facts=True,
        include_tool_calls=True,
        response_schema=PETS_SCHEMA,
    )
    assert answer.text == PETS_ANSWER
    assert answer.trace is not None and answer.trace.tool_calls  # its recall
    assert answer.structured_output == PETS_JSON and answer.structured_output_error is None
    assert answer.based_on is not None
    assert PETS in {m.text for m in answer.based_on.memories or []}

    assert hs.set_mission(bank, "Help Alice with her pets.").mission == (
        "Help Alice with her pets."
    )
    profile = hs.set_reflect_mission(bank, "Answer as Alice's vet.")
    assert (profile.mission, profile.name) == ("Answer as Alice's vet.", "Alice's notes")

    config = hs.get_bank_config(bank)
    assert config["bank_id"] == bank
    assert config["overrides"]["reflect_mission"] == "Answer as Alice's vet."
    assert config["config"]["disposition_empathy"] == 4
    updated = hs.update_bank_config(
        bank, enable_reranking=False, recall_prefer_observations=True, disposition_skepticism=2
    )
    assert updated["overrides"]["enable_reranking"] is False
    assert updated["config"]["recall_prefer_observations"] is True
    assert updated["config"]["disposition_skepticism"] == 2
    assert hs.get_bank_config(bank) == updated
    reset = hs.reset_bank_config(bank)
    assert reset["bank_id"] == bank and reset["overrides"] == {}
    assert reset["config"]["enable_reranking"] is True
    assert reset["config"]["reflect_mission"] == ""

    deleted = hs.delete_bank(bank)
    assert deleted.success
    assert httpx.get(f"{server.url}/v1/default/banks/{bank}", timeout=30).status_code == 404
    finish(twin, "memories")


def test_directives(server: LiveServer, twin: Twin) -> None:
    hs = twin
    bank = new_bank_id("rules")
    hs.create_bank(bank)
    hs.retain_batch(bank, [{"content": PETS}, {"content": WORK}])

    french = hs.create_directive(bank, name="french", content="Answer in French.", priority=1)
    assert (french.bank_id, french.name, french.content) == (bank, "french", "Answer in French.")
    assert french.priority == 1 and french.is_active is True and french.tags == []
    scoped = hs.create_directive(
        bank, name="brief", content="Answer in one sentence.", priority=5, tags=["p:x"]
    )
    assert scoped.tags == ["p:x"]

    listed = hs.list_directives(bank)
    assert [d.id for d in listed.items] == [scoped.id, french.id]  # priority first
    assert listed.total == 2
    in_scope = hs.list_directives(bank, tags=["p:y"])  # the untagged, and those it matches
    assert [d.id for d in in_scope.items] == [french.id] and in_scope.total == 1
    assert hs.get_directive(bank, scoped.id) == scoped

    renamed = hs.update_directive(bank, scoped.id, name="short", priority=7)
    assert (renamed.id, renamed.name, renamed.priority, renamed.content) == (
        scoped.id,
        "short",
        7,
        "Answer in one sentence.",
    )
    assert renamed.tags == ["p:x"] and renamed.created_at == scoped.created_at

    answer = hs.reflect(
        bank, "What pets does Alice have?", include_facts=True, apply_all_directives=True
    )
    assert answer.text == PETS_ANSWER and answer.based_on is not None
    assert [d.id for d in answer.based_on.directives or []] == [scoped.id, french.id]

    hs.delete_directive(bank, scoped.id)
    with pytest.raises(NotFoundException):
        hs.get_directive(bank, scoped.id)
    assert [d.id for d in hs.list_directives(bank).items] == [french.id]
    finish(twin, "directives")


def test_mental_models(server: LiveServer, twin: Twin) -> None:
    hs = twin
    bank = new_bank_id("models")
    hs.create_bank(bank)
    hs.retain(bank, PETS)

    made = hs.create_mental_model(
        bank, name="Pets", source_query="What pets does Alice have?", id="alice-pets", tags=None
    )
    assert made.mental_model_id == "alice-pets" and made.operation_id
    created = completed(server, bank, made.operation_id)
    assert created["operation_type"] == "mental_model_refresh"

    got = hs.get_mental_model(bank, "alice-pets")
    assert (got.id, got.bank_id, got.name, got.content) == (
        "alice-pets",
        bank,
        "Pets",
        PETS_ANSWER,
    )
    assert got.source_query == "What pets does Alice have?" and got.last_refreshed_at
    listed = hs.list_mental_models(bank, detail="content")
    assert [(m.id, m.content) for m in listed.items] == [("alice-pets", PETS_ANSWER)]
    assert listed.total == 1

    updated = hs.update_mental_model(
        bank, "alice-pets", name="Alice's pets", trigger={"refresh_after_consolidation": True}
    )
    assert updated.name == "Alice's pets" and updated.trigger is not None
    assert updated.trigger.refresh_after_consolidation is True
    assert updated.source_query == "What pets does Alice have?"  # not named: unchanged

    asked_anew = hs.update_mental_model(
        bank, "alice-pets", source_query="Which animals live with Alice?"
    )
    assert asked_anew.content == PETS_ANSWER  # until the next refresh
    refreshed = hs.refresh_mental_model(bank, "alice-pets")
    assert refreshed.operation_id
    done = completed(server, bank, refreshed.operation_id)
    assert done["result_metadata"]["outcome"] == "content_written"
    assert hs.get_mental_model(bank, "alice-pets").content == ANIMALS_ANSWER
    [before, *_] = hs.get_mental_model_history(bank, "alice-pets")
    assert (before["previous_content"], before["reason"]) == (PETS_ANSWER, "refreshed")
    dry = hs.dry_run_refresh_mental_model(bank, "alice-pets")
    assert dry.mental_model_id == "alice-pets" and dry.candidate_content == ANIMALS_ANSWER
    assert dry.outcome == "content_unchanged"

    cited = hs.reflect(bank, "What pets does Alice have?", include_facts=True)
    assert cited.based_on is not None
    assert [m.id for m in cited.based_on.mental_models or []] == ["alice-pets"]

    cleared = hs.clear_mental_model(bank, "alice-pets")
    assert cleared.id == "alice-pets" and cleared.content == ""
    history = hs.get_mental_model_history(bank, "alice-pets")
    assert history[0]["previous_content"] == ANIMALS_ANSWER
    assert history[0]["reason"] == "cleared" and history[0]["changed_at"]
    assert [h["previous_content"] for h in history[1:]] == [PETS_ANSWER]  # the refresh's

    hs.delete_mental_model(bank, "alice-pets")
    assert hs.list_mental_models(bank).total == 0
    with pytest.raises(NotFoundException):
        hs.get_mental_model(bank, "alice-pets")
    finish(twin, "mental_models")


def test_knowledge_base(server: LiveServer, twin: Twin) -> None:
    hs = twin
    bank = new_bank_id("kb")
    hs.create_bank(bank)
    hs.retain(bank, WORK)

    people = hs.create_knowledge_folder(bank, "People")
    assert people.id and people.kind == "folder" and people.parent_id is None
    work = hs.create_knowledge_folder(bank, "Work", parent_id=people.id)
    assert work.parent_id == people.id and work.name == "Work"
    page = hs.create_knowledge_page(bank, "Alice", "Who is Alice?", parent_id=work.id)
    assert page.page_id and page.mental_model_id == page.page_id and page.operation_id
    completed(server, bank, page.operation_id)

    tree = hs.get_knowledge_base_tree(bank)
    [root] = tree.roots
    assert (root.id, root.name) == (people.id, "People")
    [sub] = root.children
    assert (sub.id, sub.name) == (work.id, "Work")
    assert [(p.id, p.kind, p.name) for p in sub.children] == [(page.page_id, "page", "Alice")]

    rendered = hs.get_knowledge_page(bank, page.page_id)
    assert (rendered.id, rendered.name, rendered.body) == (page.page_id, "Alice", NURSE_PAGE)
    assert rendered.markdown.startswith("---\n") and NURSE_PAGE in rendered.markdown
    found = hs.search_knowledge_base(bank, "nurse Alice")
    assert [r.id for r in found.results] == [page.page_id] and found.results[0].score > 0
    paths = [f.path for f in hs.export_knowledge_base(bank).files]
    assert paths[0] == "index.md" and "pages/people/work/alice.md" in paths

    moved = hs.update_knowledge_node(bank, page.page_id, name="Alice B", parent_id=None)
    assert (moved.id, moved.name, moved.parent_id) == (page.page_id, "Alice B", None)
    assert {r.id for r in hs.get_knowledge_base_tree(bank).roots} == {people.id, page.page_id}
    assert hs.list_mental_models(bank, exclude_knowledge_pages=True).total == 0
    assert [m.id for m in hs.list_mental_models(bank).items] == [page.page_id]

    hs.update_knowledge_node(bank, page.page_id, parent_id=work.id)
    hs.delete_knowledge_node(bank, people.id)  # the folder, its sub-folder and its page
    assert hs.get_knowledge_base_tree(bank).roots == []
    assert hs.list_mental_models(bank).total == 0
    finish(twin, "knowledge_base")


def _archive_names(archive: bytes) -> list[str]:
    assert archive[:2] == b"PK", archive[:64]
    with zipfile.ZipFile(io.BytesIO(archive)) as zipped:
        return zipped.namelist()


def test_transfer(server: LiveServer, twin: Twin) -> None:
    """export_bank / import_bank, clone_bank and export_documents, with the data and the
    configuration (a mission and a directive) carried."""
    hs = twin
    source = new_bank_id("src")
    hs.create_bank(source, name="Pets", reflect_mission="Remember pets.")
    hs.retain(source, PETS, document_id="pets", tags=["pets"])
    hs.retain(source, TRIP, document_id="trip")
    rule = hs.create_directive(source, name="french", content="Answer in French.")
    assert hs.list_directives(source).total == 1
    before = sorted(m.text for m in hs.list_memories(source).items)
    assert before == sorted([PETS, TRIP])

    directives: dict[str, list[tuple[str, str]]] = {}  # checked last: see the end

    def carried(bank: str, data: bool = True) -> None:
        texts = sorted(m.text for m in hs.list_memories(bank).items)
        assert texts == (before if data else [])
        profile = get(server, f"/v1/default/banks/{bank}")
        assert (profile["name"], profile["mission"]) == ("Pets", "Remember pets.")
        directives[bank] = [(d.name, d.content) for d in hs.list_directives(bank).items]

    archive = hs.export_bank(source, poll_interval=0.1)
    assert _archive_names(archive)
    imported = new_bank_id("imported")
    operation_id = hs.import_bank(source, archive, target_bank_id=imported)
    status = completed(server, source, operation_id)
    assert status["operation_type"] == "bank_import"
    assert status["result_metadata"]["bank_id"] == imported
    carried(imported)

    cloned = new_bank_id("clone")
    status = completed(server, source, hs.clone_bank(source, cloned))
    assert status["operation_type"] == "bank_clone"
    carried(cloned)
    bare = new_bank_id("clone")
    completed(server, source, hs.clone_bank(source, bare, include_data=False))
    carried(bare, data=False)

    documents = hs.export_documents(source, ["trip"], poll_interval=0.1)
    assert _archive_names(documents)
    only_trip = new_bank_id("docs")
    completed(server, source, hs.import_bank(source, documents, target_bank_id=only_trip))
    assert [m.text for m in hs.list_memories(only_trip).items] == [TRIP]
    assert [d["id"] for d in get(server, f"/v1/default/banks/{only_trip}/documents")["items"]] == [
        "trip"
    ]
    finish(twin, "transfer")
    # include_bank_config (the default) carries the bank's directives, as the client says.
    assert directives == {b: [(rule.name, rule.content)] for b in (imported, cloned, bare)}


def test_webhooks(server: LiveServer, twin: Twin, hook_receiver: Receiver) -> None:
    """The webhooks API (async-only, so awaited in both modes), each operation in its three
    generated forms; a retain is delivered to the receiver and shows in the delivery log."""
    hs = twin
    api: WebhooksApi = twin.client.webhooks
    bank = new_bank_id("hooks")
    hs.create_bank(bank)
    called: set[str] = set()

    def call(name: str, *args: Any, **kwargs: Any) -> Any:
        called.add(name)
        result = twin.run(getattr(api, name)(*args, **kwargs))
        if name.endswith("_without_preload_content"):
            assert 200 <= result.status < 300, result.status
            return json.loads(twin.run(result.read()))
        if name.endswith("_with_http_info"):
            assert 200 <= result.status_code < 300, result.status_code
            return result.data.to_dict()
        return result.to_dict()

    path = f"/{bank}"
    hooks = []
    for form in WEBHOOK_FORMS:
        made = call(
            f"create_webhook{form}",
            bank,
            CreateWebhookRequest(
                url=f"{hook_receiver.url}{path}{form}",
                event_types=["retain.completed"],
                http_config=WebhookHttpConfig(timeout_seconds=5, headers={"X-Team": "blue"}),
            ),
        )
        assert made["id"] and made["bank_id"] == bank and made["enabled"] is True
        assert made["secret"].startswith("whsec_")  # shown once, when created
        hooks.append(made)
    ids = [h["id"] for h in hooks]
    for form in WEBHOOK_FORMS:
        listed = call(f"list_webhooks{form}", bank)
        assert listed["total"] == 3 and sorted(h["id"] for h in listed["items"]) == sorted(ids)
        assert all(h.get("secret") is None for h in listed["items"])
    paged = call("list_webhooks", bank, limit=1, offset=1)
    assert len(paged["items"]) == 1 and paged["total"] == 3

    # The first stays on; the other two are switched to run.completed (one then off).
    for form, hook, change in zip(
        WEBHOOK_FORMS[1:],
        hooks[1:],
        (
            UpdateWebhookRequest(event_types=["run.completed"]),
            UpdateWebhookRequest(enabled=False),
        ),
        strict=True,
    ):
        updated = call(f"update_webhook{form}", bank, hook["id"], change)
        assert updated["id"] == hook["id"] and updated["url"] == hook["url"]
    updated = call("update_webhook", bank, ids[0], UpdateWebhookRequest(secret="s3cret-value"))
    assert updated["enabled"] is True and updated["event_types"] == ["retain.completed"]

    retained = hs.retain(bank, "Alice waters the ferns every Monday.", retain_async=True)
    assert retained.success and retained.operation_id
    completed(server, bank, retained.operation_id)
    [delivered] = wait_for(lambda: hook_receiver.at(path), 20)
    assert verify("s3cret-value", delivered.body, delivered.headers[SIGNATURE_HEADER])
    assert delivered.headers["X-Team"] == "blue"
    assert delivered.json["type"] == "retain.completed" and delivered.json["bank_id"] == bank
    assert delivered.json["data"]["operation_id"] == retained.operation_id
    [run_event] = wait_for(lambda: hook_receiver.at(f"{path}_with_http_info"), 20)
    assert run_event.json["type"] == "run.completed"

    def delivered_log(form: str, hook_id: str) -> list[dict[str, Any]] | None:
        items: list[dict[str, Any]] = call(f"list_webhook_deliveries{form}", bank, hook_id)["items"]
        return items if items and all(d["status"] == "delivered" for d in items) else None

    [entry] = wait_for(lambda: delivered_log("", ids[0]), 20)
    assert (entry["webhook_id"], entry["event_type"]) == (ids[0], "retain.completed")
    assert entry["last_response_status"] == 200 and entry["attempts"] == 1
    [entry] = wait_for(lambda: delivered_log("_with_http_info", ids[1]), 20)
    assert (entry["webhook_id"], entry["event_type"]) == (ids[1], "run.completed")
    off = call("list_webhook_deliveries_without_preload_content", bank, ids[2], limit=10)
    assert off == {"items": [], "next_cursor": None}  # switched off before the retain
    assert hook_receiver.at(f"{path}_without_preload_content") == []

    for form, hook_id in zip(WEBHOOK_FORMS, ids, strict=True):
        deleted = call(f"delete_webhook{form}", bank, hook_id)
        assert deleted["success"] is True
    assert call("list_webhooks", bank)["total"] == 0
    assert called == {op + form for op in WEBHOOK_OPERATIONS for form in WEBHOOK_FORMS}
    finish(twin, "webhooks")


def test_list_memories_filters_by_state_and_tags(server: LiveServer) -> None:
    """``list_memories``' ``state`` filter works (every stored unit is valid), and its
    ``tags`` / ``tags_match`` filters keep what recall's would (``any``, the default, also
    keeps the untagged; ``all_strict`` does not); an unknown ``tags_match`` is a 400
    naming it, never silently ignored."""
    client = Hindsight(base_url=server.url, timeout=30)
    try:
        bank = new_bank_id("filters")
        client.create_bank(bank)
        client.retain(bank, WORK, tags=["work", "lyon"], document_id="work")
        client.retain(bank, TRIP, tags=["travel"], document_id="trip")
        client.retain(bank, SKI, document_id="ski")
        assert client.list_memories(bank).total == 3

        def texts(**filters: Any) -> list[str]:
            return sorted(m.text for m in client.list_memories(bank, **filters).items)

        assert texts(tags=["work"]) == sorted([WORK, SKI])
        assert texts(tags=["work"], tags_match="all_strict") == [WORK]
        assert texts(tags=["work", "travel"], tags_match="any_strict") == sorted([WORK, TRIP])
        assert texts(tags=["work", "lyon"], tags_match="exact") == [WORK]
        assert texts(tags_match="exact") == [SKI]
        assert texts(tags=["nowhere"], tags_match="all_strict") == []
        with pytest.raises(Exception) as refused:
            client.list_memories(bank, tags=["work"], tags_match="some")
        assert getattr(refused.value, "status", None) == 400
        assert "tags_match" in str(getattr(refused.value, "body", refused.value))
        assert client.list_memories(bank, state="valid").total == 3
        assert client.list_memories(bank, state="invalidated").total == 0
    finally:
        client.close()


# -- deliberately unsupported -------------------------------------------------------------------


def test_unsupported_methods_get_the_status_listed(server: LiveServer) -> None:
    """Each method in ``UNSUPPORTED`` answers the 4xx listed (there are none today)."""
    assert set(UNSUPPORTED_CALLS) == set(UNSUPPORTED)
    client = Hindsight(base_url=server.url, timeout=30)
    try:
        bank = new_bank_id("unsupported")
        httpx.put(f"{server.url}/v1/default/banks/{bank}", json={}, timeout=30).raise_for_status()
        for name, (status, reason) in UNSUPPORTED.items():
            assert 400 <= status < 500 and reason
            with pytest.raises(Exception) as refused:
                UNSUPPORTED_CALLS[name](client, bank)
            got = getattr(refused.value, "status", None)
            assert got == status, (name, refused.value)
    finally:
        client.close()


# -- the coverage cannot rot --------------------------------------------------------------------


def test_every_public_method_is_driven_or_listed() -> None:
    """A public method of ``Hindsight`` (or of its webhooks API) that no scenario drives and
    ``UNSUPPORTED`` does not list fails here."""
    scenarios = {name.removeprefix("test_") for name in globals() if name.startswith("test_")}
    assert set(DRIVES) <= scenarios, set(DRIVES) - scenarios  # each list has its scenario

    driven = {
        twin_name(name, mode) for names in DRIVES.values() for name in names for mode in MODES
    }
    methods = public_methods(Hindsight)
    assert not driven & set(UNSUPPORTED), driven & set(UNSUPPORTED)
    missing = methods - driven - set(UNSUPPORTED)
    assert missing == set(), f"Hindsight methods neither driven nor listed: {missing}"
    assert driven | set(UNSUPPORTED) <= methods, "a name the client does not have"

    properties = {
        name
        for name, value in vars(Hindsight).items()
        if not name.startswith("_") and isinstance(value, property)
    }
    assert properties == SUB_APIS, "a new property of Hindsight: a sub-API or a method?"

    webhook_driven = {op + form for op in WEBHOOK_OPERATIONS for form in WEBHOOK_FORMS}
    webhook_methods = public_methods(WebhooksApi)
    missing = webhook_methods - webhook_driven - set(UNSUPPORTED_WEBHOOKS)
    assert missing == set(), f"webhooks API methods neither driven nor listed: {missing}"
    assert webhook_driven | set(UNSUPPORTED_WEBHOOKS) <= webhook_methods
