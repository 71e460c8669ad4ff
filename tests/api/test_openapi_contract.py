"""The OpenAPI document says what the server does: schemathesis against a real server.

schemathesis generates requests from ``/openapi.json`` (valid ones and invalid
ones, plus its coverage cases: boundaries, missing fields, undeclared methods)
and sends them over a loopback socket to a real uvicorn server, then runs every
built-in check on each answer, the equivalent of ``schemathesis run --checks
all``. In schemathesis 4.32 that is:

- ``not_a_server_error``: no 5xx (heed's 502/503 are documented answers, not
  bugs, but nothing here can make them happen: the LLM is scripted, no queue fills);
- ``status_code_conformance``, ``content_type_conformance``,
  ``response_headers_conformance``, ``response_schema_conformance``: the status,
  media type, headers and body are the documented ones (an SSE answer is parsed
  into events and each is checked against the ``itemSchema``);
- ``positive_data_acceptance``: a request the schema allows is not refused with
  a 4xx other than 401, 403, 404 and 409; ``negative_data_rejection``: one it
  forbids is refused with a 4xx;
- ``missing_required_header``, ``unsupported_method`` (405 with ``Allow``),
  ``allow_header_conformance`` (``Allow`` lists exactly the documented methods);
- ``use_after_free`` and ``ensure_resource_availability`` (stateful: a deleted
  resource is gone, a created one is there);
- ``ignored_auth`` and ``object_level_authorization``: they act on declared
  security schemes; heed declares none (its keys are optional and checked in the
  middleware), and this server runs without keys, as a loopback client, like the
  embedded default. ``tests/api/test_security.py`` covers keys and tenants.

Only ``max_response_time`` is off, as in ``--checks all``: it needs a limit.

Every failure is a bug to fix in ``src`` or a wrong document to fix there too.
The allowances are written down with their reasons: 413 is a refusal of any
request (:data:`ACCEPTED`, :data:`REFUSED`), and :data:`SEMANTIC_400`.

Bounded for CI: a fixed number of examples per operation, derandomized (the same
cases on every run), no deadline. Streams cannot hang it: schemathesis reads an
``text/event-stream`` answer until it ends, ``max-stream-events`` events arrive
or ``request-timeout`` seconds pass, whichever comes first.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis.errors import FlakyStrategyDefinition
from schemathesis.schemas import BaseSchema

from heed.api.app import create_app
from heed.api.unserved import NOT_IMPLEMENTED
from heed.settings import Settings
from tests.support import LiveServer, live_server, wait_for

EXAMPLES = 25
"""Generated cases per operation (on top of schemathesis's coverage cases)."""

BANK, DOCUMENT = "contract-bank", "contract/doc-1"

SEMANTIC_400 = [
    # heed's LLM request traces are not linked to documents or memories: a document_id or
    # memory_id filter is refused by name rather than silently ignored (docs/observability.md).
    "GET /v1/default/banks/{bank_id}/llm-requests",
    # Whatever the key: the server has no keys configured (this test runs it without, like the
    # embedded default), so there is nothing to log into. A 400 naming that, not a schema matter.
    "POST /v1/auth/login",
    # Retain refuses what JSON Schema cannot say: content that is blank or over the item limit,
    # a timestamp string that is not a date, a fact_type outside world/experience/observation
    # (free text in Hindsight's schema), an empty item list (Hindsight's schema allows it).
    "POST /v1/default/banks/{bank_id}/memories",
    # Recall and reflect refuse a query without a word or over the token limit, a
    # query_timestamp that does not parse, unknown fact types and tag_groups (accepted by
    # Hindsight's schema, refused by heed rather than silently ignored); reflect refuses a
    # response_schema that is not a self-contained JSON Schema.
    "POST /v1/default/banks/{bank_id}/memories/recall",
    "POST /v1/default/banks/{bank_id}/reflect",
    # Bank transfer refuses what JSON Schema cannot say: an upload that is not a heed bank
    # archive (any bytes schemathesis makes), include_history true (heed keeps no such log),
    # and what a mode cannot do (a merge's include_bank_config or target_bank_id, a
    # restore's document_conflict, an unknown mode or conflict).
    "POST /v1/default/banks/{bank_id}/transfer/import",
    "POST /v1/default/banks/{bank_id}/document-transfer",
    "POST /v1/default/banks/{bank_id}/transfer/export",
    "POST /v1/default/banks/{bank_id}/clone",
    "POST /v1/default/banks/{bank_id}/document-transfer/export",
    # Mental models and knowledge pages refuse a blank name or question, a question over the
    # recall's token limit, a custom id outside lowercase letters, digits and hyphens, and
    # trigger settings heed does not implement (named); folders refuse a blank name and a
    # move under their own subtree; search refuses a blank query; tag_groups is refused.
    "POST /v1/default/banks/{bank_id}/mental-models",
    "PATCH /v1/default/banks/{bank_id}/mental-models/{mental_model_id}",
    "POST /v1/default/banks/{bank_id}/knowledge-base/folders",
    "POST /v1/default/banks/{bank_id}/knowledge-base/pages",
    "PATCH /v1/default/banks/{bank_id}/knowledge-base/nodes/{node_id}",
    "GET /v1/default/banks/{bank_id}/knowledge-base/search",
    "GET /v1/default/banks/{bank_id}/knowledge-base/tree",
    # File retain judges each file (its type, its bytes, its text) and the request field's
    # JSON; webhooks judge a URL (it must resolve to a public address), the event names, the
    # HTTP config, and the delivery log's cursor (one the server gave).
    "POST /v1/default/banks/{bank_id}/files/retain",
    "POST /v1/default/banks/{bank_id}/webhooks",
    "PATCH /v1/default/banks/{bank_id}/webhooks/{webhook_id}",
    "GET /v1/default/banks/{bank_id}/webhooks/{webhook_id}/deliveries",
    # The entity views refuse tag_groups (a JSON string in Hindsight's schema; heed filters by
    # tags and tags_match only, rather than ignoring it).
    "GET /v1/default/banks/{bank_id}/entities",
    "GET /v1/default/banks/{bank_id}/entities/graph",
    "GET /v1/default/banks/{bank_id}/entities/{entity_id}",
    # Dry-run extraction refuses blank content, an unknown retain_extraction_mode (free text
    # in Hindsight's schema), a field heed does not implement given a value, and a bank that
    # does not extract; the strategies preview checks its draft as the bank setting is checked.
    "POST /v1/default/banks/{bank_id}/memories/dry-run-extract",
    "POST /v1/default/banks/{bank_id}/consolidation-strategies/preview",
    # Directives refuse a blank name, content or tag, and a bank's 101st directive.
    "POST /v1/default/banks/{bank_id}/directives",
    "PATCH /v1/default/banks/{bank_id}/directives/{directive_id}",
    # Curation refuses an edit naming no field, blank text, a date that does not parse, an
    # observation (derived), an edit of an invalidated fact; a document's PATCH refuses no
    # tags and observation_scopes (not kept per document).
    "PATCH /v1/default/banks/{bank_id}/memories/{memory_id}",
    "PATCH /v1/default/banks/{bank_id}/documents/{document_id}",
    # An alias follows a bank id's rules (a pattern the document cannot state per name).
    "POST /v1/default/banks/{bank_id}/aliases",
    # A template's settings are judged by the bank settings' rules, its mental models' ids,
    # names, questions and triggers by theirs, and its version by the server's.
    "POST /v1/default/banks/{bank_id}/import",
]
"""Operations where a schema-valid request may get a 400: the server judges a value the
document can only type. The document says so (400: "a value only the server can judge"); the
check is told too, for these operations only; every other check still runs on them."""


def _seed(client: httpx.Client) -> dict[str, list[str]]:
    """Real resources for the generated requests to find (else nearly every id is a 404)."""
    assert client.put(f"/v1/default/banks/{BANK}", json={"name": "contract"}).status_code == 200
    retained = client.post(
        f"/v1/default/banks/{BANK}/memories",
        json={"items": [{"content": "Alice has two cats.", "document_id": DOCUMENT}]},
    )
    assert retained.status_code == 200, retained.text
    memories = client.get(f"/v1/default/banks/{BANK}/memories/list").json()["items"]
    operation = client.post(
        f"/v1/default/banks/{BANK}/memories",
        json={"items": [{"content": "Bob has a dog."}], "async": True},
    ).json()["operation_id"]
    session = client.post("/v1/sessions", json={"title": "contract", "bank_id": BANK}).json()
    turn = client.post(f"/v1/sessions/{session['id']}/turns", json={"content": "hello"})
    assert turn.status_code == 202, turn.text
    run_id = turn.json()["run_id"]
    wait_for(lambda: client.get(f"/v1/runs/{run_id}").json()["phase"] == "completed")
    directive = client.post(
        f"/v1/default/banks/{BANK}/directives", json={"name": "r", "content": "Be brief."}
    ).json()["id"]
    return {
        "directive_id": [directive],
        "bank_id": [BANK],
        "document_id": [DOCUMENT],
        "memory_id": [m["id"] for m in memories],
        "operation_id": [operation],
        "session_id": [session["id"]],
        "run_id": [run_id],
    }


# schemathesis's defaults, plus 413: a body over HEED_MAX_BODY_BYTES is refused before it is
# read, valid or not (JSON Schema cannot bound a body's size; the document has 413 everywhere).
ACCEPTED = ["2xx", "3xx", "401", "403", "404", "409", "413", "429", "5xx"]
REFUSED = [
    *["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429"],
    "5xx",
]


LIST_QUERY_OPERATIONS = [
    "GET /v1/default/banks/{bank_id}/memories/list",
    "GET /v1/default/banks/{bank_id}/directives",
    "GET /v1/default/banks/{bank_id}/mental-models",
    "GET /v1/default/banks/{bank_id}/knowledge-base/tree",
    "GET /v1/default/banks/{bank_id}/knowledge-base/search",
    "POST /v1/default/banks/{bank_id}/transfer/export",
    "POST /v1/default/banks/{bank_id}/document-transfer/export",
]
"""Operations with a repeated text query parameter (see the comment in :func:`_config`)."""


def _config(known: dict[str, list[str]], *, positive_only: bool = False) -> schemathesis.Config:
    return schemathesis.Config.from_dict(
        {
            "request-timeout": 10,
            # NUL is refused in any text by heed's rule at the edge (docs/security.md), which
            # JSON Schema does not state.
            "generation": {
                "allow-x00": False,
                **({"mode": "positive"} if positive_only else {}),
            },
            # Half the time an id parameter is one that exists, else whatever is generated.
            "dictionaries": {name: {"values": values} for name, values in known.items()},
            "parameters": {
                f"path.{name}": {"dictionary": name, "probability": 0.5} for name in known
            },
            "checks": {
                "positive_data_acceptance": {"expected-statuses": ACCEPTED},
                "negative_data_rejection": {"expected-statuses": REFUSED},
            },
            "operations": [
                {
                    # hindsight-client's wire: DELETE on an operation cancels it, and the
                    # operation stays readable with its final status (it is not deleted), so
                    # reading it after that DELETE is no use after free.
                    "include-name": "GET /v1/default/banks/{bank_id}/operations/{operation_id}",
                    "checks": {"use_after_free": {"enabled": False}},
                },
                {
                    # A repeated text query parameter (``?tags=a&tags=b``) takes any text,
                    # so a generated "invalid" value such as ``tags=true`` (a boolean, to the
                    # generator) is a valid tag once it is a query string: not a rejection
                    # heed could make. Every other check still runs on these operations.
                    "include-name": LIST_QUERY_OPERATIONS,
                    "checks": {"negative_data_rejection": {"enabled": False}},
                },
                {
                    # Client routes heed answers 501 naming the route and why (the documented
                    # answer, heed.api.unserved.NOT_IMPLEMENTED): a 5xx by design.
                    "include-name": [f"{r.method} {r.path}" for r in NOT_IMPLEMENTED],
                    "checks": {"not_a_server_error": {"enabled": False}},
                },
                {
                    "include-name": SEMANTIC_400,
                    "checks": {
                        "positive_data_acceptance": {"expected-statuses": [*ACCEPTED, "400"]}
                    },
                },
                {
                    # The session channel never ends while the session exists (heartbeat
                    # comments, events only when something happens): read it for a second.
                    "include-name": "GET /v1/sessions/{session_id}/events",
                    "request-timeout": 1,
                    "max-stream-events": 1,
                },
            ],
        }
    )


@contextmanager
def _server(data_dir: Path) -> Iterator[LiveServer]:
    settings_ = Settings(
        data_dir=data_dir,
        llm_provider="scripted",
        llm_script=json.dumps({"token_delay": 0, "replies": []}),  # echo, at once
        stream_heartbeat_seconds=0.5,
    )
    with live_server(create_app(settings_)) as server:
        yield server


def _schema_of(server: LiveServer, *, positive_only: bool = False) -> BaseSchema:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        known = _seed(client)
    return schemathesis.openapi.from_url(
        f"{server.url}/openapi.json", config=_config(known, positive_only=positive_only)
    )


@pytest.fixture(scope="module")
def contract_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with _server(tmp_path_factory.mktemp("contract") / "data") as server:
        yield server


@pytest.fixture(scope="module")
def api_schema(contract_server: LiveServer) -> BaseSchema:
    return _schema_of(contract_server)


@contextmanager
def _fresh_schema(data_dir: Path) -> Iterator[BaseSchema]:
    """A schema over a server of its own, generating valid requests only (invalid input is
    covered call by call by the tests above)."""
    with _server(data_dir) as server:
        yield _schema_of(server, positive_only=True)


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.fixture(autouse=True)
def _node_id_for_schemathesis(request: pytest.FixtureRequest) -> None:
    # schemathesis 4.32's lazy loader reads (and rewrites, to name each operation's subtest)
    # `item._nodeid`, which pytest 9.2 no longer has: give it one to read.
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid


BOUNDED = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
    database=None,
)


