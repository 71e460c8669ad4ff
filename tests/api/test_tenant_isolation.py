"""Tenant isolation on every route: tenant B cannot read, list, change or stream A's objects.

A real server on a socket with two API keys (tenants ``a`` and ``b``) and the scripted LLM.
Tenant A creates one of every kind of object: a bank with memories and documents (sync retain,
one document id with slashes), an async retain operation, a session with a finished turn (and so
that turn's run), and a streamed reflect run that is still running while B attacks (so a cancel
that leaked across tenants would show: the run would stop).

Then tenant B tries every route on each of A's objects. Every attempt must be a 404, never a 403
(which would say the object exists) or a 2xx, and must answer exactly what the same attempt on an
id that exists nowhere answers (so not even the wording tells B that A's object exists). Bank ids
are per tenant, so B may create its own bank under A's bank id: that bank starts empty, and A's
memory, document and operation ids are 404s inside it too. Afterwards A checks that everything
is as it was (profile, counts, memories, documents, operations, session and transcript, runs and
journals), that its reflect run is still running, and that A itself can cancel it (so B's 404 on
cancel was isolation, not a broken route).

The routes come from ``/openapi.json``: every operation whose path has a parameter must be
attempted by B (:func:`test_every_route_with_a_path_parameter_is_attempted_by_b`), so a new
route without an isolation check fails this file.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from heed.api.app import create_app
from heed.api.unserved import NOT_IMPLEMENTED
from heed.settings import Settings
from tests.support import LiveServer, live_server, wait_for

KEY_A, KEY_B = "isolation-key-a-0123456789", "isolation-key-b-0123456789"
BANK = "shared-bank-id"
"""A's bank id; B later creates a bank of its own under the same id."""
DOCS = ("notes/2024/alice.txt", "alice-zebra")
ASYNC_DOC = "async/doc-1"
FACTS = ("Alice keeps a zebra named Quux.", "Alice feeds Quux carrots every morning.")
ASYNC_FACT = "Bob paddles a yellow kayak on the lake."
SECRETS = ("Quux", "kayak", "A's bank", "A's mission", "A's chat")
"""Text only tenant A wrote: none of it may appear in any answer to B."""
RETAIN_KEY, ASYNC_KEY = "shared-idempotency-key", "shared-async-idempotency-key"
SLOW_WORDS = 3000
"""The streamed reflect's answer: 3000 tokens at 10 ms, 30 s; A cancels it when B is done."""
SLOW_QUERY = "Tell me slowly everything about Alice"


# -- the server and tenant A's objects ---------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    slow_reply = {
        "when": "slowly",
        "text": " ".join(f"w{i}" for i in range(SLOW_WORDS)),
        "token_delay": 0.01,
    }
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("isolation"),
        api_keys={KEY_A: "a", KEY_B: "b"},
        llm_provider="scripted",
        llm_script=json.dumps({"token_delay": 0, "replies": []}),  # turns: an echo, at once
        reflect_llm_script=json.dumps({"replies": [slow_reply]}),  # echo unless "slowly"
        stream_heartbeat_seconds=0.5,
        stream_poll_seconds=0.2,
        webhook_allow_private=True,  # A's webhook targets a loopback port nobody serves
    )
    with live_server(create_app(settings)) as srv:
        yield srv


def _client(server: LiveServer, key: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30)


@pytest.fixture(scope="module")
def a_client(server: LiveServer) -> Iterator[httpx.Client]:
    with _client(server, KEY_A) as client:
        yield client


@pytest.fixture(scope="module")
def b_client(server: LiveServer) -> Iterator[httpx.Client]:
    with _client(server, KEY_B) as client:
        yield client


@dataclass
class AObjects:
    """Ids of everything tenant A created."""

    memory_ids: list[str]
    document_ids: list[str]
    operation_id: str
    session_id: str
    turn_run_id: str
    reflect_run_id: str
    webhook_id: str = "wh_0123456789abcdef01234567"
    mental_model_id: str = "mm-none"
    folder_id: str = "folder-none"
    directive_id: str = "directive-none"
    archive_key: str = "0123456789abcdef0123456789abcdef"
    entity_ids: list[str] = field(default_factory=lambda: ["entity-none"])
    chunk_ids: list[str] = field(default_factory=lambda: ["chunk-none"])

    @property
    def run_ids(self) -> list[str]:
        return [self.turn_run_id, self.reflect_run_id, self.operation_id]


def _ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, (response.request.url, response.text)
    return response.json()


def _phase(client: httpx.Client, run_id: str) -> str:
    return str(_ok(client.get(f"/v1/runs/{run_id}"))["phase"])


