"""Learning at a remote provider's pace, on SQLite and PostgreSQL: heed as an operator runs
it (``HEED_LLM_PROVIDER=openai``) against the fake OpenAI-compatible upstream on loopback,
which holds every answer a moment, as a remote model does.

- a retain's chunks are extracted side by side, the facts in chunk order;
- an asynchronous retain writes each document as soon as it is ready, and consolidation
  takes whole rounds of it while the model still reads the rest;
- consolidation rounds run side by side (within one scope), and no round overwrites what
  another wrote: every fact ends cited by an observation;
- a bank's daily budget of background tokens holds its consolidation, which says why it
  waits and resumes once the budget allows, nothing lost or failed.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.llm.fake_upstream import (
    Behaviour,
    Record,
    RunningUpstream,
    most_at_once,
    serve_fake_upstream,
)
from tests.memory.test_bank_learning_settings import _streamed, _user_text
from tests.pg_support import DATABASES, heed_server
from tests.support import LiveServer, metric_value, wait_for

#: How long the upstream holds each answer.
LATENCY = 1.0
#: A unit saying "pace N" is read N times slower (documents of an import ready one by one).
_PACE = re.compile(r"pace (\d+)")
#: Facts one consolidation round takes (HEED_CONSOLIDATION_BATCH): several rounds per retain.
BATCH = 3

_UNIT = re.compile(r"^\[(\d+)\] \([^)]*\) (.*)$", re.M)
_FACT = re.compile(r"^F(\d+)(?: \([^)]*\))?: (.*)$", re.M)
_OBSERVATION = re.compile(r"^O(\d+): ", re.M)


def respond(body: dict[str, Any]) -> Behaviour | None:
    """Extraction: one fact per unit. Consolidation: update the first related observation
    with every new fact (so rounds side by side want the same one), else create one."""
    user = _user_text(body)
    if user.startswith("[0] ("):
        facts = [
            {"text": f"Stated: {text}", "fact_type": "world", "sources": [int(n)]}
            for n, text in _UNIT.findall(user)
        ]
        reply = _streamed({"facts": facts})
    elif user.startswith("New facts:"):
        cited = [int(n) for n, _ in _FACT.findall(user)]
        if _OBSERVATION.search(user):
            action = {
                "action": "update",
                "observations": [0],
                "text": "Speakers share news.",
                "facts": cited,
            }
        else:
            action = {"action": "create", "text": "Speakers share news.", "facts": cited}
        reply = _streamed({"actions": [action]})
    else:
        return None
    pace = _PACE.search(user)
    reply.header_delay = LATENCY * (int(pace.group(1)) if pace else 1)
    return reply


@pytest.fixture(scope="module")
def upstream() -> Iterator[RunningUpstream]:
    with serve_fake_upstream() as running:
        running.app.responder = respond
        yield running


@pytest.fixture(params=DATABASES, scope="module")
def server(
    request: pytest.FixtureRequest,
    upstream: RunningUpstream,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[LiveServer]:
    with pytest.MonkeyPatch.context() as env:
        for name in ("HEED_RETAIN_EXTRACTION", "HEED_OBSERVATIONS", "HEED_DATABASE_URL"):
            env.delenv(name, raising=False)
        with heed_server(
            request.param,
            tmp_path_factory.mktemp("learning-concurrency"),
            llm_provider="openai",
            llm_base_url=upstream.base_url,
            llm_model="fake-chat-model",
            llm_api_key="sk-test",
            llm_concurrency=6,
            consolidation_batch=BATCH,
            consolidation_debounce_seconds=0.05,
        ) as srv:
            yield srv


def records_of(upstream: RunningUpstream, marker: str, start: str) -> list[Record]:
    return [
        r
        for r in list(upstream.app.records)
        if _user_text(r.body).startswith(start) and marker in _user_text(r.body)
    ]


def new_bank(server: LiveServer, **config: Any) -> str:
    bank = "conc-" + uuid.uuid4().hex[:8]
    response = httpx.put(f"{server.url}/v1/default/banks/{bank}", json=config, timeout=30)
    assert response.status_code in (200, 201), response.text
    return bank


def turns(marker: str, count: int) -> str:
    """*count* turns of about 400 characters: a few extraction chunks' worth."""
    filler = "and then we talked for a long while about the garden, the weather and the trip. "
    return "\n".join(f"{marker} turn {n}: {filler * 5}" for n in range(count))