@schema.exclude(method="DELETE").parametrize()
@BOUNDED
def test_operations_match_the_document(case: schemathesis.Case) -> None:
    case.call_and_validate()


# After every other operation: deleting the seeded bank, session or run would turn what
# follows into 404s. pytest runs the tests of a module in the order they are written.
@schema.include(method="DELETE").parametrize()
@BOUNDED
def test_deletions_match_the_document(case: schemathesis.Case) -> None:
    case.call_and_validate()


# -- while learning runs: a consolidation and a mental-model refresh held by the model ----------

BUSY_EXAMPLES = 5
"""Generated cases per operation on the busy server (valid ones: the calls above cover the
invalid); enough to reach every route while the background work holds its slots."""

HELD = 600.0
"""Seconds the model holds a consolidation's and a refresh's answer: past the whole test."""

BUSY_QUESTION = "What does Zed grow in the greenhouse?"


@pytest.fixture(scope="module")
def busy_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server whose consolidation and mental-model refresh are in flight, their model
    calls held (every other call answers at once, an echo)."""
    script = {
        "token_delay": 0,
        "replies": [
            {"when": "new facts:", "latency": HELD, "json": {"actions": []}},
            {"when": BUSY_QUESTION.lower(), "latency": HELD, "text": "Tomatoes."},
        ],
    }
    settings_ = Settings(
        data_dir=tmp_path_factory.mktemp("busy") / "data",
        llm_provider="scripted",
        llm_script=json.dumps(script),
        observations="on",
        retain_extraction="off",
        consolidation_debounce_seconds=0.05,
        stream_heartbeat_seconds=0.5,
    )
    with live_server(create_app(settings_)) as server:
        yield server


def _learning_runs(client: httpx.Client) -> set[str]:
    """The kinds of the seeded bank's operations still processing."""
    ops = client.get(f"/v1/default/banks/{BANK}/operations").json()["operations"]
    return {o["operation_type"] for o in ops if o["status"] == "processing"}