def _journal(client: httpx.Client, run_id: str) -> list[tuple[int, str]]:
    """The finished run's journal as (seq, type), read to its end."""
    with client.stream("GET", f"/v1/runs/{run_id}/stream") as r:
        assert r.status_code == 200, r.read()
        text = r.read().decode()
    events = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "id" in fields:
            events.append((int(fields["id"]), fields["event"]))
    return events


@pytest.fixture(scope="module")
def a_objects(a_client: httpx.Client) -> AObjects:
    a = a_client
    bank = f"/v1/default/banks/{BANK}"
    _ok(a.put(bank, json={"name": "A's bank", "mission": "A's mission"}))
    retained = _ok(
        a.post(
            f"{bank}/memories",
            json={
                "items": [
                    {"content": fact, "document_id": doc}
                    for fact, doc in zip(FACTS, DOCS, strict=True)
                ]
            },
            headers={"Idempotency-Key": RETAIN_KEY},
        )
    )
    assert retained["document_ids"] == list(DOCS)
    queued = _ok(
        a.post(
            f"{bank}/memories",
            json={"async": True, "items": [{"content": ASYNC_FACT, "document_id": ASYNC_DOC}]},
            headers={"Idempotency-Key": ASYNC_KEY},
        )
    )
    operation_id = queued["operation_id"]
    wait_for(lambda: _phase(a, operation_id) == "completed", 20)

    _ok(a.post(f"/v1/default/banks/{BANK}/aliases", json={"alias": A_ALIAS}), 201)
    session = _ok(a.post("/v1/sessions", json={"title": "A's chat", "bank_id": BANK}), 201)
    turn = _ok(a.post(f"/v1/sessions/{session['id']}/turns", json={"content": "hello"}), 202)
    wait_for(lambda: _phase(a, turn["run_id"]) == "completed", 20)

    body = {"query": SLOW_QUERY, "stream": True, "on_disconnect": "continue"}
    with a.stream("POST", f"{bank}/reflect", json=body) as r:
        assert r.status_code == 200, r.read()
        reflect_run_id = r.headers["X-Heed-Run-Id"]
    wait_for(lambda: _ok(a.get(f"/v1/runs/{reflect_run_id}"))["last_seq"] >= 5, 20)
    assert _phase(a, reflect_run_id) == "running"

    units = _ok(a.get(f"{bank}/memories/list"))["items"]
    assert {u["text"] for u in units} >= {*FACTS, ASYNC_FACT}
    model = _ok(a.post(f"{bank}/mental-models", json={"name": "A's", "source_query": "Who?"}))
    wait_for(lambda: _phase(a, model["operation_id"]) == "completed", 20)
    folder = _ok(a.post(f"{bank}/knowledge-base/folders", json={"name": "A's folder"}), 201)
    hook = _ok(a.post(f"{bank}/webhooks", json={"url": "http://127.0.0.1:9/a"}), 201)
    rule = _ok(a.post(f"{bank}/directives", json={"name": "A's rule", "content": "Say Quux."}))
    _ok(a.patch(f"{bank}/config", json={"updates": {"retain_mission": "A's mission"}}))
    export = _ok(a.post(f"{bank}/transfer/export"), 202)["operation_id"]
    wait_for(lambda: _phase(a, export) == "completed", 20)
    archive_key = _ok(a.get(f"{bank}/operations/{export}"))["result_metadata"]["storage_key"]
    entities = _ok(a.get(f"{bank}/entities"))["items"]
    assert "Alice" in {e["canonical_name"] for e in entities}
    chunks = _ok(a.get(f"{bank}/documents/{quote(DOCS[0], safe='')}/chunks"))["items"]
    assert [c["chunk_text"] for c in chunks] == [FACTS[0]]
    return AObjects(
        memory_ids=sorted(u["id"] for u in units),
        document_ids=[*DOCS, ASYNC_DOC],
        operation_id=operation_id,
        session_id=session["id"],
        turn_run_id=turn["run_id"],
        reflect_run_id=reflect_run_id,
        webhook_id=hook["id"],
        mental_model_id=model["mental_model_id"],
        folder_id=folder["id"],
        directive_id=rule["id"],
        archive_key=archive_key,
        entity_ids=sorted(e["id"] for e in entities),
        chunk_ids=[c["chunk_id"] for c in chunks],
    )


