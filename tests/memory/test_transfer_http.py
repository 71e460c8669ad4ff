"""Bank transfer end to end over HTTP, on SQLite and PostgreSQL: export, import, clone and
export_documents through the unmodified hindsight-client, as runs of the bank's operations
(progress on the run's stream, cancel while processing, a bank delete stops them) that
leave no half bank; hostile archives refused with a 400 naming the problem, nothing
written. The archive moving from SQLite to PostgreSQL is ``test_transfer_across_databases``.

Real server on a socket; the scripted provider plays the LLM of extraction and
consolidation, so the source bank holds extracted facts with provenance and an observation
with its history.
"""

from __future__ import annotations

import base64
import json
import struct
import time
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hindsight_client import Hindsight

from heed.api.app import create_app
from heed.llm import ScriptedProvider
from heed.mental_models.values import KnowledgeFolder, MentalModel
from heed.runtime.context import DEFAULT_TENANT
from heed.settings import Settings
from heed.transfer.archive import SECTIONS
from heed.transfer.runs import STAGING_TENANT
from tests.memory import archive_support as arc
from tests.pg_support import fresh_schema
from tests.support import LiveServer, live_server, wait_for

TURNS = [
    "Caroline: I adopted a puppy named Rex last week.",
    "Melanie: That's lovely! What breed is he?",
    "Caroline: A beagle. He loves the park near my flat in Lyon.",
]
EXTRACTION = {
    "when": "[0] (",
    "json": {
        "facts": [
            {
                "text": "Caroline adopted a beagle puppy named Rex.",
                "fact_type": "experience",
                "who": "Caroline",
                "entities": ["Caroline", "Rex"],
                "sources": [0, 2],
            },
            {
                "text": "Rex loves the park near Caroline's flat in Lyon.",
                "fact_type": "world",
                "where": "Lyon",
                "entities": ["Rex", "Lyon"],
                "sources": [2],
                "causes": [0],
            },
        ]
    },
}
CREATE = {
    "when": "new facts:",
    "json": {
        "actions": [
            {"action": "create", "text": "Caroline owns a beagle called Rex.", "facts": [0, 1]}
        ]
    },
}
UPDATE = {
    "when": "new facts:",
    "json": {
        "actions": [
            {
                "action": "update",
                "observations": [0],
                "text": "Caroline owns a two-year-old beagle called Rex.",
                "facts": [0],
            }
        ]
    },
}
QUERIES = ["Caroline's dog", "Where is the park?", "sailing trip to Brest", "What breed is Rex?"]


@pytest.fixture(params=["sqlite", "postgresql"], scope="module")
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    def settings(url: str | None) -> Settings:
        return Settings(
            data_dir=tmp_path_factory.mktemp("transfer"),
            database_url=url,
            llm_provider="scripted",
            retain_extraction="concise",
            observations="on",
            consolidation_debounce_seconds=0.05,
            run_reaper_interval=0.2,
            max_body_bytes=64 * 1024 * 1024,
            webhook_allow_private=True,  # the source's webhook targets loopback
        )

    if request.param == "sqlite":
        with live_server(create_app(settings(None))) as srv:
            yield srv
        return
    with fresh_schema() as url, live_server(create_app(settings(url))) as srv:
        yield srv


def script(server: LiveServer, *replies: dict[str, Any]) -> None:
    server.app.state.services.retain_provider.current = ScriptedProvider({"replies": list(replies)})


def get(server: LiveServer, path: str, **params: Any) -> Any:
    response = httpx.get(f"{server.url}{path}", params=params, timeout=30)
    response.raise_for_status()
    return response.json()