@pytest.fixture(scope="module")
def busy_schema(busy_server: LiveServer) -> BaseSchema:
    with httpx.Client(base_url=busy_server.url, timeout=30) as client:
        known = _seed(client)
        created = client.post(
            f"/v1/default/banks/{BANK}/mental-models",
            json={"name": "Zed", "source_query": BUSY_QUESTION},
        )
        assert created.status_code == 200, created.text
        running = wait_for(
            lambda: (
                _learning_runs(client) >= {"consolidation", "mental_model_refresh"}
                and _learning_runs(client)
            ),
            seconds=30,
        )
        assert running
    return schemathesis.openapi.from_url(
        f"{busy_server.url}/openapi.json", config=_config(known, positive_only=True)
    )


busy = schemathesis.pytest.from_fixture("busy_schema")


@busy.exclude(method="DELETE").parametrize()
@settings(
    max_examples=BUSY_EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
    database=None,
)
def test_operations_keep_the_document_while_learning_runs(case: schemathesis.Case) -> None:
    case.call_and_validate()


def test_the_learning_was_in_flight_throughout(busy_server: LiveServer) -> None:
    """The busy server's consolidation and refresh were still holding their calls at the
    end (so every call above ran beside them)."""
    with httpx.Client(base_url=busy_server.url, timeout=30) as client:
        assert _learning_runs(client) >= {"consolidation", "mental_model_refresh"}