def _a_view(a: httpx.Client, objs: AObjects) -> dict[str, Any]:
    """Everything A can see of its objects (except the reflect run, which is still running)."""
    bank = f"/v1/default/banks/{BANK}"
    stats = _ok(a.get(f"{bank}/stats"))
    stats.pop("in_flight")  # the running reflect may or may not be counted at this moment
    sid = objs.session_id
    return {
        "banks": _ok(a.get("/v1/default/banks")),
        "profile": _ok(a.get(bank)),
        "stats": stats,
        "memories": _ok(a.get(f"{bank}/memories/list")),
        "memory": {m: _ok(a.get(f"{bank}/memories/{m}")) for m in objs.memory_ids},
        "documents": _ok(a.get(f"{bank}/documents")),
        "document": {
            d: _ok(a.get(f"{bank}/documents/{quote(d, safe='')}")) for d in objs.document_ids
        },
        "operations": _ok(a.get(f"{bank}/operations")),
        "operation": _ok(a.get(f"{bank}/operations/{objs.operation_id}")),
        "sessions": _ok(a.get("/v1/sessions")),
        "session": _ok(a.get(f"/v1/sessions/{sid}")),
        "status": _ok(a.get(f"/v1/sessions/{sid}/status")),
        "turn run": _ok(a.get(f"/v1/runs/{objs.turn_run_id}")),
        "operation run": _ok(a.get(f"/v1/runs/{objs.operation_id}")),
        "turn journal": _journal(a, objs.turn_run_id),
        "operation journal": _journal(a, objs.operation_id),
        "webhooks": _ok(a.get(f"{bank}/webhooks")),
        "directives": _ok(a.get(f"{bank}/directives", params={"active_only": "false"})),
        "directive": _ok(a.get(f"{bank}/directives/{objs.directive_id}")),
        "config": _ok(a.get(f"{bank}/config")),
        "entities": _ok(a.get(f"{bank}/entities")),
        "entity": {e: _ok(a.get(f"{bank}/entities/{e}")) for e in objs.entity_ids},
        "tags": _ok(a.get(f"{bank}/tags")),
        "aliases": _ok(a.get(f"{bank}/aliases")),
        "template": _ok(a.get(f"{bank}/export")),
        "chunk": {c: _ok(a.get(f"/v1/default/chunks/{c}")) for c in objs.chunk_ids},
    }


# -- B's attempts ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    """One request of B's: an OpenAPI operation with its path parameters filled in.

    ``owned`` names the parameters that hold A's ids; the twin attempt replaces them with ids
    that exist nowhere. ``slashes`` sends ``/`` in ids as is, not as ``%2F``.
    """

    method: str
    template: str
    params: dict[str, str]
    owned: tuple[str, ...]
    query: dict[str, str] = field(default_factory=dict)
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    slashes: bool = False
    files: Any = None  # multipart: the files, with ``body`` as the form fields

    def url(self, params: dict[str, str] | None = None) -> str:
        safe = "/" if self.slashes else ""
        values = params if params is not None else self.params
        return self.template.format(**{k: quote(v, safe=safe) for k, v in values.items()})

    def twin(self) -> tuple[Attempt, dict[str, str]]:
        """The same attempt on ids that exist nowhere, and the map fake id -> real id."""
        fakes = {name: _fake_like(self.params[name]) for name in self.owned}
        params = {**self.params, **fakes}
        return Attempt(
            self.method,
            self.template,
            params,
            (),
            self.query,
            self.body,
            self.headers,
            self.slashes,
            self.files,
        ), {fakes[n]: self.params[n] for n in self.owned}


def _fake_like(value: str) -> str:
    """An id of the same shape (length, prefix, separators) that nobody created."""
    rng = random.Random(value)
    head, tail = value[:4], value[4:]
    fake = head + "".join(rng.choice("0123456789") if c.isalnum() else c for c in tail)
    assert fake != value
    return fake


def _send(client: httpx.Client, attempt: Attempt, url: str) -> httpx.Response:
    """Send *attempt*; an event stream (which would be a leak) is closed without reading."""
    multipart = attempt.files is not None
    with client.stream(
        attempt.method,
        url,
        params=attempt.query,
        json=None if multipart else attempt.body,
        data=attempt.body if multipart else None,
        files=attempt.files,
        headers=attempt.headers,
        timeout=httpx.Timeout(10, read=5),
    ) as r:
        if not r.headers.get("content-type", "").startswith("text/event-stream"):
            r.read()
        return r


BANK_T = "/v1/default/banks/{bank_id}"
A_ALIAS = "a-alias"
A_LOG_ID = "a-log-entry"
"""An audit entry id under A's bank (B reaches no entry of A's, whatever its id)."""
"""An alias of A's bank (B may not see, promote or remove it)."""
MEM_T = BANK_T + "/memories"
DOC_T = BANK_T + "/documents"
OPS_T = BANK_T + "/operations"
HOOKS_T = BANK_T + "/webhooks"
SESSION_T = "/v1/sessions/{session_id}"
RUN_T = "/v1/runs/{run_id}"

