"""Token accounting, LLM request traces and audit logs on real servers (issues 41 part 2, 40).

SQLite and PostgreSQL. Reflect runs on the ``openai`` provider against the fake upstream
(which reports usage, or not), retain's extraction on the scripted provider. Checked:

- a bank's stats add up its tokens by kind of work, equal to what the upstream reported;
- ``/metrics`` counts them by operation (the kind of work) and kind (prompt, completion);
- a run's result (an async retain's operation) carries its ``llm_usage``;
- a provider that reports no usage is counted by heed's tokenizer;
- the unmodified client's ``LLMTracesApi`` lists, filters, groups and counts the traces,
  whose text is redacted by default; ``AuditApi`` lists, reads and counts who did what;
- filters heed cannot honour are 400s naming them, malformed ones 422s naming them, an
  unknown bank or entry a 404.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from hindsight_client_api.api.audit_api import AuditApi
from hindsight_client_api.api.llm_traces_api import LLMTracesApi
from hindsight_client_api.api_client import ApiClient
from hindsight_client_api.configuration import Configuration
from hindsight_client_api.exceptions import BadRequestException, NotFoundException

from heed.api.app import create_app
from heed.api.auth import principal_of
from heed.settings import Settings
from tests.llm.fake_upstream import Behaviour, RunningUpstream, serve_fake_upstream, text_chunks
from tests.llm.fake_upstream import usage_chunk as usage
from tests.pg_support import fresh_schema
from tests.support import LiveServer, live_server, metric_value, wait_for

T = TypeVar("T")

SECRET_QUESTION = "What does Caroline keep in the blue box?"
FACTS = {
    "facts": [
        {
            "text": "Caroline adopted a puppy named Rex.",
            "fact_type": "experience",
            "sources": [0],
        }
    ]
}


@pytest.fixture(scope="module")
def upstream() -> Iterator[RunningUpstream]:
    with serve_fake_upstream() as running:
        yield running


def _settings(data_dir: Path, upstream: RunningUpstream, url: str | None) -> Settings:
    return Settings(
        data_dir=data_dir,
        database_url=url,
        llm_provider="openai",
        llm_model="fake-model",
        llm_base_url=upstream.base_url,
        llm_api_key="sk-test-secret",  # type: ignore[arg-type]
        llm_retries=0,
        retain_llm_provider="scripted",
        retain_llm_script=json.dumps({"replies": [{"json": FACTS}]}),
        retain_extraction="concise",
        observations="off",
    )


@pytest.fixture(params=["sqlite", "postgresql"], scope="module")
def server(
    request: pytest.FixtureRequest,
    upstream: RunningUpstream,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[LiveServer]:
    data_dir = tmp_path_factory.mktemp("llm-usage")
    if request.param == "sqlite":
        with live_server(create_app(_settings(data_dir, upstream, None))) as srv:
            yield srv
        return
    with fresh_schema() as url, live_server(create_app(_settings(data_dir, upstream, url))) as srv:
        yield srv


def _client(server: LiveServer, call: Callable[[ApiClient], Awaitable[T]]) -> T:
    async def run() -> T:
        async with ApiClient(Configuration(host=server.url)) as api_client:
            return await call(api_client)

    return asyncio.run(run())


def _bank(server: LiveServer) -> str:
    bank = "usage-" + uuid.uuid4().hex[:8]
    httpx.put(f"{server.url}/v1/default/banks/{bank}", json={}, timeout=30).raise_for_status()
    return bank


def _reflect(server: LiveServer, bank: str) -> dict[str, Any]:
    response = httpx.post(
        f"{server.url}/v1/default/banks/{bank}/reflect",
        json={"query": SECRET_QUESTION, "budget": "low"},
        timeout=60,
    )
    response.raise_for_status()
    return dict(response.json())


def _stats(server: LiveServer, bank: str) -> dict[str, Any]:
    response = httpx.get(f"{server.url}/v1/default/banks/{bank}/stats", timeout=30)
    response.raise_for_status()
    return dict(response.json())


def test_tokens_by_kind_in_stats_metrics_and_traces(
    server: LiveServer, upstream: RunningUpstream
) -> None:
    upstream.app.reset()
    upstream.app.default = Behaviour(
        chunks=[*text_chunks(["Rex", " is", " a", " puppy."]), usage(120, 7)]
    )
    bank = _bank(server)
    before = httpx.get(f"{server.url}/metrics", timeout=10).text
    httpx.post(
        f"{server.url}/v1/default/banks/{bank}/memories",
        json={"items": [{"content": "Caroline: I adopted a puppy named Rex."}]},
        timeout=60,
    ).raise_for_status()
    _reflect(server, bank)
    calls = len(upstream.app.records)
    assert calls >= 1

    usage_of = _stats(server, bank)["llm_usage"]
    reflect = usage_of["by_kind"]["reflect"]
    assert reflect == {
        "calls": calls,
        "prompt_tokens": 120 * calls,
        "completion_tokens": 7 * calls,
        "total_tokens": 127 * calls,
    }
    extraction = usage_of["by_kind"]["extraction"]
    assert extraction["calls"] == 1 and extraction["prompt_tokens"] > 0
    assert usage_of["last_hour"]["calls"] == calls + 1 == usage_of["total"]["calls"]

    after = httpx.get(f"{server.url}/metrics", timeout=10).text

    def grew(operation: str, kind: str) -> float:
        name = "heed_llm_tokens_total"
        return metric_value(after, name, operation=operation, kind=kind) - metric_value(
            before, name, operation=operation, kind=kind
        )

    assert grew("reflect", "prompt") == 120 * calls
    assert grew("reflect", "completion") == 7 * calls
    assert grew("extraction", "prompt") == extraction["prompt_tokens"]

    listed = _client(server, lambda c: LLMTracesApi(c).list_llm_requests(bank, limit=500))
    assert listed.total == calls + 1 and listed.bank_id == bank
    reflects = [i for i in listed.items if i.operation == "reflect"]
    assert len(reflects) == calls
    first = reflects[0]
    assert (first.provider, first.model, first.status) == ("openai", "fake-model", "success")
    assert (first.input_tokens, first.output_tokens, first.total_tokens) == (120, 7, 127)
    assert first.duration_ms is not None and first.duration_ms >= 0
    text = json.dumps([i.to_dict() for i in listed.items])
    assert "Caroline" not in text and "blue box" not in text  # text is kept only when on
    assert "sk-test-secret" not in text
    assert first.input and all("chars" in m and "role" in m for m in first.input)
    retain = [i for i in listed.items if i.operation == "retain"]
    assert len(retain) == 1 and retain[0].scope == "extraction"
    assert retain[0].provider == "scripted"

    only = _client(server, lambda c: LLMTracesApi(c).list_llm_requests(bank, operation="retain"))
    assert [i.id for i in only.items] == [retain[0].id]
    none = _client(server, lambda c: LLMTracesApi(c).list_llm_requests(bank, call_type="embedding"))
    assert none.total == 0 and none.items == []
    later = _client(
        server,
        lambda c: LLMTracesApi(c).list_llm_requests(bank, start_date="2999-01-01T00:00:00Z"),
    )
    earlier = _client(
        server, lambda c: LLMTracesApi(c).list_llm_requests(bank, end_date="2999-01-01")
    )
    assert (later.total, earlier.total) == (0, calls + 1)
    paged = _client(server, lambda c: LLMTracesApi(c).list_llm_requests(bank, limit=1, offset=1))
    assert paged.total == calls + 1 and len(paged.items) == 1
    assert paged.items[0].id == listed.items[1].id

    stats = _client(server, lambda c: LLMTracesApi(c).llm_request_stats(bank, period="1d"))
    assert (stats.period, stats.trunc, stats.bank_id) == ("1d", "hour", bank)
    assert sum(b.total for b in stats.buckets) == calls + 1
    assert sum(b.statuses.get("success", 0) for b in stats.buckets) == calls + 1
    assert sum(b.tokens.input for b in stats.buckets) == 120 * calls + extraction["prompt_tokens"]


def test_a_runs_result_carries_its_tokens(server: LiveServer) -> None:
    bank = _bank(server)
    response = httpx.post(
        f"{server.url}/v1/default/banks/{bank}/memories",
        json={"items": [{"content": "Caroline: I adopted a puppy named Rex."}], "async": True},
        timeout=60,
    )
    response.raise_for_status()
    operation_id = response.json()["operation_id"]
    url = f"{server.url}/v1/default/banks/{bank}/operations/{operation_id}"

    def done() -> dict[str, Any] | None:
        body = httpx.get(url, timeout=10).json()
        return body if body.get("status") == "completed" else None

    body = wait_for(done, 60)
    run_usage = body["result_metadata"]["llm_usage"]
    assert run_usage["calls"] == 1
    assert run_usage["by_kind"]["extraction"]["prompt_tokens"] == run_usage["prompt_tokens"] > 0
    traces = httpx.get(f"{server.url}/v1/default/banks/{bank}/llm-requests", timeout=10).json()
    assert [t["trace_id"] for t in traces["items"]] == [operation_id]
    grouped = httpx.get(
        f"{server.url}/v1/default/banks/{bank}/llm-requests", params={"group": "true"}, timeout=10
    ).json()
    assert grouped["total"] == 1 and len(grouped["items"]) == 1


def test_a_provider_without_usage_is_counted_by_the_tokenizer(
    server: LiveServer, upstream: RunningUpstream
) -> None:
    upstream.app.reset()
    upstream.app.default = Behaviour(chunks=text_chunks(["Rex", " is", " a", " puppy."]))
    bank = _bank(server)
    _reflect(server, bank)
    traces = httpx.get(f"{server.url}/v1/default/banks/{bank}/llm-requests", timeout=10).json()
    assert traces["items"], traces
    for trace in traces["items"]:
        assert trace["metadata"]["usage_reported"] is False
        assert trace["input_tokens"] > 10  # the system prompt and the question, counted
        assert trace["output_tokens"] >= 3
    reflect = _stats(server, bank)["llm_usage"]["by_kind"]["reflect"]
    assert reflect["prompt_tokens"] == sum(t["input_tokens"] for t in traces["items"])


def test_audit_logs_say_who_did_what(server: LiveServer, upstream: RunningUpstream) -> None:
    upstream.app.reset()
    bank = _bank(server)
    httpx.post(
        f"{server.url}/v1/default/banks/{bank}/memories",
        json={"items": [{"content": "Caroline: I adopted a puppy named Rex."}]},
        timeout=60,
    ).raise_for_status()
    httpx.get(f"{server.url}/v1/default/banks/{bank}/stats", timeout=10).raise_for_status()
    missing = httpx.delete(f"{server.url}/v1/default/banks/{bank}/documents/nope", timeout=10)
    assert missing.status_code == 404

    listed = _client(server, lambda c: AuditApi(c).list_audit_logs(bank))
    actions = [e.action for e in listed.items]  # newest first; reads are not audited
    assert actions == ["delete_document", "retain", "create_or_update_bank"], actions
    assert {e.transport for e in listed.items} == {"http"}
    entry = _client(server, lambda c: AuditApi(c).get_audit_log(bank, listed.items[0].id))
    assert entry.request == {
        "method": "DELETE",
        "route": "/v1/default/banks/{bank_id}/documents/{document_id:document_path}",
    }
    assert entry.response == {"status": 404}
    assert entry.metadata["tenant"] == "default"
    only = _client(server, lambda c: AuditApi(c).list_audit_logs(bank, action="retain"))
    assert [e.action for e in only.items] == ["retain"] and only.total == 1

    stats = _client(server, lambda c: AuditApi(c).audit_log_stats(bank, period="7d"))
    assert (stats.trunc, stats.period) == ("day", "7d")
    counted: dict[str, int] = {}
    for bucket in stats.buckets:
        for action, n in bucket.actions.items():
            counted[action] = counted.get(action, 0) + n
    assert counted == {"create_or_update_bank": 1, "retain": 1, "delete_document": 1}

    with pytest.raises(NotFoundException):
        _client(server, lambda c: AuditApi(c).get_audit_log(bank, "no-such-entry"))


def test_an_async_runs_end_is_audited(server: LiveServer) -> None:
    bank = _bank(server)
    response = httpx.post(
        f"{server.url}/v1/default/banks/{bank}/memories",
        json={"items": [{"content": "Bob skis in the Alps."}], "async": True},
        timeout=60,
    )
    operation_id = response.json()["operation_id"]

    def ended() -> list[dict[str, Any]]:
        body = httpx.get(
            f"{server.url}/v1/default/banks/{bank}/audit-logs",
            params={"transport": "system"},
            timeout=10,
        ).json()
        return list(body["items"])

    entries = wait_for(ended, 30)
    assert entries[0]["action"] == "run.retain"
    assert entries[0]["metadata"]["run_id"] == operation_id


def test_bad_filters_and_unknown_banks(server: LiveServer) -> None:
    bank = _bank(server)
    base = f"{server.url}/v1/default/banks/{bank}"
    for path, params, named, status in [
        ("llm-requests", {"document_id": "d1"}, "document_id", 400),
        ("llm-requests", {"memory_id": "m1"}, "memory_id", 400),
        ("llm-requests", {"call_type": "telepathy"}, "call_type", 422),
        ("llm-requests", {"start_date": "yesterday"}, "start_date", 422),
        ("llm-requests/stats", {"period": "2w"}, "period", 422),
        ("audit-logs", {"end_date": "soon"}, "end_date", 422),
        ("audit-logs/stats", {"period": "1y"}, "period", 422),
    ]:
        response = httpx.get(f"{base}/{path}", params=params, timeout=10)
        assert response.status_code == status, (path, response.text)
        assert named in response.text
    with pytest.raises(BadRequestException):
        _client(server, lambda c: LLMTracesApi(c).list_llm_requests(bank, document_id="d"))
    for path in ("llm-requests", "llm-requests/stats", "audit-logs", "audit-logs/stats"):
        gone = httpx.get(f"{server.url}/v1/default/banks/no-such-bank/{path}", timeout=10)
        assert gone.status_code == 404, path


def test_with_keys_an_entry_names_the_tenant_and_the_keys_id_never_the_key(
    tmp_path: Path,
) -> None:
    key, other = "acme-secret-key-0001", "globex-secret-key-0002"
    settings = Settings(
        data_dir=tmp_path,
        api_keys={key: "acme", other: "globex"},
        retain_extraction="off",
        observations="off",
    )
    with live_server(create_app(settings)) as srv:
        acme = {"Authorization": f"Bearer {key}"}
        globex = {"Authorization": f"Bearer {other}"}
        base = f"{srv.url}/v1/default/banks/shared"
        httpx.put(base, json={}, headers=acme, timeout=30).raise_for_status()
        httpx.put(base, json={}, headers=globex, timeout=30).raise_for_status()
        refused = httpx.put(f"{srv.url}/v1/default/banks/x", json={}, timeout=30)
        assert refused.status_code == 401
        body = httpx.get(f"{base}/audit-logs", headers=acme, timeout=10).json()
        assert body["total"] == 1  # globex's PUT is globex's
        entry = body["items"][0]
        assert entry["metadata"] == {"principal": principal_of(key), "tenant": "acme"}
        assert key not in json.dumps(body)
        full = httpx.get(f"{base}/audit-logs/{entry['id']}", headers=acme, timeout=10)
        assert full.status_code == 200 and full.json()["response"] == {"status": 200}
        theirs = httpx.get(f"{base}/audit-logs/{entry['id']}", headers=globex, timeout=10)
        assert theirs.status_code == 404  # another tenant's bank of the same id


def test_turns_and_refreshes_count_as_their_own_kinds(
    server: LiveServer, upstream: RunningUpstream
) -> None:
    upstream.app.reset()
    upstream.app.default = Behaviour(chunks=[*text_chunks(["Rex."]), usage(50, 3)])
    bank = _bank(server)
    session = httpx.post(
        f"{server.url}/v1/sessions", json={"title": "t", "bank_id": bank}, timeout=10
    ).json()
    turn = httpx.post(
        f"{server.url}/v1/sessions/{session['id']}/turns", json={"content": "hi"}, timeout=10
    ).json()

    def run_done(run_id: str) -> dict[str, Any] | None:
        run = httpx.get(f"{server.url}/v1/runs/{run_id}", timeout=10).json()
        return run if run["phase"] in ("completed", "failed", "cancelled") else None

    run = wait_for(lambda: run_done(turn["run_id"]), 60)
    assert run["phase"] == "completed", run
    assert (
        run["result"]["llm_usage"]["by_kind"]["turn"]["prompt_tokens"]
        == 50 * (run["result"]["llm_usage"]["calls"])
    )
    created = httpx.post(
        f"{server.url}/v1/default/banks/{bank}/mental-models",
        json={"name": "pets", "source_query": "What pets are there?"},
        timeout=30,
    ).json()
    refreshed = wait_for(lambda: run_done(created["operation_id"]), 60)
    assert refreshed["phase"] == "completed", refreshed
    by_kind = _stats(server, bank)["llm_usage"]["by_kind"]
    assert set(by_kind) == {"turn", "mental_model_refresh"}, by_kind  # a refresh is no reflect
    assert by_kind["turn"]["calls"] == run["result"]["llm_usage"]["calls"]
    assert by_kind["mental_model_refresh"]["completion_tokens"] == (
        3 * by_kind["mental_model_refresh"]["calls"]
    )


def test_a_deleted_banks_usage_and_traces_go_with_it(
    server: LiveServer, upstream: RunningUpstream
) -> None:
    upstream.app.reset()
    bank = _bank(server)
    _reflect(server, bank)
    assert _stats(server, bank)["llm_usage"]["total"]["calls"] >= 1
    httpx.delete(f"{server.url}/v1/default/banks/{bank}", timeout=30).raise_for_status()
    httpx.put(f"{server.url}/v1/default/banks/{bank}", json={}, timeout=30).raise_for_status()
    assert _stats(server, bank)["llm_usage"]["by_kind"] == {}
    traces = httpx.get(f"{server.url}/v1/default/banks/{bank}/llm-requests", timeout=10).json()
    assert traces["total"] == 0
    audit = httpx.get(f"{server.url}/v1/default/banks/{bank}/audit-logs", timeout=10).json()
    assert [e["action"] for e in audit["items"]][:2] == ["create_or_update_bank", "delete_bank"]