FLAKY_EXIT = 3


def run_stateful_machine(data_dir: Path) -> int:
    """Run the stateful machine on a fresh server; 0, or :data:`FLAKY_EXIT` when
    hypothesis stopped it as flaky generation. A contract failure raises."""
    with _fresh_schema(data_dir) as full_schema:
        # The 501 routes (deprecated, heed.api.unserved) link nothing and hold no state.
        # An operation's retry and delete answer by when the operation ended (409 while it
        # runs, 200 after), which hypothesis' replays take for flaky generation; the
        # single-call tests above check them.
        schema_ = full_schema.exclude(deprecated=True).exclude(
            path_regex=r"/operations/\{operation_id\}/(retry|delete)$"
        )
        try:
            schema_.as_state_machine().run(
                settings=settings(
                    max_examples=EXAMPLES,
                    stateful_step_count=6,
                    deadline=None,
                    derandomize=True,
                    suppress_health_check=list(HealthCheck),
                    database=None,
                )
            )
        except FlakyStrategyDefinition:
            return FLAKY_EXIT
    return 0


def test_sequences_of_calls_keep_their_promises(tmp_path: Path) -> None:
    """Stateful: chains of calls linked by the ids one answer gives the next request
    (create a session, then read, rename, delete it...), checked like every single call,
    plus use-after-free (gone after DELETE) and availability (there after create).

    The machine draws its next step from what the server answered, so it runs in an
    interpreter of its own, on a server of its own: in a process where other hypothesis
    runs came first, hypothesis refused its replays as flaky generation
    (FlakyStrategyDefinition), which says nothing about heed. Should it still do so
    three times, the test is skipped, saying so; a contract failure fails it."""
    code = (
        "import sys; from pathlib import Path; "
        "from tests.api.test_openapi_contract import run_stateful_machine; "
        "sys.exit(run_stateful_machine(Path(sys.argv[1])))"
    )
    for attempt in range(3):
        done = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / f"data-{attempt}")],
            cwd=Path(__file__).resolve().parents[2],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode == 0:
            return
        assert done.returncode == FLAKY_EXIT, done.stdout[-4000:] + done.stderr[-8000:]
    pytest.skip("hypothesis stopped all three runs as flaky generation (not a contract failure)")