B_FACT = "B planted this fact."


def bank_attempts(objs: AObjects, *, bank_is_as: bool) -> list[Attempt]:
    """B's attempts on A's bank and what is in it. With ``bank_is_as=False`` the bank id names
    B's own bank of the same id, and only the memory, document and operation ids are A's."""
    bank = {"bank_id": BANK}
    own = ("bank_id",) if bank_is_as else ()
    out: list[Attempt] = []
    if bank_is_as:  # in B's own bank these are B's to use (checked separately)
        out += [
            Attempt("GET", BANK_T, bank, own),
            Attempt("GET", BANK_T + "/profile", bank, own),
            Attempt("GET", BANK_T + "/stats", bank, own),
            Attempt("GET", BANK_T + "/stats/memories-timeseries", bank, own),
            Attempt("PATCH", BANK_T, bank, own, body={"name": "B's name", "mission": "B's"}),
            Attempt(
                "PUT",
                BANK_T + "/profile",
                bank,
                own,
                body={"disposition": {"skepticism": 5, "literalism": 5, "empathy": 5}},
            ),
            Attempt("GET", MEM_T + "/list", bank, own),
            Attempt("GET", DOC_T, bank, own),
            Attempt("GET", OPS_T, bank, own),
            Attempt("POST", MEM_T + "/recall", bank, own, body={"query": "zebra Quux"}),
            Attempt("POST", BANK_T + "/consolidate", bank, own),
            Attempt("POST", BANK_T + "/consolidation/recover", bank, own),
            Attempt("DELETE", BANK_T + "/observations", bank, own),
            Attempt("POST", BANK_T + "/reflect", bank, own, body={"query": "Who is Quux?"}),
            Attempt(
                "POST",
                BANK_T + "/reflect",
                bank,
                own,
                body={"query": "Who is Quux?", "stream": True, "on_disconnect": "continue"},
            ),
            Attempt("POST", MEM_T, bank, own, body={"items": [{"content": B_FACT}]}),
            Attempt(
                "POST",
                MEM_T,
                bank,
                own,
                body={"items": [{"content": B_FACT, "document_id": DOCS[0]}]},
                headers={"Idempotency-Key": RETAIN_KEY},
            ),
            Attempt(
                "POST",
                MEM_T,
                bank,
                own,
                body={"async": True, "items": [{"content": B_FACT}]},
                headers={"Idempotency-Key": ASYNC_KEY},
            ),
            Attempt(
                "POST",
                BANK_T + "/files/retain",
                bank,
                own,
                body={"request": "{}"},
                files=[("files", ("b.txt", B_FACT.encode()))],
            ),
            Attempt("GET", HOOKS_T, bank, own),
            Attempt("POST", HOOKS_T, bank, own, body={"url": "http://127.0.0.1:9/b"}),
            Attempt("DELETE", MEM_T, bank, own),
            Attempt("DELETE", MEM_T, bank, own, query={"type": "world"}),
            Attempt("GET", BANK_T + "/aliases", bank, own),
            Attempt("POST", BANK_T + "/aliases", bank, own, body={"alias": "b-alias"}),
            Attempt("GET", BANK_T + "/export", bank, own),
            Attempt("GET", BANK_T + "/audit-logs", bank, own),
            Attempt("GET", BANK_T + "/audit-logs/stats", bank, own),
            Attempt("GET", BANK_T + "/llm-requests", bank, own),
            Attempt("GET", BANK_T + "/llm-requests/stats", bank, own),
            Attempt(
                "POST",
                BANK_T + "/consolidation-strategies/preview",
                bank,
                own,
                body={"strategies": []},
            ),
            Attempt("POST", BANK_T + "/health/llm", bank, own),
            Attempt("POST", MEM_T + "/dry-run-extract", bank, own, body={"content": B_FACT}),
            Attempt("DELETE", BANK_T, bank, own),
        ]
        log = {**bank, "log_id": A_LOG_ID}
        out.append(Attempt("GET", BANK_T + "/audit-logs/{log_id}", log, (*own, "log_id")))
        alias = {**bank, "alias": A_ALIAS}
        out += [
            Attempt("PATCH", BANK_T + "/aliases/{alias}", alias, own, body={"primary": True}),
            Attempt("DELETE", BANK_T + "/aliases/{alias}", alias, own),
        ]
    for memory_id in objs.memory_ids:
        params = {**bank, "memory_id": memory_id}
        for method in ("GET", "DELETE"):
            out.append(Attempt(method, MEM_T + "/{memory_id}", params, (*own, "memory_id")))
        mine = (*own, "memory_id")
        out.append(Attempt("GET", MEM_T + "/{memory_id}/history", params, mine))
        out.append(Attempt("PATCH", MEM_T + "/{memory_id}", params, mine, body={"text": "B's"}))
        out.append(
            Attempt("PATCH", MEM_T + "/{memory_id}", params, mine, body={"state": "invalidated"})
        )
        out.append(Attempt("DELETE", MEM_T + "/{memory_id}/observations", params, mine))
    for document_id in objs.document_ids:
        params = {**bank, "document_id": document_id}
        for method in ("GET", "DELETE"):
            for slashes in (False, True):
                out.append(
                    Attempt(
                        method,
                        DOC_T + "/{document_id}",
                        params,
                        (*own, "document_id"),
                        slashes=slashes,
                    )
                )
        for slashes in (False, True):
            mine = (*own, "document_id")
            out += [
                Attempt(
                    "PATCH",
                    DOC_T + "/{document_id}",
                    params,
                    mine,
                    body={"tags": ["b"]},
                    slashes=slashes,
                ),
                Attempt("POST", DOC_T + "/{document_id}/reprocess", params, mine, slashes=slashes),
            ]
    params = {**bank, "operation_id": objs.operation_id}
    for method in ("GET", "DELETE"):
        out.append(Attempt(method, OPS_T + "/{operation_id}", params, (*own, "operation_id")))
    out += [
        Attempt("POST", OPS_T + "/{operation_id}/retry", params, (*own, "operation_id")),
        Attempt("DELETE", OPS_T + "/{operation_id}/delete", params, (*own, "operation_id")),
    ]
    params = {**bank, "webhook_id": objs.webhook_id}
    mine = (*own, "webhook_id")
    out += [
        Attempt("PATCH", HOOKS_T + "/{webhook_id}", params, mine, body={"enabled": False}),
        Attempt("DELETE", HOOKS_T + "/{webhook_id}", params, mine),
        Attempt("GET", HOOKS_T + "/{webhook_id}/deliveries", params, mine),
    ]
    out += mental_model_attempts(objs, bank_is_as=bank_is_as)
    out += directive_and_config_attempts(objs, bank_is_as=bank_is_as)
    out += transfer_attempts(objs, bank_is_as=bank_is_as)
    out += view_attempts(objs, bank_is_as=bank_is_as)
    return out