def memories(server: LiveServer, bank: str, **params: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get(
        server, f"/v1/default/banks/{bank}/memories/list", limit=1000, **params
    )["items"]
    return items


def wait_done(server: LiveServer, bank: str, operation_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        status = get(server, f"/v1/default/banks/{bank}/operations/{operation_id}")
        return status if status["status"] in ("completed", "failed", "cancelled") else None

    status: dict[str, Any] = wait_for(done, seconds=180, interval=0.1)
    return status


WEBHOOK = {
    "url": "http://127.0.0.1:9/hook",
    "secret": "a-secret-of-the-source",
    "event_types": ["retain.completed", "run.completed"],
    "enabled": False,  # never sent: the test is what travels
    "http_config": {"timeout_seconds": 7, "headers": {"X-Team": "pets"}},
}


def add_knowledge(server: LiveServer, bank: str) -> None:
    """Give *bank* a mental model refreshed twice (a history of one), a folder and a
    page in it, written through the store (a refresh's LLM is not what is tested)."""
    store = server.app.state.services.memory.store
    ref = store.get_bank(DEFAULT_TENANT, bank).ref
    embedder = server.app.state.services.memory.embedder
    vector = embedder.embed(["pets"])[0]
    model = MentalModel(bank_ref=ref, id="pets-summary", name="Pets", source_query="Whose pets?")
    model.tags = ["pets"]
    store.create_mental_model(model, 100)
    for content in ("Caroline has a dog.", "Caroline has a beagle, Rex."):
        store.write_mental_model_content(
            ref,
            model.id,
            content,
            {"text": content},
            vector,
            reason="refreshed",
            history_limit=20,
            refreshed=True,
        )
    store.create_knowledge_folder(KnowledgeFolder(bank_ref=ref, id="people", name="People"), 100)
    page = MentalModel(
        bank_ref=ref,
        id="caroline",
        name="Caroline",
        source_query="Who is Caroline?",
        parent_id="people",
        is_page=True,
    )
    store.create_mental_model(page, 100)
    store.write_mental_model_content(
        ref,
        page.id,
        "Caroline lives in Lyon.",
        None,
        None,
        reason="refreshed",
        history_limit=20,
        refreshed=True,
    )


@pytest.fixture(scope="module")
def source(server: LiveServer) -> str:
    """A bank with two documents, extracted facts with provenance, and an observation
    updated once (so it has a history), a mission, a disposition and settings, a
    directive, a webhook, mental models with history, and a knowledge-base folder."""
    bank = "src-" + uuid.uuid4().hex[:6]
    httpx.put(
        f"{server.url}/v1/default/banks/{bank}",
        json={"mission": "Remember pets.", "disposition": {"empathy": 5}, "name": "Pets"},
        timeout=30,
    ).raise_for_status()
    rule = {"name": "french", "content": "Answer in French.", "priority": 3, "tags": ["fr"]}
    httpx.post(
        f"{server.url}/v1/default/banks/{bank}/directives", json=rule, timeout=30
    ).raise_for_status()
    httpx.post(
        f"{server.url}/v1/default/banks/{bank}/webhooks", json=WEBHOOK, timeout=30
    ).raise_for_status()
    add_knowledge(server, bank)
    client = Hindsight(base_url=server.url, timeout=60)
    try:
        script(server, EXTRACTION, CREATE)
        client.retain(bank, "\n".join(TURNS), context="chat", document_id="chat", tags=["pets"])
        wait_for(lambda: memories(server, bank, type="observation"), seconds=30)
        wait_for(lambda: not memories(server, bank, consolidation_state="pending"), seconds=30)
        script(server, EXTRACTION, UPDATE)
        client.retain(
            bank,
            "Caroline: Rex turned two yesterday.",
            document_id="birthday",
            metadata={"source": "chat"},
        )

        def updated() -> bool:
            return any(
                m["text"].startswith("Caroline owns a two-year-old")
                for m in memories(server, bank, type="observation")
            )

        wait_for(updated, seconds=30)
        wait_for(lambda: not memories(server, bank, consolidation_state="pending"), seconds=30)
        script(
            server,
            {"when": "[0] (", "json": {"facts": []}},
            {"when": "new facts:", "json": {"actions": []}},
        )
        client.retain(bank, "Bob went sailing to Brest in May.", document_id="trip")
        wait_for(lambda: not memories(server, bank, consolidation_state="pending"), seconds=30)
    finally:
        client.close()
    return bank


def snapshot(server: LiveServer, bank: str) -> dict[str, Any]:
    """Everything the API shows of a bank, with memory ids replaced by texts (an import
    gives new ids)."""
    units = memories(server, bank)
    text_of = {u["id"]: u["text"] for u in units}
    profile = get(server, f"/v1/default/banks/{bank}")
    stats = get(server, f"/v1/default/banks/{bank}/stats")
    documents = get(server, f"/v1/default/banks/{bank}/documents")["items"]
    history = {
        u["text"]: get(server, f"/v1/default/banks/{bank}/memories/{u['id']}/history")["history"]
        for u in units
        if u["fact_type"] == "observation"
    }
    recalls = {}
    for query in QUERIES:
        response = httpx.post(
            f"{server.url}/v1/default/banks/{bank}/memories/recall",
            json={"query": query, "types": ["world", "experience", "observation"]},
            timeout=30,
        )
        response.raise_for_status()
        recalls[query] = [r["text"] for r in response.json()["results"][:5]]
    keep = (
        "text",
        "fact_type",
        "context",
        "occurred_start",
        "occurred_end",
        "mentioned_at",
        "tags",
        "metadata",
        "document_id",
        "consolidation_state",
        "proof_count",
    )
    directives = get(server, f"/v1/default/banks/{bank}/directives")["items"]
    return {
        **knowledge(server, bank),
        "profile": {k: profile[k] for k in ("mission", "disposition", "background")},
        "directives": [
            (d["name"], d["content"], d["priority"], d["is_active"], d["tags"]) for d in directives
        ],
        "units": sorted(
            (
                {k: u.get(k) for k in keep}
                | {
                    "entities": sorted(u.get("entities") or []),
                    "sources": sorted(text_of.get(i, "?") for i in u["source_memory_ids"] or []),
                }
                for u in units
            ),
            key=lambda u: json.dumps(u, sort_keys=True),
        ),
        "stats": {
            k: stats[k] for k in ("nodes_by_fact_type", "links_by_link_type", "total_documents")
        },
        "documents": sorted(
            (d["id"], d["text_length"], d["tags"], d["document_metadata"], d["memory_unit_count"])
            for d in documents
        ),
        "history": {k: [(h["text"], h["reason"]) for h in v] for k, v in history.items()},
        "recall": recalls,
    }


def knowledge(server: LiveServer, bank: str) -> dict[str, Any]:
    """The bank's webhooks (with their secrets: what signs), mental models with their
    history, and knowledge-base tree, as the API shows them (ids aside where new)."""
    base = f"/v1/default/banks/{bank}"
    models = get(server, f"{base}/mental-models")["items"]
    hooks = get(server, f"{base}/webhooks")["items"]
    store = server.app.state.services.memory.store
    ref = store.get_bank(DEFAULT_TENANT, bank).ref
    return {
        "webhooks": [
            (
                w["url"],
                w["event_types"],
                w["enabled"],
                w["http_config"]["timeout_seconds"],
                w["http_config"]["headers"],
                server.app.state.services.webhook_store.get(DEFAULT_TENANT, ref, w["id"]).secret,
            )
            for w in hooks
        ],
        "mental_models": sorted(
            (
                m["id"],
                m["name"],
                m["source_query"],
                m["content"],
                m["tags"],
                m["last_refreshed_at"],
                [
                    (h["previous_content"], h["reason"])
                    for h in get(server, f"{base}/mental-models/{m['id']}/history")
                ],
                store.get_mental_model(ref, m["id"]).embedding is not None,
            )
            for m in models
        ),
        "tree": get(server, f"{base}/knowledge-base/tree"),
    }


def test_export_then_import_carries_the_whole_bank(server: LiveServer, source: str) -> None:
    before = snapshot(server, source)
    assert before["history"] and any(before["history"].values())  # an updated observation
    assert before["directives"] == [("french", "Answer in French.", 3, True, ["fr"])]
    assert len(before["webhooks"]) == 1 and before["webhooks"][0][-1] == WEBHOOK["secret"]
    assert [m[0] for m in before["mental_models"]] == ["caroline", "pets-summary"]
    assert before["mental_models"][1][6] == [("Caroline has a dog.", "refreshed")]
    assert any(u["sources"] for u in before["units"] if u["fact_type"] != "observation")
    client = Hindsight(base_url=server.url, timeout=60)
    try:
        archive = client.export_bank(source, poll_interval=0.1)
        target = "imported-" + uuid.uuid4().hex[:6]
        operation_id = client.import_bank(source, archive, target_bank_id=target)
    finally:
        client.close()
    status = wait_done(server, source, operation_id)
    assert status["status"] == "completed", status
    assert status["operation_type"] == "bank_import"
    assert status["result_metadata"]["bank_id"] == target
    assert status["result_metadata"]["documents"] == 3
    after = snapshot(server, target)
    assert after == before
    assert get(server, f"/v1/default/banks/{target}")["name"] == "Pets"
    # New ids for memories; the document ids are the bank's and stay.
    assert not {u["id"] for u in memories(server, target)} & {
        u["id"] for u in memories(server, source)
    }
    # The uploaded archive is gone with its run; the export stays downloadable.
    rows = _count(server, "SELECT COUNT(*) FROM transfer_archives WHERE kind = 'upload'")
    assert rows == 0


def _count(server: LiveServer, sql: str, *params: Any) -> int:
    with server.app.state.services.database.read() as conn:
        return int(conn.execute(sql, params).fetchone()[0])


def test_clone_with_and_without_data_and_configuration(server: LiveServer, source: str) -> None:
    before = snapshot(server, source)
    client = Hindsight(base_url=server.url, timeout=60)
    try:
        whole = "clone-" + uuid.uuid4().hex[:6]
        status = wait_done(server, source, client.clone_bank(source, whole))
        assert status["status"] == "completed", status
        assert status["operation_type"] == "bank_clone"
        assert snapshot(server, whole) == before

        empty = "clone-" + uuid.uuid4().hex[:6]
        op = client.clone_bank(source, empty, include_data=False)
        assert wait_done(server, source, op)["status"] == "completed"
        assert memories(server, empty) == []
        assert get(server, f"/v1/default/banks/{empty}")["mission"] == "Remember pets."

        bare = "clone-" + uuid.uuid4().hex[:6]
        op = client.clone_bank(source, bare, include_bank_config=False)
        assert wait_done(server, source, op)["status"] == "completed"
        profile = get(server, f"/v1/default/banks/{bare}")
        assert profile["mission"] == "" and profile["disposition"]["empathy"] == 3
        assert get(server, f"/v1/default/banks/{bare}/directives")["items"] == []
        carried = knowledge(server, bare)
        assert carried["webhooks"] == carried["mental_models"] == []
        assert "People" not in json.dumps(carried["tree"])
        # Without data, the configuration still travels whole (its pages are not stale:
        # the clone holds nothing newer than them).
        alone = knowledge(server, empty)
        assert (alone["webhooks"], alone["mental_models"]) == (
            before["webhooks"],
            before["mental_models"],
        )
        assert json.dumps(alone["tree"]) == json.dumps(before["tree"]).replace(
            '"is_stale": true', '"is_stale": false'
        )
        assert len(memories(server, bare)) == len(before["units"])
    finally:
        client.close()

    base = f"{server.url}/v1/default/banks/{source}"
    taken = httpx.post(f"{base}/clone", params={"target_bank_id": whole}, timeout=30)
    assert taken.status_code == 409 and "exists" in taken.json()["detail"]
    history = httpx.post(
        f"{base}/clone", params={"target_bank_id": "x-new", "include_history": "true"}, timeout=30
    )
    assert history.status_code == 400 and "include_history" in history.json()["detail"]
    bad = httpx.post(f"{base}/clone", params={"target_bank_id": "-bad id"}, timeout=30)
    assert bad.status_code == 422 and "target_bank_id" in bad.text  # the schema's pattern
    missing = httpx.post(
        f"{server.url}/v1/default/banks/nope-{uuid.uuid4().hex}/clone",
        params={"target_bank_id": "x-new"},
        timeout=30,
    )
    assert missing.status_code == 404
    assert httpx.get(f"{server.url}/v1/default/banks/x-new", timeout=30).status_code == 404


def test_export_documents_carries_the_documents_named(server: LiveServer, source: str) -> None:
    client = Hindsight(base_url=server.url, timeout=60)
    try:
        archive = client.export_documents(source, ["trip"], poll_interval=0.1)
        manifest = arc.manifest_of(arc.entries(archive))
        assert manifest["scope"] == "documents"
        target = "docs-" + uuid.uuid4().hex[:6]
        status = wait_done(
            server, source, client.import_bank(source, archive, target_bank_id=target)
        )
        assert status["status"] == "completed", status
        assert [d["id"] for d in get(server, f"/v1/default/banks/{target}/documents")["items"]] == [
            "trip"
        ]
        assert {u["text"] for u in memories(server, target)} == {
            "Bob went sailing to Brest in May."
        }
        with_observations = client.export_documents(
            source, include_observations=True, poll_interval=0.1
        )
        names = {s["name"] for s in arc.manifest_of(arc.entries(with_observations))["sections"]}
        assert "observations" in names and "bank" not in names
    finally:
        client.close()
    named = httpx.post(
        f"{server.url}/v1/default/banks/{source}/document-transfer/export",
        params={"include_knowledge_base": "true", "document_id": "trip"},
        timeout=30,
    )
    assert named.status_code == 400 and "include_knowledge_base" in named.json()["detail"]


def test_export_documents_with_the_knowledge_base(server: LiveServer, source: str) -> None:
    client = Hindsight(base_url=server.url, timeout=60)
    try:
        archive = client.export_documents(source, include_knowledge_base=True, poll_interval=0.1)
        names = {s["name"] for s in arc.manifest_of(arc.entries(archive))["sections"]}
        assert {"knowledge_folders", "mental_models"} <= names
        assert not names & {"bank", "directives", "webhooks"}
        target = "kb-" + uuid.uuid4().hex[:6]
        status = wait_done(
            server, source, client.import_bank(source, archive, target_bank_id=target)
        )
        assert status["status"] == "completed", status
        assert status["result_metadata"]["mental_models"] == 2
    finally:
        client.close()
    mine, theirs = knowledge(server, target), knowledge(server, source)
    assert mine["mental_models"] == theirs["mental_models"]
    assert mine["tree"] == theirs["tree"]
    assert mine["webhooks"] == []


def _import(
    server: LiveServer, bank: str, archive: bytes, target: str, **params: str
) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/default/banks/{bank}/transfer/import",
        params={"target_bank_id": target, **params},
        files={"file": ("bank.zip", archive, "application/zip")},
        timeout=60,
    )


def _stream_events(server: LiveServer, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    events = []
    with httpx.stream("GET", f"{server.url}/v1/runs/{run_id}/stream", timeout=60) as response:
        kind = None
        for line in response.iter_lines():
            if line.startswith("event:"):
                kind = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and kind:
                events.append((kind, json.loads(line.split(":", 1)[1])["data"]))
    return events


def test_an_import_is_an_operation_with_progress_on_its_stream(server: LiveServer) -> None:
    bank = "host-" + uuid.uuid4().hex[:6]
    httpx.put(f"{server.url}/v1/default/banks/{bank}", json={}, timeout=30).raise_for_status()
    target = "synthetic-" + uuid.uuid4().hex[:6]
    response = _import(server, bank, arc.synthetic_archive(3000), target)
    assert response.status_code == 202, response.text
    run_id = response.json()["operation_id"]
    events = _stream_events(server, run_id)
    kinds = [k for k, _ in events]
    assert kinds[0] == "started" and kinds[-1] == "completed", kinds
    progress = [d for k, d in events if k == "progress"]
    assert progress and progress[-1]["processed"] <= progress[-1]["total"]
    assert [p["processed"] for p in progress] == sorted(p["processed"] for p in progress)
    listed = get(server, f"/v1/default/banks/{bank}/operations")["operations"]
    assert [(o["id"], o["operation_type"], o["status"]) for o in listed] == [
        (run_id, "bank_import", "completed")
    ]
    stats = get(server, f"/v1/default/banks/{target}/stats")
    assert stats["nodes_by_fact_type"] == {"world": 3000}
    assert stats["links_by_link_type"] == {"temporal": 2970}
    hits = httpx.post(
        f"{server.url}/v1/default/banks/{target}/memories/recall",
        json={"query": "note 1234 about the kayak"},
        timeout=30,
    ).json()["results"]
    assert hits[0]["text"].startswith("Speaker2: note 1234 about ")


def _staging_banks(server: LiveServer) -> int:
    return _count(server, "SELECT COUNT(*) FROM memory_banks WHERE tenant = ?", STAGING_TENANT)


def _processing(server: LiveServer, bank: str, run_id: str) -> bool:
    status = get(server, f"/v1/default/banks/{bank}/operations/{run_id}")
    progress = status.get("progress") or {}
    return status["status"] == "processing" and 0 < progress.get("processed", 0) < progress.get(
        "total", 0
    )


@pytest.fixture(scope="module")
def big_archive(server: LiveServer) -> bytes:
    """An archive whose import takes seconds: on SQLite 12,000 memories (about 10 s on
    two cores), on PostgreSQL 2,000 (its HNSW index takes a few ms per vector); with a
    webhook and a mental model, staged before the memories."""
    sqlite = server.app.state.services.database.dialect == "sqlite"
    archive = arc.synthetic_archive(12_000 if sqlite else 2_000, per_document=400)
    return _with_section(
        _with_section(archive, "webhooks", [_webhook()]), "mental_models", [_model()]
    )


def test_a_cancel_while_processing_leaves_no_bank(server: LiveServer, big_archive: bytes) -> None:
    bank = "host-" + uuid.uuid4().hex[:6]
    httpx.put(f"{server.url}/v1/default/banks/{bank}", json={}, timeout=30).raise_for_status()
    target = "cancelled-" + uuid.uuid4().hex[:6]
    response = _import(server, bank, big_archive, target)
    assert response.status_code == 202, response.text
    run_id = response.json()["operation_id"]
    wait_for(lambda: _processing(server, bank, run_id), seconds=60)
    sent = time.time()
    cancelled = httpx.delete(
        f"{server.url}/v1/default/banks/{bank}/operations/{run_id}", timeout=30
    )
    assert cancelled.status_code == 200
    run = wait_for(
        lambda: (r := get(server, f"/v1/runs/{run_id}"))["phase"] == "cancelled" and r, seconds=30
    )
    assert run["finished_at"] - sent < 5  # generous: the benchmark measures the latency
    assert httpx.get(f"{server.url}/v1/default/banks/{target}", timeout=30).status_code == 404
    lane = server.app.state.services.lanes["retain"]
    assert lane.stats().in_use == 0
    wait_for(lambda: _staging_banks(server) == 0, seconds=30)  # the partial bank is deleted
    orphans = (
        "SELECT COUNT(*) FROM memory_units u"
        " WHERE NOT EXISTS (SELECT 1 FROM memory_banks b WHERE b.ref = u.bank_ref)"
    )
    assert _count(server, orphans) == 0
    for table in ("webhooks", "memory_mental_models"):  # staged before the memories
        assert _count(server, orphans.replace("memory_units", table)) == 0
    assert _count(server, "SELECT COUNT(*) FROM transfer_archives WHERE kind = 'upload'") == 0


def test_deleting_the_bank_stops_its_import(server: LiveServer, big_archive: bytes) -> None:
    bank = "host-" + uuid.uuid4().hex[:6]
    httpx.put(f"{server.url}/v1/default/banks/{bank}", json={}, timeout=30).raise_for_status()
    target = "orphan-" + uuid.uuid4().hex[:6]
    response = _import(server, bank, big_archive, target)
    run_id = response.json()["operation_id"]
    wait_for(lambda: _processing(server, bank, run_id), seconds=60)
    started = time.monotonic()
    assert httpx.delete(f"{server.url}/v1/default/banks/{bank}", timeout=30).status_code == 200
    assert time.monotonic() - started < 10
    run = get(server, f"/v1/runs/{run_id}")
    assert run["phase"] == "cancelled" and run["cancel_reason"] == "bank deleted"
    assert httpx.get(f"{server.url}/v1/default/banks/{target}", timeout=30).status_code == 404
    wait_for(lambda: _staging_banks(server) == 0, seconds=30)


def test_deleting_the_source_stops_its_clone(server: LiveServer, big_archive: bytes) -> None:
    host = "host-" + uuid.uuid4().hex[:6]
    httpx.put(f"{server.url}/v1/default/banks/{host}", json={}, timeout=30).raise_for_status()
    big = "big-" + uuid.uuid4().hex[:6]
    op = _import(server, host, big_archive, big).json()["operation_id"]
    assert wait_done(server, host, op)["status"] == "completed"
    target = "clone-" + uuid.uuid4().hex[:6]
    response = httpx.post(
        f"{server.url}/v1/default/banks/{big}/clone", params={"target_bank_id": target}, timeout=30
    )
    run_id = response.json()["operation_id"]
    wait_for(lambda: _processing(server, big, run_id), seconds=60)
    assert httpx.delete(f"{server.url}/v1/default/banks/{big}", timeout=60).status_code == 200
    run = get(server, f"/v1/runs/{run_id}")
    assert run["phase"] == "cancelled" and run["cancel_reason"] == "bank deleted"
    assert httpx.get(f"{server.url}/v1/default/banks/{target}", timeout=30).status_code == 404
    wait_for(lambda: _staging_banks(server) == 0, seconds=30)


# -- hostile archives ----------------------------------------------------------------------


def _patch_directory(
    archive: bytes, name: str, *, size: int | None = None, flags: int | None = None
) -> bytes:
    """*archive* with the central directory record of *name* claiming *size* bytes
    unpacked, or *flags* (what a crafted zip would say)."""
    data = bytearray(archive)
    at = 0
    while (at := data.find(b"PK\x01\x02", at)) >= 0:
        length = struct.unpack_from("<H", data, at + 28)[0]
        if data[at + 46 : at + 46 + length] == name.encode():
            if size is not None:
                struct.pack_into("<I", data, at + 24, size)
            if flags is not None:
                struct.pack_into("<H", data, at + 8, flags)
            return bytes(data)
        at += 4
    raise AssertionError(f"no {name} in the directory")


def _first_line(archive: bytes, prefix: str, record: dict[str, Any]) -> bytes:
    """*archive* with the first record of its first entry named *prefix...* replaced."""

    def change(files: dict[str, bytes]) -> None:
        name = next(n for n in files if n.startswith(prefix))
        rest = files[name].splitlines(keepends=True)[1:]
        files[name] = b"".join([json.dumps(record).encode() + b"\n", *rest])

    return arc.changed(archive, change)


def _bank_config(archive: bytes, config: dict[str, Any]) -> bytes:
    """*archive* whose bank's settings are *config*."""

    def change(files: dict[str, bytes]) -> None:
        files["bank.json"] = json.dumps(
            {**json.loads(files["bank.json"]), "config": config}
        ).encode()

    return arc.changed(archive, change)


def _with_section(archive: bytes, section: str, records: list[dict[str, Any]]) -> bytes:
    """*archive* with *section* (in its place in the order) holding *records*."""

    def change(files: dict[str, bytes]) -> None:
        manifest = arc.manifest_of(files)
        sections = manifest["sections"]
        assert isinstance(sections, list)
        entry = f"{section}/000099.jsonl"
        before = [s for s in sections if SECTIONS.index(s["name"]) < SECTIONS.index(section)]
        after = [s for s in sections if SECTIONS.index(s["name"]) > SECTIONS.index(section)]
        own = {"name": section, "entries": [entry], "records": len(records)}
        manifest["sections"] = [*before, own, *after]
        arc.with_manifest(files, manifest)
        files[entry] = b"".join(json.dumps(r).encode() + b"\n" for r in records)

    return arc.changed(archive, change)


def _entities(archive: bytes, extra: list[tuple[str, str]]) -> bytes:
    """*archive* whose entities section holds its own entities, then one per *extra*
    ``(id, name)``, in shards of 5,000 records."""

    def change(files: dict[str, bytes]) -> None:
        old = [n for n in files if n.startswith("entities/")]
        lines = [line for n in old for line in files.pop(n).splitlines(keepends=True)]
        lines += [
            json.dumps({"id": i, "name": name, "type": "thing"}).encode() + b"\n"
            for i, name in extra
        ]
        entries = []
        for at in range(0, len(lines), 5000):
            entries.append(f"entities/{len(entries) + 1:06d}.jsonl")
            files[entries[-1]] = b"".join(lines[at : at + 5000])
        manifest = arc.manifest_of(files)
        sections = manifest["sections"]
        assert isinstance(sections, list)
        manifest["sections"] = [
            {**s, "entries": entries, "records": len(lines)} if s["name"] == "entities" else s
            for s in sections
        ]
        arc.with_manifest(files, manifest)

    return arc.changed(archive, change)


def _peak_rss_kb() -> int:
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM")).split()[1])


def test_an_archive_of_many_long_ids_is_checked_in_bounded_memory(server: LiveServer) -> None:
    """Issue 37: 250,000 entity records with long ids and names once cost the check 690 MB
    (every id and name kept as a string). 50,000 here would cost about 130 MB that way."""
    good = arc.synthetic_archive(30, per_document=10)
    extra = [(f"{i:08d}-" + "i" * 490, f"{i:08d} " + "n" * 1890) for i in range(50_000)]
    extra.append(("last", extra[-1][1]))  # a duplicate name at the very end: a 400
    archive = _entities(good, extra)
    bank = "host-" + uuid.uuid4().hex[:6]
    httpx.put(f"{server.url}/v1/default/banks/{bank}", json={}, timeout=30).raise_for_status()
    Path("/proc/self/clear_refs").write_text("5")  # the peak resident size starts again
    before = _peak_rss_kb()
    response = _import(server, bank, archive, "big-" + uuid.uuid4().hex[:6])
    grew_mb = (_peak_rss_kb() - before) / 1024
    assert response.status_code == 400, response.text
    assert "is in the archive twice" in response.json()["detail"]
    assert grew_mb < 40, f"the check grew the process by {grew_mb:.0f} MB"


def _folder(**fields: Any) -> dict[str, Any]:
    base = {"id": "f", "name": "F", "parent_id": None, "managed": False}
    return base | {"created_at": arc.NOW, "updated_at": arc.NOW} | fields


def _model(**fields: Any) -> dict[str, Any]:
    record = {
        "id": "m",
        "name": "M",
        "source_query": "What?",
        "content": "",
        "tags": [],
        "max_tokens": 2048,
        "trigger": {"mode": "full"},
        "parent_id": None,
        "is_page": False,
        "reflect_response": None,
        "created_at": arc.NOW,
        "updated_at": arc.NOW,
        "last_refreshed_at": None,
        "last_refresh_failed_at": None,
        "history": [],
        "vector": None,
    }
    return record | fields


def _webhook(**fields: Any) -> dict[str, Any]:
    record = {
        "id": "wh_1",
        "url": "http://127.0.0.1:9/x",
        "secret": "a-long-secret",
        "event_types": ["run.completed"],
        "enabled": True,
        "http_config": {"method": "POST", "timeout_seconds": 5, "headers": {}, "params": {}},
        "created_at": arc.NOW,
        "updated_at": arc.NOW,
    }
    return record | fields


def _directive(archive: bytes, fields: dict[str, Any]) -> bytes:
    """*archive* with a directive (*fields* over a valid one)."""
    record = {
        "id": "d-1",
        "name": "french",
        "content": "Answer in French.",
        "priority": 0,
        "is_active": True,
        "tags": [],
        "created_at": arc.NOW,
        "updated_at": arc.NOW,
        **fields,
    }
    return _with_section(archive, "directives", [record])


def _hostile() -> list[tuple[str, bytes, str]]:
    good = arc.synthetic_archive(30, per_document=10)
    files = arc.entries(good)
    units_entry, lines = arc.first_unit_line(files)
    first = json.loads(lines[0])
    cases: list[tuple[str, bytes, str]] = [("not a zip", b"hello, not a zip", "not a zip")]

    def manifest_change(**fields: Any) -> bytes:
        def change(f: dict[str, bytes]) -> None:
            arc.with_manifest(f, {**arc.manifest_of(f), **fields})

        return arc.changed(good, change)

    def unit_change(line: bytes) -> bytes:
        def change(f: dict[str, bytes]) -> None:
            f[units_entry] = b"".join([line, *lines[1:]])

        return arc.changed(good, change)

    def unit_json(**fields: Any) -> bytes:
        return unit_change(json.dumps({**first, **fields}).encode() + b"\n")

    stored = arc.zipped(list(files.items()))
    raw = base64.b64decode(first["vector"])
    manifest = arc.manifest_of(files)
    sections = manifest["sections"]
    assert isinstance(sections, list)
    cases += [
        ("newer version", manifest_change(version=3), "version 3 is newer"),
        ("another format", manifest_change(format="zip-of-stuff"), "format is"),
        (
            "unknown section",
            manifest_change(
                sections=[*sections, {"name": "audit_log", "entries": [], "records": 0}]
            ),
            "'audit_log' is not one this heed imports",
        ),
        (
            "section newer than its version",
            arc.changed(
                _with_section(good, "mental_models", [_model()]),
                lambda f: arc.with_manifest(f, {**arc.manifest_of(f), "version": 1}),
            ),
            "'mental_models' is not in format version 1",
        ),
        (
            "page in no folder",
            _with_section(good, "mental_models", [_model(is_page=True, parent_id="nowhere")]),
            "names folder 'nowhere'",
        ),
        (
            "model with a parent",
            _with_section(
                _with_section(good, "knowledge_folders", [_folder()]),
                "mental_models",
                [_model(parent_id="f")],
            ),
            "has a parent but is no page",
        ),
        (
            "folder cycle",
            _with_section(
                good,
                "knowledge_folders",
                [_folder(id="a", name="A", parent_id="b"), _folder(id="b", parent_id="a")],
            ),
            "cycle",
        ),
        (
            "two siblings one name",
            _with_section(
                good,
                "knowledge_folders",
                [_folder(id="a", name="Same"), _folder(id="b", name="Same")],
            ),
            "a node named 'Same'",
        ),
        (
            "refused trigger",
            _with_section(good, "mental_models", [_model(trigger={"refresh_cron": "* * * * *"})]),
            "refresh_cron",
        ),
        (
            "webhook event heed does not know",
            _with_section(good, "webhooks", [_webhook(event_types=["bank.exploded"])]),
            "'bank.exploded'",
        ),
        (
            "webhook with a short secret",
            _with_section(good, "webhooks", [_webhook(secret="x")]),
            "secret",
        ),
        (
            "webhooks in a documents archive",
            arc.changed(
                _with_section(good, "webhooks", [_webhook()]),
                lambda f: arc.with_manifest(
                    f,
                    {
                        **arc.manifest_of(f),
                        "scope": "documents",
                        "sections": [
                            s
                            for s in arc.manifest_of(f)["sections"]  # type: ignore[attr-defined]
                            if s["name"] != "bank"
                        ],
                    },
                ),
            ),
            "a documents archive holds no",
        ),
        (
            "wrong dimension",
            manifest_change(embedding={"model": arc.MODEL, "dim": 768}),
            "768 dimensions",
        ),
        (
            "another model",
            manifest_change(embedding={"model": "openai:x", "dim": 384}),
            "'openai:x'",
        ),
        (
            "bad count",
            manifest_change(
                sections=[
                    {**s, "records": s["records"] + 1} if s["name"] == "links" else s
                    for s in sections
                ]
            ),
            "declares",
        ),
        ("bad UTF-8", unit_change(b'{"id": "\xff\xfe"}\n'), "not UTF-8"),
        ("invalid JSON", unit_change(b'{"id": \n'), "not valid JSON"),
        (
            "NaN",
            unit_change(
                json.dumps({**first, "proof_count": 1})
                .replace('"proof_count": 1', '"proof_count": NaN')
                .encode()
                + b"\n"
            ),
            "not valid JSON",
        ),
        ("duplicate key", unit_change(b'{"id": "a", "id": "b"}\n'), "twice in one object"),
        (
            "lone surrogate",
            unit_change(json.dumps({**first, "text": "x\ud800y"}).encode() + b"\n"),
            "surrogate",
        ),
        ("NUL", unit_json(text="a\x00b"), "NUL"),
        ("short vector", unit_json(vector=base64.b64encode(raw[:-4]).decode()), "383 dimensions"),
        ("not a vector", unit_json(vector="!!!"), "not base64"),
        ("unknown field", unit_json(secret="x"), "secret"),
        ("wrong type", unit_json(token_count="12"), "token_count"),
        ("duplicate id", unit_json(id=json.loads(lines[1])["id"]), "twice"),
        (
            "a record of two million empty objects",
            unit_change(b'{"metadata": [' + b"{}," * 2_000_000 + b"{}]}\n"),
            "JSON values; the limit is 1000000 a record",
        ),
        (
            "duplicate entity name",
            _entities(good, [("long-" + "e" * 400, "Speaker3")]),
            "entity name (case and spaces aside) 'speaker3' is in the archive twice",
        ),
        (
            "dangling entity row",
            _first_line(good, "unit_entities/", {"unit_id": first["id"], "entity_id": "nobody"}),
            "an entity row names entity 'nobody'",
        ),
        ("bad time", unit_json(mentioned_at="yesterday"), "mentioned_at"),
        ("another document", unit_json(document_id="doc-99999"), "names document"),
        (
            "dangling link",
            _first_line(
                good,
                "links/",
                {"from_id": "nobody", "to_id": first["id"], "link_type": "temporal", "weight": 1.0},
            ),
            "a link names memory",
        ),
        ("unknown setting", _bank_config(good, {"not_a_setting": 1}), "not_a_setting"),
        ("blank directive", _directive(good, {"content": "   "}), "content"),
        (
            "wrong setting type",
            _bank_config(good, {"enable_observations": "yes"}),
            "enable_observations",
        ),
        (
            "path trick",
            arc.zipped([*files.items(), ("../../etc/passwd", b"x")]),
            "is not one a heed archive holds",
        ),
        (
            "absolute path",
            arc.zipped([*files.items(), ("/units/000001.jsonl", b"x")]),
            "is not one a heed archive holds",
        ),
        ("unlisted entry", arc.zipped([*files.items(), ("units/000099.jsonl", b"")]), "not listed"),
        ("twice", arc.zipped([*files.items(), (units_entry, files[units_entry])]), "twice"),
        ("declared huge", _patch_directory(stored, units_entry, size=2**31), "declares"),
        ("encrypted", _patch_directory(stored, units_entry, flags=0x1), "encrypted"),
        (
            "zip bomb",
            arc.zipped([*files.items(), ("units/000077.jsonl", b"\n" * 3_000_000)]),
            "zip bomb",
        ),
        (
            "lying size",
            _patch_directory(stored, units_entry, size=len(files[units_entry]) - len(lines[-1])),
            "damaged",
        ),
    ]
    return cases


HOSTILE = _hostile()


@pytest.mark.parametrize(("case", "archive", "says"), HOSTILE, ids=[c[0] for c in HOSTILE])
def test_a_hostile_archive_is_a_400_naming_the_problem_and_writes_nothing(
    server: LiveServer, case: str, archive: bytes, says: str
) -> None:
    bank = "host-" + uuid.uuid4().hex[:6]
    httpx.put(f"{server.url}/v1/default/banks/{bank}", json={}, timeout=30).raise_for_status()
    target = "hostile-" + uuid.uuid4().hex[:6]
    archives = _count(server, "SELECT COUNT(*) FROM transfer_archives")
    response = _import(server, bank, archive, target)
    assert response.status_code == 400, (case, response.text)
    assert says in response.json()["detail"], (case, response.json()["detail"])
    assert httpx.get(f"{server.url}/v1/default/banks/{target}", timeout=30).status_code == 404
    assert get(server, f"/v1/default/banks/{bank}/operations")["total"] == 0
    assert _count(server, "SELECT COUNT(*) FROM transfer_archives") == archives
    assert _staging_banks(server) == 0


def test_import_refuses_what_heed_does_not_do(server: LiveServer) -> None:
    bank = "host-" + uuid.uuid4().hex[:6]
    httpx.put(f"{server.url}/v1/default/banks/{bank}", json={}, timeout=30).raise_for_status()
    archive = arc.synthetic_archive(5, per_document=5)
    merge = _import(server, bank, archive, "m-" + bank, mode="merge")
    assert merge.status_code == 400 and "mode" in merge.json()["detail"]
    history = _import(server, bank, archive, "h-" + bank, include_history="true")
    assert history.status_code == 400 and "include_history" in history.json()["detail"]
    taken = _import(server, bank, archive, bank)
    assert taken.status_code == 409


# -- merge ------------------------------------------------------------------------------------


def _documents(server: LiveServer, bank: str) -> dict[str, int]:
    items = get(server, f"/v1/default/banks/{bank}/documents")["items"]
    return {d["id"]: d["memory_unit_count"] for d in items}


def test_a_merge_folds_the_documents_into_the_bank(server: LiveServer, source: str) -> None:
    host = "merge-" + uuid.uuid4().hex[:6]
    httpx.put(f"{server.url}/v1/default/banks/{host}", json={}, timeout=30).raise_for_status()
    client = Hindsight(base_url=server.url, timeout=60)
    try:
        script(server, {"when": "[0] (", "json": {"facts": []}})
        client.retain(host, "Alice went sailing to Cork.", document_id="trip")
        archive = client.export_bank(source, poll_interval=0.1)
    finally:
        client.close()
    theirs = _documents(server, source)
    assert set(theirs) == {"chat", "birthday", "trip"}

    def merge(conflict: str | None) -> dict[str, Any]:
        params = {"mode": "merge"} | ({"document_conflict": conflict} if conflict else {})
        response = _import(server, host, archive, host, **params)
        assert response.status_code == 202, response.text
        status = wait_done(server, host, response.json()["operation_id"])
        assert status["status"] == "completed", status
        result: dict[str, Any] = status["result_metadata"]
        return result

    skipped = merge(None)  # skip is the default
    assert (skipped["documents"], skipped["skipped"]) == (2, 1)
    mine = _documents(server, host)
    assert mine == {"trip": 1, "chat": theirs["chat"], "birthday": theirs["birthday"]}
    texts = {m["text"] for m in memories(server, host)}
    assert "Alice went sailing to Cork." in texts
    assert "Caroline adopted a beagle puppy named Rex." in texts
    assert not any("Brest" in t for t in texts)  # the bank's trip stayed
    # Entities are the bank's, found by name: the merged facts name Rex.
    rex = [m for m in memories(server, host) if "Rex" in (m.get("entities") or [])]
    assert rex
    # Recall finds merged memories (the vector index follows the writes).
    found = httpx.post(
        f"{server.url}/v1/default/banks/{host}/memories/recall",
        json={"query": "What breed is Rex?"},
        timeout=30,
    ).json()["results"]
    assert any("beagle" in r["text"] for r in found[:5])

    renamed = merge("new-id")
    assert (renamed["documents"], renamed["renamed"]) == (3, 3)
    assert len(_documents(server, host)) == 6

    replaced = merge("replace")
    assert (replaced["documents"], replaced["replaced"]) == (3, 3)
    texts = {m["text"] for m in memories(server, host)}
    assert "Alice went sailing to Cork." not in texts
    assert any("Brest" in t for t in texts)


def test_import_documents_is_a_merge(server: LiveServer, source: str) -> None:
    from hindsight_client.hindsight_client import _run_async

    host = "docs-merge-" + uuid.uuid4().hex[:6]
    client = Hindsight(base_url=server.url, timeout=60)
    try:
        httpx.put(f"{server.url}/v1/default/banks/{host}", json={}, timeout=30).raise_for_status()
        archive = client.export_documents(source, ["trip"], poll_interval=0.1)
        with pytest.warns(DeprecationWarning):
            submitted = _run_async(
                client.document_transfer.import_documents(
                    host, ("trip.zip", archive), on_conflict="new-id"
                )
            )
    finally:
        client.close()
    status = wait_done(server, host, submitted.operation_id)
    assert status["status"] == "completed" and status["result_metadata"]["mode"] == "merge"
    assert _documents(server, host) == {"trip": 1}


def test_a_merge_refuses_what_it_does_not_do(server: LiveServer) -> None:
    host = "merge-" + uuid.uuid4().hex[:6]
    httpx.put(f"{server.url}/v1/default/banks/{host}", json={}, timeout=30).raise_for_status()
    archive = arc.synthetic_archive(5, per_document=5)
    for params, says in (
        ({"document_conflict": "overwrite"}, "document_conflict"),
        ({"target_bank_id": "elsewhere"}, "target_bank_id"),
        ({"include_bank_config": "true"}, "include_bank_config"),
        ({"include_data": "false"}, "include_data"),
    ):
        response = _import(server, host, archive, host, mode="merge", **params)
        assert response.status_code == 400 and says in response.json()["detail"], params
    bogus = _import(server, host, archive, host, mode="fold")
    assert bogus.status_code == 400 and "mode" in bogus.json()["detail"]
    conflict = _import(server, host, archive, "x-" + host, document_conflict="skip")
    assert conflict.status_code == 400 and "document_conflict" in conflict.json()["detail"]
    assert get(server, f"/v1/default/banks/{host}/operations")["total"] == 0


def test_a_cancelled_merge_leaves_whole_documents(server: LiveServer, big_archive: bytes) -> None:
    host = "merge-" + uuid.uuid4().hex[:6]
    httpx.put(f"{server.url}/v1/default/banks/{host}", json={}, timeout=30).raise_for_status()
    response = _import(server, host, big_archive, host, mode="merge")
    assert response.status_code == 202, response.text
    run_id = response.json()["operation_id"]
    wait_for(lambda: _processing(server, host, run_id), seconds=60)
    cancel = httpx.delete(f"{server.url}/v1/default/banks/{host}/operations/{run_id}", timeout=30)
    assert cancel.status_code == 200
    run = wait_for(
        lambda: (r := get(server, f"/v1/runs/{run_id}"))["phase"] == "cancelled" and r, seconds=30
    )
    assert run["phase"] == "cancelled"
    merged = _documents(server, host)
    assert len(merged) < 12_000 // 400 + 1
    assert all(count == 400 for count in merged.values())  # whole, or not there
    assert server.app.state.services.lanes["retain"].stats().in_use == 0


def test_an_archive_upload_may_pass_the_body_limit_up_to_the_upload_limit(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("uploads"),
        max_body_bytes=16 * 1024,
        max_upload_bytes=1024 * 1024,
    )
    archive = arc.synthetic_archive(100, per_document=50)
    assert 16 * 1024 < len(archive) < 1024 * 1024
    with live_server(create_app(settings)) as srv:
        httpx.put(f"{srv.url}/v1/default/banks/host", json={}, timeout=30).raise_for_status()
        response = _import(srv, "host", archive, "uploaded")
        assert response.status_code == 202, response.text
        status = wait_done(srv, "host", response.json()["operation_id"])
        assert status["status"] == "completed" and status["result_metadata"]["units"] == 100
        merged = _import(srv, "host", archive, "host", mode="merge")
        assert merged.status_code == 202, merged.text
        # Past the upload limit: a 413 naming it, and nothing stored.
        big = arc.zipped([("manifest.json", bytes(range(256)) * 5000)], zipfile.ZIP_STORED)
        refused = _import(srv, "host", big, "too-big")
        assert refused.status_code == 413 and "HEED_MAX_UPLOAD_BYTES" in refused.json()["detail"]
        # Any other body keeps the body limit.
        body = httpx.post(
            f"{srv.url}/v1/default/banks/host/memories",
            json={"items": [{"content": "x " * 20_000}]},
            timeout=30,
        )
        assert body.status_code == 413 and "HEED_MAX_BODY_BYTES" in body.json()["detail"]
        files = httpx.post(
            f"{srv.url}/v1/default/banks/host/files/retain",
            files={"files": ("a.zip", archive, "application/zip")},
            timeout=30,
        )
        assert files.status_code == 413