def test_the_document_names_every_error_heed_answers(contract_server: LiveServer) -> None:
    """The app-wide errors are on every operation, 404 wherever a path names a resource,
    and the SSE routes document ``text/event-stream``."""
    document: dict[str, Any] = httpx.get(f"{contract_server.url}/openapi.json").json()
    schemas = document["components"]["schemas"]
    assert schemas["ErrorDetail"]["required"] == ["detail"]
    assert schemas["HTTPValidationError"]["required"] == ["detail"]
    for path, item in document["paths"].items():
        for method, operation in item.items():
            codes = set(operation["responses"])
            assert {"400", "401", "403", "413", "503"} <= codes, (method, path, codes)
            assert "499" not in codes and "500" not in codes
            if "{" in path:
                assert "404" in codes, (method, path)
            if "422" in codes:
                ref = operation["responses"]["422"]["content"]["application/json"]["schema"]
                assert ref == {"$ref": "#/components/schemas/HTTPValidationError"}
    streams = {
        ("get", "/v1/runs/{run_id}/stream"),
        ("get", "/v1/sessions/{session_id}/events"),
        ("post", "/v1/default/banks/{bank_id}/reflect"),
    }
    for method, path in streams:
        content = document["paths"][path][method]["responses"]["200"]["content"]
        assert "itemSchema" in content["text/event-stream"], (method, path)
    assert set(
        document["paths"]["/v1/default/banks/{bank_id}/reflect"]["post"]["responses"]["200"][
            "content"
        ]
    ) == {"application/json", "text/event-stream"}