def view_attempts(objs: AObjects, *, bank_is_as: bool) -> list[Attempt]:
    """B's attempts on the views of A's bank: entities, graphs, tags, scopes, chunks."""
    bank = {"bank_id": BANK}
    own = ("bank_id",) if bank_is_as else ()
    out: list[Attempt] = []
    if bank_is_as:
        out += [
            Attempt("GET", BANK_T + "/entities", bank, own),
            Attempt("GET", BANK_T + "/entities/graph", bank, own),
            Attempt("GET", BANK_T + "/graph", bank, own),
            Attempt("GET", BANK_T + "/tags", bank, own),
            Attempt("GET", BANK_T + "/observations/scopes", bank, own),
        ]
        for chunk_id in objs.chunk_ids:  # no bank in the path: attempted once
            out.append(
                Attempt(
                    "GET", "/v1/default/chunks/{chunk_id}", {"chunk_id": chunk_id}, ("chunk_id",)
                )
            )
    for entity_id in objs.entity_ids:
        params = {**bank, "entity_id": entity_id}
        mine = (*own, "entity_id")
        out += [
            Attempt("GET", BANK_T + "/entities/{entity_id}", params, mine),
            Attempt("POST", BANK_T + "/entities/{entity_id}/regenerate", params, mine),
        ]
    for document_id in objs.document_ids[:1]:
        params = {**bank, "document_id": document_id}
        for slashes in (False, True):
            for view in ("/chunks", "/history"):
                out.append(
                    Attempt(
                        "GET",
                        DOC_T + "/{document_id}" + view,
                        params,
                        (*own, "document_id"),
                        slashes=slashes,
                    )
                )
    return out


def transfer_attempts(objs: AObjects, *, bank_is_as: bool) -> list[Attempt]:
    """B's attempts to export, import into, clone A's bank, and to download A's archive."""
    if not bank_is_as:  # in B's own bank these are B's to use
        return []
    bank, own = {"bank_id": BANK}, ("bank_id",)
    archive = [("file", ("a.zip", b"PK\x05\x06" + bytes(18), "application/zip"))]
    return [
        Attempt("POST", BANK_T + "/transfer/export", bank, own),
        Attempt("POST", BANK_T + "/document-transfer/export", bank, own),
        Attempt("POST", BANK_T + "/clone", bank, own, query={"target_bank_id": "b-clone"}),
        Attempt("POST", BANK_T + "/transfer/import", bank, own, files=archive),
        Attempt("POST", BANK_T + "/document-transfer", bank, own, files=archive),
        Attempt("GET", "/v1/default/files/download/{key}", {"key": objs.archive_key}, ("key",)),
    ]