def memories(server: LiveServer, bank: str, **params: str) -> list[dict[str, Any]]:
    response = httpx.get(
        f"{server.url}/v1/default/banks/{bank}/memories/list",
        params={"limit": "500", **params},
        timeout=30,
    )
    response.raise_for_status()
    items: list[dict[str, Any]] = response.json()["items"]
    return items


def retain(server: LiveServer, bank: str, content: str) -> dict[str, Any]:
    response = httpx.post(
        f"{server.url}/v1/default/banks/{bank}/memories",
        json={"items": [{"content": content}]},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_a_retains_chunks_are_extracted_side_by_side(
    server: LiveServer, upstream: RunningUpstream
) -> None:
    marker = "Zk" + uuid.uuid4().hex[:8]
    bank = new_bank(server, retain_extraction_mode="concise", enable_observations=False)
    summary = retain(server, bank, turns(marker, 30))
    extraction = summary["extraction"]
    assert extraction["chunks"] >= 4 and extraction["failed_chunks"] == 0
    calls = records_of(upstream, marker, "[0] (")
    assert len(calls) == extraction["chunks"]
    assert most_at_once(calls) >= 3  # one at a time before: each waited for the last
    facts = [m for m in memories(server, bank) if m["text"].startswith("Stated: ")]
    assert len(facts) == 30 == extraction["facts"]
    # The upstream's gate shows in /metrics as a lane of its own, idle again.
    metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
    lane = "llm:openai"
    assert metric_value(metrics, "heed_lane_capacity", lane=lane) == 6
    assert metric_value(metrics, "heed_lane_in_use", lane=lane) == 0


def test_an_asynchronous_retain_writes_documents_as_they_are_ready_and_consolidates_meanwhile(
    server: LiveServer, upstream: RunningUpstream
) -> None:
    marker = "Zk" + uuid.uuid4().hex[:8]
    bank = new_bank(server, retain_extraction_mode="concise", enable_observations=True)
    # Four documents of two short turns: one chunk and two facts each, which the model
    # reads one after the other, the last one slowly.
    items = [
        {
            "content": f"{marker} doc {d} turn one: Ana planted tulips (pace {pace}).\n"
            f"{marker} doc {d} turn two: Ben fixed the fence (pace {pace}).",
            "document_id": f"doc-{d}",
        }
        for d, pace in enumerate([1, 2, 3, 7])
    ]
    response = httpx.post(
        f"{server.url}/v1/default/banks/{bank}/memories",
        json={"async": True, "items": items},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    operation = response.json()["operation_id"]

    def slow_call() -> Record | None:
        calls = [r for r in records_of(upstream, marker, "[0] (") if "pace 7" in _user_text(r.body)]
        return calls[0] if calls else None

    slow = wait_for(slow_call, seconds=30)
    # While the model still reads the last document, the first three are written and
    # their facts consolidated.
    wait_for(
        lambda: len([m for m in memories(server, bank) if m["text"].startswith("Stated: ")]) >= 6,
        seconds=30,
    )
    wait_for(lambda: records_of(upstream, marker, "New facts:"), seconds=30)
    assert slow.completed_at is None, "the first documents waited for the last one"

    def done() -> bool:
        url = f"{server.url}/v1/default/banks/{bank}/operations/{operation}"
        status = httpx.get(url, timeout=30).json()["status"]
        assert status in ("pending", "processing", "completed"), status
        return status == "completed"

    wait_for(done, seconds=60)
    wait_for(lambda: len(memories(server, bank, consolidation_state="done")) == 8, seconds=60)
    # Whole rounds while the retain wrote, the rest after it: as few rounds as after an
    # import (8 facts, rounds of 3: 3 rounds), not a short round per document written.
    rounds = records_of(upstream, marker, "New facts:")
    sizes = sorted(len(_FACT.findall(_user_text(r.body))) for r in rounds)
    assert sizes == [2, 3, 3]
    assert min(r.started_at for r in rounds) < (slow.completed_at or 0)


def test_consolidation_rounds_run_side_by_side_and_lose_no_fact(
    server: LiveServer, upstream: RunningUpstream
) -> None:
    marker = "Zk" + uuid.uuid4().hex[:8]
    bank = new_bank(server, retain_extraction_mode="concise", enable_observations=True)
    retain(server, bank, turns(marker, 18))  # 18 facts: 6 rounds of 3
    facts = {m["id"] for m in memories(server, bank) if m["text"].startswith("Stated: ")}
    assert len(facts) == 18
    wait_for(
        lambda: (
            not memories(server, bank, consolidation_state="pending")
            and len(memories(server, bank, consolidation_state="done")) == 18
        ),
        seconds=60,
    )
    rounds = records_of(upstream, marker, "New facts:")
    assert len(rounds) == 6
    # Side by side (one at a time before); how many overlap depends on how fast each
    # round's related recalls pass (background CPU work, one at a time beside users').
    assert most_at_once(rounds) >= 2
    # The verbatim turns the facts were stated from were not consolidated beside them.
    for r in rounds:
        assert all(text.startswith("Stated: ") for _, text in _FACT.findall(_user_text(r.body)))
    # Every round wanted the same observation; none overwrote another's: every fact is
    # still cited by an observation.
    cited: set[str] = set()
    for observation in memories(server, bank, type="observation"):
        detail = httpx.get(
            f"{server.url}/v1/default/banks/{bank}/memories/{observation['id']}", timeout=30
        ).json()
        cited.update(detail["source_memory_ids"] or [])
    assert facts <= cited
    ops = httpx.get(f"{server.url}/v1/default/banks/{bank}/operations", timeout=30).json()
    [run] = [o for o in ops["operations"] if o["operation_type"] == "consolidation"]
    assert run["status"] == "completed"


def test_a_daily_budget_holds_consolidation_which_says_why_and_resumes(
    server: LiveServer, upstream: RunningUpstream
) -> None:
    marker = "Zk" + uuid.uuid4().hex[:8]
    bank = new_bank(
        server,
        retain_extraction_mode="concise",
        enable_observations=True,
        llm_budget_tokens_per_day=1,  # the retain's own extraction already spends it
    )
    retain(server, bank, turns(marker, 6))
    ops_url = f"{server.url}/v1/default/banks/{bank}/operations"

    def consolidation() -> dict[str, Any] | None:
        ops = httpx.get(ops_url, timeout=30).json()["operations"]
        return next((o for o in ops if o["operation_type"] == "consolidation"), None)

    run = wait_for(consolidation, seconds=30)
    told: dict[str, Any] | None = None
    with httpx.stream(
        "GET", f"{server.url}/v1/runs/{run['id']}/stream", timeout=30
    ) as stream:  # the journal, until the run says why it waits
        for line in stream.iter_lines():
            if line.startswith("data:") and "llm_budget" in line:
                told = json.loads(line[5:])["data"]
                break
    assert told is not None, "the run never said it waits"
    assert told["waiting"] == "llm_budget"
    assert "1 tokens per day is spent" in told["reason"]
    assert told["resumes_at"].endswith("T00:00:00+00:00")
    time.sleep(2 * LATENCY)
    assert records_of(upstream, marker, "New facts:") == []  # no call while held
    assert len(memories(server, bank, consolidation_state="pending")) == 6
    assert consolidation()["status"] == "processing"  # type: ignore[index]

    # The budget raised: the waiting run resumes at once and consolidates everything.
    patch = httpx.patch(
        f"{server.url}/v1/default/banks/{bank}/config",
        json={"updates": {"llm_budget_tokens_per_day": 10_000_000}},
        timeout=30,
    )
    assert patch.status_code == 200, patch.text
    wait_for(lambda: len(memories(server, bank, consolidation_state="done")) == 6, seconds=30)
    assert memories(server, bank, consolidation_state="failed") == []
    assert consolidation()["status"] == "completed"  # type: ignore[index]