def test_a_turn_without_content_is_a_422_like_any_missing_field(
    contract_server: LiveServer,
) -> None:
    with httpx.Client(base_url=contract_server.url) as client:
        session = client.post("/v1/sessions", json={}).json()["id"]
        r = client.post(f"/v1/sessions/{session}/turns", json={})
        missing_field = client.post("/v1/sessions", json={"title": 5})
    assert r.status_code == 422, r.text
    [error] = r.json()["detail"]
    assert error["loc"] == ["body", "content"] and error["type"] == "missing"
    assert set(error) >= {"loc", "msg", "type"}
    assert missing_field.status_code == 422
    assert set(missing_field.json()["detail"][0]) >= {"loc", "msg", "type"}


def test_json_types_are_taken_as_the_document_types_them(contract_server: LiveServer) -> None:
    """schemathesis found `"enable_reranking": 0` accepted as false (the schema says boolean)."""
    url = f"{contract_server.url}/v1/default/banks/typed"
    for body in ({"enable_reranking": 0}, {"disposition_empathy": "2"}, {"name": 5}):
        r = httpx.put(url, json=body)
        assert r.status_code == 422, (body, r.text)
    # JSON Schema's integer: 2.0 is one.
    r = httpx.put(url, json={"disposition_empathy": 2.0, "enable_reranking": False})
    assert r.status_code == 200, r.text
    assert r.json()["disposition"]["empathy"] == 2


@pytest.mark.parametrize(
    ("path", "allow"),
    [
        ("/v1/sessions", "GET, POST"),
        ("/v1/sessions/s1", "DELETE, GET, PATCH"),
        (f"/v1/default/banks/{BANK}", "DELETE, GET, PATCH, PUT"),
        (f"/v1/default/banks/{BANK}/documents/a/b", "DELETE, GET, PATCH"),
        (f"/v1/default/banks/{BANK}/memories/recall", "POST"),
        ("/health", "GET"),
    ],
)
def test_405_allows_every_method_of_the_resource(
    contract_server: LiveServer, path: str, allow: str
) -> None:
    r = httpx.request("OPTIONS", f"{contract_server.url}{path}")
    assert r.status_code == 405
    assert r.headers["allow"] == allow
    assert r.json() == {"detail": "Method Not Allowed"}


def test_the_session_channel_is_an_event_stream(contract_server: LiveServer) -> None:
    """The one stream the schemathesis tests only sip: open it, see one documented frame."""
    with httpx.Client(base_url=contract_server.url, timeout=10) as client:
        session = client.post("/v1/sessions", json={}).json()["id"]
        started = time.monotonic()
        with client.stream("GET", f"/v1/sessions/{session}/events") as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            first = next(response.iter_lines())
    assert first.startswith(("retry:", ":", "event:"))
    assert time.monotonic() - started < 5