DIR_T = BANK_T + "/directives"
CONFIG_T = BANK_T + "/config"


def directive_and_config_attempts(objs: AObjects, *, bank_is_as: bool) -> list[Attempt]:
    """B's attempts on A's bank settings and directives."""
    bank = {"bank_id": BANK}
    own = ("bank_id",) if bank_is_as else ()
    out: list[Attempt] = []
    if bank_is_as:
        out += [
            Attempt("GET", CONFIG_T, bank, own),
            Attempt("PATCH", CONFIG_T, bank, own, body={"updates": {"retain_mission": "B's"}}),
            Attempt("DELETE", CONFIG_T, bank, own),
            Attempt("GET", DIR_T, bank, own),
            Attempt("POST", DIR_T, bank, own, body={"name": "B's", "content": "B's rule"}),
        ]
    rule = {**bank, "directive_id": objs.directive_id}
    mine = (*own, "directive_id")
    return [
        *out,
        Attempt("GET", DIR_T + "/{directive_id}", rule, mine),
        Attempt("PATCH", DIR_T + "/{directive_id}", rule, mine, body={"content": "B's rule"}),
        Attempt("DELETE", DIR_T + "/{directive_id}", rule, mine),
    ]


MM_T = BANK_T + "/mental-models"
KB_T = BANK_T + "/knowledge-base"


def mental_model_attempts(objs: AObjects, *, bank_is_as: bool) -> list[Attempt]:
    """B's attempts on A's mental models and knowledge base."""
    bank = {"bank_id": BANK}
    own = ("bank_id",) if bank_is_as else ()
    out: list[Attempt] = []
    if bank_is_as:
        page = {"name": "B's page", "source_query": "Who?"}
        out += [
            Attempt("GET", MM_T, bank, own),
            Attempt("POST", MM_T, bank, own, body=page),
            Attempt("GET", KB_T + "/tree", bank, own),
            Attempt("POST", KB_T + "/folders", bank, own, body={"name": "B's"}),
            Attempt("POST", KB_T + "/pages", bank, own, body=page),
            Attempt("GET", KB_T + "/search", bank, own, query={"q": "Quux"}),
            Attempt("GET", KB_T + "/export", bank, own),
        ]
    model = {**bank, "mental_model_id": objs.mental_model_id}
    mine = (*own, "mental_model_id")
    out += [
        Attempt("GET", MM_T + "/{mental_model_id}", model, mine),
        Attempt("PATCH", MM_T + "/{mental_model_id}", model, mine, body={"name": "B's"}),
        Attempt("DELETE", MM_T + "/{mental_model_id}", model, mine),
        Attempt("POST", MM_T + "/{mental_model_id}/refresh", model, mine),
        Attempt("POST", MM_T + "/{mental_model_id}/dry-run-refresh", model, mine),
        Attempt("POST", MM_T + "/{mental_model_id}/clear", model, mine),
        Attempt("GET", MM_T + "/{mental_model_id}/history", model, mine),
        Attempt(
            "GET",
            KB_T + "/pages/{page_id}",
            {**bank, "page_id": objs.mental_model_id},
            (*own, "page_id"),
        ),
    ]
    node = {**bank, "node_id": objs.folder_id}
    out += [
        Attempt("PATCH", KB_T + "/nodes/{node_id}", node, (*own, "node_id"), body={"name": "B"}),
        Attempt("DELETE", KB_T + "/nodes/{node_id}", node, (*own, "node_id")),
    ]
    return out


def session_and_run_attempts(objs: AObjects) -> list[Attempt]:
    sid = {"session_id": objs.session_id}
    own = ("session_id",)
    out = [
        Attempt("GET", SESSION_T, sid, own),
        Attempt("PATCH", SESSION_T, sid, own, body={"title": "B's title"}),
        Attempt("GET", SESSION_T + "/status", sid, own),
        Attempt("GET", SESSION_T + "/events", sid, own),
        *(
            Attempt(
                "POST",
                SESSION_T + "/turns",
                sid,
                own,
                body={"content": "B's message", "multitask_strategy": strategy},
            )
            for strategy in ("reject", "enqueue", "interrupt")
        ),
        Attempt("DELETE", SESSION_T, sid, own),
    ]
    for run_id in objs.run_ids:
        rid = {"run_id": run_id}
        out += [
            Attempt("GET", RUN_T, rid, ("run_id",)),
            Attempt("GET", RUN_T + "/stream", rid, ("run_id",)),
            Attempt("GET", RUN_T + "/stream", rid, ("run_id",), headers={"Last-Event-ID": "1"}),
            Attempt("GET", RUN_T + "/stream", rid, ("run_id",), query={"after": "0"}),
            Attempt("POST", RUN_T + "/cancel", rid, ("run_id",)),
            Attempt(
                "POST",
                RUN_T + "/cancel",
                rid,
                ("run_id",),
                query={"wait": "true", "timeout": "1", "reason": "B says stop"},
            ),
        ]
    return out


def _assert_indistinguishable_404(b: httpx.Client, attempt: Attempt) -> None:
    """B's attempt is a 404 that reads exactly like the same attempt on ids nobody created."""
    r = _send(b, attempt, attempt.url())
    where = f"{attempt.method} {attempt.url()}"
    assert r.status_code == 404, f"{where}: {r.status_code} {r.text}"
    assert r.headers["content-type"].startswith("application/json"), where
    assert not any(secret in r.text for secret in SECRETS), f"{where}: {r.text}"
    twin, real_of = attempt.twin()
    t = _send(b, twin, twin.url())
    assert t.status_code == 404, f"{twin.method} {twin.url()}: {t.status_code} {t.text}"
    text = t.text
    for fake, real in real_of.items():
        text = text.replace(fake, real)
    assert text == r.text, f"{where}: A's object answers {r.text}, a missing one {t.text}"


# -- the tests ---------------------------------------------------------------------------------


#: The routes answered 501 whatever the ids (heed.api.unserved): nothing of A's behind them.
NOT_IMPLEMENTED_ROUTES: frozenset[tuple[str, str]] = frozenset(
    (route.method, route.path) for route in NOT_IMPLEMENTED
)


def _openapi_operations(client: httpx.Client) -> set[tuple[str, str]]:
    doc = _ok(client.get("/openapi.json"))
    return {
        (method.upper(), path)
        for path, operations in doc["paths"].items()
        if "{" in path
        for method in operations
    } - NOT_IMPLEMENTED_ROUTES


ALLOWED_FOR_B: frozenset[tuple[str, str]] = frozenset(
    {("PUT", BANK_T), ("POST", BANK_T + "/import")}
)
"""Operations B may perform under A's ids: creating its own bank of the same id (per tenant),
by a PUT or a template import (which creates the bank it names when the tenant has none).
The test does the PUT and checks that the new bank is B's, empty, and that A's is unchanged."""


def test_every_route_with_a_path_parameter_is_attempted_by_b(b_client: httpx.Client) -> None:
    dummy = AObjects(["m"], ["d"], "run_o", "ses_s", "run_t", "run_r")
    attempted = {
        (a.method, a.template)
        for a in (
            *bank_attempts(dummy, bank_is_as=True),
            *bank_attempts(dummy, bank_is_as=False),
            *session_and_run_attempts(dummy),
        )
    }
    routes = _openapi_operations(b_client)
    assert routes, "no parameterised routes in /openapi.json"
    missing = routes - attempted - ALLOWED_FOR_B
    assert not missing, f"routes with no isolation check: {sorted(missing)}"
    assert routes >= ALLOWED_FOR_B
    assert attempted <= routes, f"attempts on undocumented routes: {attempted - routes}"


def test_tenant_b_gets_a_404_on_every_route_and_changes_nothing(
    a_client: httpx.Client, b_client: httpx.Client, a_objects: AObjects
) -> None:
    a, b, objs = a_client, b_client, a_objects
    before = _a_view(a, objs)
    executed: set[tuple[str, str]] = set()

    # B's lists do not show A's objects.
    assert BANK not in {x["bank_id"] for x in _ok(b.get("/v1/default/banks"))["banks"]}
    b_sessions = _ok(b.get("/v1/sessions"))["sessions"]
    assert objs.session_id not in {s["id"] for s in b_sessions}
    # B cannot bind a session to A's bank (it is not B's).
    bound = b.post("/v1/sessions", json={"bank_id": BANK})
    nowhere = b.post("/v1/sessions", json={"bank_id": _fake_like(BANK)})
    assert (bound.status_code, nowhere.status_code) == (404, 404), bound.text
    assert bound.text == nowhere.text.replace(_fake_like(BANK), BANK)
    # (B can create sessions of its own: the 404 was about the bank)
    assert b.post("/v1/sessions", json={"title": "B's chat"}).status_code == 201

    # Every route on every one of A's objects: a 404, worded as for an id nobody created.
    for attempt in (*bank_attempts(objs, bank_is_as=True), *session_and_run_attempts(objs)):
        _assert_indistinguishable_404(b, attempt)
        executed.add((attempt.method, attempt.template))

    # B creates its own bank under A's bank id: allowed, and it is B's, empty.
    made = _ok(b.put(f"/v1/default/banks/{BANK}", json={"name": "B's bank"}))
    executed.add(("PUT", BANK_T))
    assert made["name"] == "B's bank" and not made["mission"]
    b_bank = f"/v1/default/banks/{BANK}"
    listed = [x for x in _ok(b.get("/v1/default/banks"))["banks"] if x["bank_id"] == BANK]
    assert len(listed) == 1 and listed[0]["fact_count"] == 0
    stats = _ok(b.get(f"{b_bank}/stats"))
    assert (stats["total_nodes"], stats["total_documents"]) == (0, 0)
    assert stats["operations_by_status"] == {}
    for path in ("/memories/list", "/documents", "/operations"):
        assert _ok(b.get(b_bank + path))["total"] == 0, path
    recalled = _ok(b.post(f"{b_bank}/memories/recall", json={"query": "zebra named Quux"}))
    assert recalled["results"] == []
    reflected = b.post(
        f"{b_bank}/reflect", json={"query": "What does the zebra eat?", "include": {"facts": {}}}
    )
    body = _ok(reflected)
    assert body["based_on"]["memories"] == []
    assert not any(secret in reflected.text for secret in SECRETS)
    # A's memory, document and operation ids inside B's bank of the same id: 404s too.
    for attempt in bank_attempts(objs, bank_is_as=False):
        _assert_indistinguishable_404(b, attempt)
    # A's Idempotency-Keys are A's bank's: under the same key B's retains really happen.
    same_key = _ok(
        b.post(
            f"{b_bank}/memories",
            json={"items": [{"content": B_FACT, "document_id": DOCS[0]}]},
            headers={"Idempotency-Key": RETAIN_KEY},
        )
    )
    assert same_key["units_count"] >= 1 and same_key["document_ids"] == [DOCS[0]]
    doc = _ok(b.get(f"{b_bank}/documents/{quote(DOCS[0], safe='')}"))
    assert doc["original_text"] == B_FACT
    queued = _ok(
        b.post(
            f"{b_bank}/memories",
            json={"async": True, "items": [{"content": B_FACT}]},
            headers={"Idempotency-Key": ASYNC_KEY},
        )
    )
    assert queued["operation_id"] != objs.operation_id
    wait_for(lambda: _phase(b, queued["operation_id"]) in {"completed", "failed"}, 20)
    assert _phase(b, queued["operation_id"]) == "completed"
    # A template imported under A's bank id lands in B's own bank (created if missing).
    imported = _ok(
        b.post(f"{b_bank}/import", json={"version": "1", "bank": {"reflect_mission": "B's"}})
    )
    executed.add(("POST", BANK_T + "/import"))
    assert imported["config_applied"] is True
    assert _ok(b.get(f"{b_bank}/config"))["overrides"]["reflect_mission"] == "B's"
    # ...and B deleting its own bank deletes (and cancels) only B's.
    _ok(b.patch(b_bank, json={"mission": "B's mission"}))
    _ok(b.delete(b_bank))
    assert b.get(b_bank).status_code == 404

    # Coverage: every parameterised route of the OpenAPI document was tried by B.
    routes = _openapi_operations(b)
    assert not routes - executed, f"not attempted: {sorted(routes - executed)}"

    # A sees everything as it was; its reflect run was never touched.
    assert _a_view(a, objs) == before
    reflect_run = _ok(a.get(f"/v1/runs/{objs.reflect_run_id}"))
    assert reflect_run["phase"] == "running", "B's attempts (or the slow reply) ended it"
    assert reflect_run["cancel_reason"] is None
    # The routes B got 404s from work for their owner: A's cancel stops the run.
    cancelled = _ok(a.post(f"/v1/runs/{objs.reflect_run_id}/cancel", params={"wait": "true"}))
    assert cancelled["phase"] == "cancelled"
    assert cancelled["cancel_reason"] == "cancelled by client"
    journal = _journal(a, objs.reflect_run_id)
    assert [seq for seq, _ in journal] == list(range(1, len(journal) + 1))
    assert journal[-1][1] == "cancelled"
    with a.stream("GET", f"/v1/sessions/{objs.session_id}/events") as events:
        assert events.status_code == 200
        assert events.headers["content-type"].startswith("text/event-stream")
