"""The MCP tools for mental models and directives, with the SDK's client against a real
``heed serve`` on loopback (and ``heed mcp`` over stdio).

A mental model's refresh is a run (kind ``mental_model_refresh``) that the tools follow
like a reflect: progress per stage, and a cancelled call cancels the run and frees its
reflect slot (the scripted provider's ``latency`` holds the refresh inside its LLM call
when the cancel comes). The domains' rules answer in their own words through both front
ends; a bank's ``mcp_enabled_tools`` refuses the tools it leaves out before any work.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client, StdioServerParameters

from heed.api.app import create_app
from heed.llm import ScriptedProvider
from heed.mcp.calls import MCP_CANCELLED, start_run
from heed.settings import Settings
from tests.mcp_api.test_mcp_server import (
    ALPHA,
    BETA,
    KEYS,
    Progress,
    connect,
    data,
    error_text,
    new_bank,
    run_of,
    until,
)
from tests.support import LiveServer, live_server

ANSWER = "Alice has two cats named Tom and Luna."
QUERY = "What pets does Alice have?"
#: Seconds a cancelled refresh may take to free its slot here: generous, for a loaded test
#: machine (the MCP cancel benchmark measures the real figure).
STOP_BOUND = 10.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("mcp-mental"),
        llm_provider="scripted",
        api_keys=KEYS,
        stream_heartbeat_seconds=0.5,
        stream_poll_seconds=0.2,
    )
    with live_server(create_app(settings)) as srv:
        yield srv


def script(
    server: LiveServer, *replies: dict[str, Any], model: str = "scripted"
) -> ScriptedProvider:
    provider = ScriptedProvider({"model": model, "replies": list(replies)})
    server.app.state.services.reflect.provider = provider
    return provider


def answers(server: LiveServer) -> ScriptedProvider:
    return script(server, {"when": "pets", "text": ANSWER})


def slow(server: LiveServer) -> ScriptedProvider:
    """A refresh that stays inside its LLM call for a minute. Another model than
    :func:`answers`' so a model that one wrote is refreshed, not skipped as unchanged (the
    reflect provider's model is one of a refresh's sources)."""
    return script(
        server, {"when": "pets", "latency": 60, "text": "never written"}, model="scripted-slow"
    )


def reflect_in_use(server: LiveServer) -> int:
    return int(server.app.state.services.lanes["reflect"].stats().in_use)


def http(server: LiveServer, key: str = ALPHA) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )


async def created_model(client: Client, server: LiveServer, bank_id: str) -> str:
    answers(server)
    made = data(
        await client.call_tool(
            "create_mental_model", {"bank_id": bank_id, "name": "Pets", "source_query": QUERY}
        )
    )
    assert made["content"] == ANSWER
    return str(made["mental_model_id"])


# -- mental models ---------------------------------------------------------------------


async def test_create_list_get_and_refresh_a_mental_model(server: LiveServer) -> None:
    answers(server)
    async with connect(server) as client:
        bank_id = await new_bank(client)
        progress = Progress()
        made = data(
            await client.call_tool(
                "create_mental_model",
                {
                    "bank_id": bank_id,
                    "name": "Pets",
                    "source_query": QUERY,
                    "mental_model_id": "alice-pets",
                    "tags": ["family"],
                    "trigger": {"refresh_after_retain": True},
                },
                progress_callback=progress,
            )
        )
        assert made == {
            "mental_model_id": "alice-pets",
            "run_id": progress.run_id(),
            "outcome": "content_written",
            "content": ANSWER,
            "deduplicated": False,
        }
        assert progress.messages[1] == "reflecting", progress.messages
        assert progress.messages[-2:] == ["writing", "done"], progress.messages
        assert "answer written" in progress.messages

        listed = data(await client.call_tool("list_mental_models", {"bank_id": bank_id}))
        assert listed["total"] == 1
        [item] = listed["mental_models"]
        assert (item["id"], item["name"], item["tags"]) == ("alice-pets", "Pets", ["family"])
        assert item["content"] is None and item["last_refreshed_at"]
        full = data(
            await client.call_tool(
                "list_mental_models", {"bank_id": bank_id, "include_content": True}
            )
        )
        assert full["mental_models"][0]["content"] == ANSWER
        elsewhere = data(
            await client.call_tool(
                "list_mental_models",
                {"bank_id": bank_id, "tags": ["work"], "tags_match": "all_strict"},
            )
        )
        assert elsewhere == {"mental_models": [], "total": 0}

        got = data(
            await client.call_tool(
                "get_mental_model", {"bank_id": bank_id, "mental_model_id": "alice-pets"}
            )
        )
        assert got["content"] == ANSWER and got["source_query"] == QUERY
        assert got["trigger"]["refresh_after_retain"] is True

        again = Progress()
        refreshed = data(
            await client.call_tool(
                "refresh_mental_model",
                {"bank_id": bank_id, "mental_model_id": "alice-pets"},
                progress_callback=again,
            )
        )
        # Nothing it reads changed since the first refresh: skipped, no LLM call.
        assert refreshed["outcome"] == "content_preserved_no_new_facts"
        assert refreshed["content"] == ANSWER
        assert refreshed["run_id"] == again.run_id() != made["run_id"]
    run = await run_of(server, refreshed["run_id"])
    assert (run["kind"], run["phase"], run["tenant"]) == (
        "mental_model_refresh",
        "completed",
        "alpha",
    )
    async with http(server) as client_http:
        over_http = await client_http.get(f"/v1/default/banks/{bank_id}/mental-models/alice-pets")
    assert over_http.json()["content"] == ANSWER


async def test_a_mental_models_rules_answer_in_the_domains_words(server: LiveServer) -> None:
    """MentalModels owns the rules: the MCP tools and the HTTP routes refuse alike, and
    nothing is written."""
    async with connect(server) as client, http(server) as api:
        bank_id = await new_bank(client)
        model_id = await created_model(client, server, bank_id)
        spaced = {"name": "   ", "source_query": QUERY}
        over_http = await api.post(f"/v1/default/banks/{bank_id}/mental-models", json=spaced)
        assert over_http.status_code == 400 and over_http.json()["detail"] == "name is empty"
        cases = {
            ("create_mental_model", "name is empty"): {"bank_id": bank_id, **spaced},
            ("create_mental_model", "invalid mental model id 'Bad Id'"): {
                "bank_id": bank_id,
                "name": "x",
                "source_query": QUERY,
                "mental_model_id": "Bad Id",
            },
            ("create_mental_model", "source_query: query has no words"): {
                "bank_id": bank_id,
                "name": "x",
                "source_query": "?!",
            },
            ("create_mental_model", "bank 'nope' not found"): {
                "bank_id": "nope",
                "name": "x",
                "source_query": QUERY,
            },
            ("create_mental_model", "trigger"): {  # a setting heed has not: refused by name
                "bank_id": bank_id,
                "name": "x",
                "source_query": QUERY,
                "trigger": {"refresh_cron": "* * * * *"},
            },
            ("get_mental_model", "mental model 'nope' not found"): {
                "bank_id": bank_id,
                "mental_model_id": "nope",
            },
            ("refresh_mental_model", "mental model 'nope' not found"): {
                "bank_id": bank_id,
                "mental_model_id": "nope",
            },
        }
        for (tool, expected), arguments in cases.items():
            text = error_text(await client.call_tool(tool, arguments))
            assert expected in text, (tool, text)
        listed = data(await client.call_tool("list_mental_models", {"bank_id": bank_id}))
        assert [m["id"] for m in listed["mental_models"]] == [model_id]

        # The minimum interval: a refresh asked too soon is refused, saying when to retry.
        patch = {"trigger": {"min_refresh_interval_seconds": 3600}}
        path = f"/v1/default/banks/{bank_id}/mental-models/{model_id}"
        assert (await api.patch(path, json=patch)).status_code == 200
        arguments = {"bank_id": bank_id, "mental_model_id": model_id}
        text = error_text(await client.call_tool("refresh_mental_model", arguments))
        assert "minimum refresh interval" in text and "retry in" in text
        assert (await api.post(f"{path}/refresh")).status_code == 409


async def test_a_provider_that_cannot_be_built_refuses_a_mental_model_before_any_run(
    tmp_path: Path,
) -> None:
    settings = Settings(
        data_dir=tmp_path, llm_provider="scripted", reflect_llm_provider="nope", api_keys=KEYS
    )
    with live_server(create_app(settings)) as srv:
        async with connect(srv) as client, http(srv) as api:
            bank_id = await new_bank(client, facts=[])
            arguments = {"bank_id": bank_id, "name": "x", "source_query": QUERY}
            text = error_text(await client.call_tool("create_mental_model", arguments))
            assert "unknown LLM provider 'nope'" in text
            assert (await api.get("/v1/runs")).json()["runs"] == []
            listed = await api.get(f"/v1/default/banks/{bank_id}/mental-models")
            assert listed.json()["total"] == 0


# -- cancellation ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_cancelling_a_refresh_call_cancels_the_run_and_frees_the_slot(
    server: LiveServer, mode: str
) -> None:
    async with connect(server, mode=mode) as client:
        bank_id = await new_bank(client)
        model_id = await created_model(client, server, bank_id)
        provider = slow(server)
        progress = Progress()
        call = asyncio.create_task(
            client.call_tool(
                "refresh_mental_model",
                {"bank_id": bank_id, "mental_model_id": model_id},
                progress_callback=progress,
            )
        )
        await until(lambda: bool(provider.requests) and reflect_in_use(server) == 1)
        run_id = progress.run_id()
        assert (await run_of(server, run_id))["phase"] == "running"
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await until(lambda: reflect_in_use(server) == 0, STOP_BOUND)
        got = data(
            await client.call_tool(
                "get_mental_model", {"bank_id": bank_id, "mental_model_id": model_id}
            )
        )
    run = await run_of(server, run_id)
    assert (run["kind"], run["phase"], run["cancel_reason"]) == (
        "mental_model_refresh",
        "cancelled",
        MCP_CANCELLED,
    )
    assert got["content"] == ANSWER  # a cancelled refresh writes nothing


async def test_cancelling_a_create_call_stops_its_first_refresh(server: LiveServer) -> None:
    async with connect(server) as client:
        bank_id = await new_bank(client)
        provider = slow(server)
        progress = Progress()
        call = asyncio.create_task(
            client.call_tool(
                "create_mental_model",
                {"bank_id": bank_id, "name": "Pets", "source_query": QUERY, "mental_model_id": "p"},
                progress_callback=progress,
            )
        )
        await until(lambda: bool(provider.requests) and reflect_in_use(server) == 1)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await until(lambda: reflect_in_use(server) == 0, STOP_BOUND)
        got = data(
            await client.call_tool("get_mental_model", {"bank_id": bank_id, "mental_model_id": "p"})
        )
    run = await run_of(server, progress.run_id())
    assert (run["phase"], run["cancel_reason"]) == ("cancelled", MCP_CANCELLED)
    assert got["content"] == "" and got["last_refreshed_at"] is None  # kept, to refresh later


async def test_a_refresh_cancelled_over_http_ends_the_call_once_it_stopped(
    server: LiveServer,
) -> None:
    async with connect(server) as client:
        bank_id = await new_bank(client)
        model_id = await created_model(client, server, bank_id)
        provider = slow(server)
        progress = Progress()
        call = asyncio.create_task(
            client.call_tool(
                "refresh_mental_model",
                {"bank_id": bank_id, "mental_model_id": model_id},
                progress_callback=progress,
            )
        )
        await until(lambda: bool(provider.requests) and reflect_in_use(server) == 1)
        run_id = progress.run_id()
        async with http(server) as api:
            cancel = await api.post(f"/v1/runs/{run_id}/cancel", params={"reason": "stop"})
            assert cancel.status_code in (200, 202), cancel.text
            result = await asyncio.wait_for(call, 30)
            at_return = (await api.get(f"/v1/runs/{run_id}")).json()
    assert at_return["phase"] == "cancelled", at_return
    assert f"run {run_id} ended cancelled: stop" in error_text(result)
    assert reflect_in_use(server) == 0


async def test_a_refresh_joined_by_a_second_call_is_not_that_calls_to_cancel(
    server: LiveServer,
) -> None:
    async with connect(server) as first, connect(server) as second:
        bank_id = await new_bank(first)
        model_id = await created_model(first, server, bank_id)
        provider = slow(server)
        arguments = {"bank_id": bank_id, "mental_model_id": model_id}
        owner_progress, joiner_progress = Progress(), Progress()
        owner = asyncio.create_task(
            first.call_tool("refresh_mental_model", arguments, progress_callback=owner_progress)
        )
        await until(lambda: bool(provider.requests) and reflect_in_use(server) == 1)
        joiner = asyncio.create_task(
            second.call_tool("refresh_mental_model", arguments, progress_callback=joiner_progress)
        )
        await until(lambda: bool(joiner_progress.updates))
        run_id = owner_progress.run_id()
        assert joiner_progress.run_id() == run_id  # the busy refresh, not a second one
        joiner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await joiner
        await asyncio.sleep(0.3)
        assert (await run_of(server, run_id))["phase"] == "running"
        assert reflect_in_use(server) == 1
        owner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await owner
        await until(lambda: reflect_in_use(server) == 0, STOP_BOUND)
    run = await run_of(server, run_id)
    assert (run["phase"], run["cancel_reason"]) == ("cancelled", MCP_CANCELLED)


@dataclass
class _Run:
    id: str


class _Manager:
    def __init__(self) -> None:
        self.cancelled: list[tuple[str, str]] = []

    async def cancel(self, run_id: str, reason: str, *, wait: bool) -> _Run:
        assert wait
        self.cancelled.append((run_id, reason))
        return _Run(run_id)


@pytest.mark.parametrize(
    ("policy", "joined", "cancelled"),
    [("cancel", False, True), ("continue", False, False), ("cancel", True, False)],
)
async def test_a_call_cancelled_while_its_run_is_submitted_leaves_no_run_unfollowed(
    policy: str, joined: bool, cancelled: bool
) -> None:
    """The run is written before its submit returns: a cancel in between must still reach
    it (unless the call lets it continue, or it is a busy run the call only joined)."""
    manager = _Manager()
    entered, release = asyncio.Event(), asyncio.Event()

    async def submit() -> tuple[_Run, bool]:
        entered.set()
        await release.wait()
        return _Run("run-1"), joined

    call = asyncio.create_task(
        start_run(
            manager,  # type: ignore[arg-type]
            submit(),
            lambda started: None if started[1] else started[0],  # type: ignore[arg-type,return-value]
            on_disconnect=policy,  # type: ignore[arg-type]
        )
    )
    await entered.wait()
    call.cancel()
    await asyncio.sleep(0.05)
    assert not call.done()  # the submit is let finish, not abandoned half-way
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert manager.cancelled == ([("run-1", MCP_CANCELLED)] if cancelled else [])


# -- directives --------------------------------------------------------------------------


async def test_directives_are_created_listed_updated_and_deleted(server: LiveServer) -> None:
    async with connect(server) as client, http(server) as api:
        bank_id = await new_bank(client, facts=[])
        french = data(
            await client.call_tool(
                "create_directive",
                {"bank_id": bank_id, "name": "French", "content": "Answer in French."},
            )
        )
        legal = data(
            await client.call_tool(
                "create_directive",
                {
                    "bank_id": bank_id,
                    "name": "Legal",
                    "content": "Never give legal advice.",
                    "priority": 5,
                    "tags": ["legal"],
                },
            )
        )
        assert (french["priority"], french["is_active"], french["tags"]) == (0, True, [])
        listed = data(await client.call_tool("list_directives", {"bank_id": bank_id}))
        assert [d["id"] for d in listed["directives"]] == [legal["id"], french["id"]]
        assert listed["total"] == 2
        scoped = data(
            await client.call_tool("list_directives", {"bank_id": bank_id, "tags": ["travel"]})
        )
        assert [d["id"] for d in scoped["directives"]] == [french["id"]]  # untagged: always

        changed = data(
            await client.call_tool(
                "update_directive",
                {"bank_id": bank_id, "directive_id": french["id"], "is_active": False},
            )
        )
        assert changed["is_active"] is False and changed["content"] == "Answer in French."
        active = data(await client.call_tool("list_directives", {"bank_id": bank_id}))
        assert [d["id"] for d in active["directives"]] == [legal["id"]]
        every = data(
            await client.call_tool("list_directives", {"bank_id": bank_id, "active_only": False})
        )
        assert every["total"] == 2

        path = f"/v1/default/banks/{bank_id}/directives"
        assert (await api.get(f"{path}/{french['id']}")).json()["is_active"] is False
        gone = data(
            await client.call_tool(
                "delete_directive", {"bank_id": bank_id, "directive_id": french["id"]}
            )
        )
        assert gone == {"id": french["id"], "deleted": True}
        assert (await api.get(f"{path}/{french['id']}")).status_code == 404


async def test_a_directives_rules_answer_in_the_domains_words(server: LiveServer) -> None:
    async with connect(server) as client, http(server) as api:
        bank_id = await new_bank(client, facts=[])
        blank = {"name": "Blank", "content": "   "}
        over_http = await api.post(f"/v1/default/banks/{bank_id}/directives", json=blank)
        assert over_http.status_code == 400 and over_http.json()["detail"] == "content is empty"
        cases = {
            ("create_directive", "content is empty"): {"bank_id": bank_id, **blank},
            ("create_directive", "bank 'nope' not found"): {
                "bank_id": "nope",
                "name": "x",
                "content": "y",
            },
            ("create_directive", "content"): {  # over the length limit: refused by name
                "bank_id": bank_id,
                "name": "x",
                "content": "y" * 5001,
            },
            ("update_directive", f"directive 'nope' not found in bank '{bank_id}'"): {
                "bank_id": bank_id,
                "directive_id": "nope",
                "name": "z",
            },
            ("delete_directive", f"directive 'nope' not found in bank '{bank_id}'"): {
                "bank_id": bank_id,
                "directive_id": "nope",
            },
        }
        for (tool, expected), arguments in cases.items():
            text = error_text(await client.call_tool(tool, arguments))
            assert expected in text, (tool, text)
        listed = data(
            await client.call_tool("list_directives", {"bank_id": bank_id, "active_only": False})
        )
        assert listed["total"] == 0


# -- tenancy and the bank's allow-list ----------------------------------------------------


async def test_another_tenant_sees_no_mental_model_or_directive(server: LiveServer) -> None:
    async with connect(server, ALPHA) as alpha:
        bank_id = await new_bank(alpha)
        model_id = await created_model(alpha, server, bank_id)
        rule = data(
            await alpha.call_tool(
                "create_directive", {"bank_id": bank_id, "name": "r", "content": "Be brief."}
            )
        )
    async with connect(server, BETA) as beta:
        for tool, arguments in {
            "list_mental_models": {"bank_id": bank_id},
            "get_mental_model": {"bank_id": bank_id, "mental_model_id": model_id},
            "refresh_mental_model": {"bank_id": bank_id, "mental_model_id": model_id},
            "create_mental_model": {"bank_id": bank_id, "name": "x", "source_query": QUERY},
            "list_directives": {"bank_id": bank_id},
            "create_directive": {"bank_id": bank_id, "name": "x", "content": "y"},
            "update_directive": {"bank_id": bank_id, "directive_id": rule["id"], "name": "x"},
            "delete_directive": {"bank_id": bank_id, "directive_id": rule["id"]},
        }.items():
            text = error_text(await beta.call_tool(tool, arguments))
            assert f"bank {bank_id!r} not found" in text, (tool, text)
    async with http(server) as api:
        rules = (await api.get(f"/v1/default/banks/{bank_id}/directives")).json()
        models = (await api.get(f"/v1/default/banks/{bank_id}/mental-models")).json()
    assert [r["name"] for r in rules["items"]] == ["r"] and models["total"] == 1


async def test_mcp_enabled_tools_refuses_the_tools_it_leaves_out(server: LiveServer) -> None:
    async with connect(server) as client, http(server) as api:
        bank_id = await new_bank(client)
        model_id = await created_model(client, server, bank_id)
        rule = data(
            await client.call_tool(
                "create_directive", {"bank_id": bank_id, "name": "r", "content": "Be brief."}
            )
        )
        config = f"/v1/default/banks/{bank_id}/config"
        allowed = ["list_mental_models", "list_directives"]
        patched = await api.patch(config, json={"updates": {"mcp_enabled_tools": allowed}})
        assert patched.status_code == 200, patched.text
        assert not (await client.call_tool("list_mental_models", {"bank_id": bank_id})).is_error
        assert not (await client.call_tool("list_directives", {"bank_id": bank_id})).is_error
        for tool, arguments in {
            "get_mental_model": {"bank_id": bank_id, "mental_model_id": model_id},
            "refresh_mental_model": {"bank_id": bank_id, "mental_model_id": model_id},
            "create_mental_model": {"bank_id": bank_id, "name": "x", "source_query": QUERY},
            "create_directive": {"bank_id": bank_id, "name": "x", "content": "y"},
            "update_directive": {"bank_id": bank_id, "directive_id": rule["id"], "name": "x"},
            "delete_directive": {"bank_id": bank_id, "directive_id": rule["id"]},
        }.items():
            text = error_text(await client.call_tool(tool, arguments))
            assert f"'{tool}' is not enabled for bank '{bank_id}'" in text, (tool, text)
        operations = (await api.get(f"/v1/default/banks/{bank_id}/operations")).json()
        models = (await api.get(f"/v1/default/banks/{bank_id}/mental-models")).json()
        rules = (await api.get(f"/v1/default/banks/{bank_id}/directives")).json()
    # refused before any work: no refresh beyond the first, nothing created or changed
    refreshes = [o for o in operations["operations"] if o["task_type"] == "mental_model_refresh"]
    assert len(refreshes) == 1, operations
    assert [m["id"] for m in models["items"]] == [model_id]
    assert [(r["id"], r["name"]) for r in rules["items"]] == [(rule["id"], "r")]


# -- stdio --------------------------------------------------------------------------------


async def test_stdio_creates_a_mental_model_and_a_cancel_ends_its_refresh(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    slow_script = {"replies": [{"when": "pets", "latency": 60, "text": "never written"}]}
    env = {
        **os.environ,
        "HEED_DATA_DIR": str(data_dir),
        "HEED_LLM_PROVIDER": "scripted",
        "HEED_LLM_SCRIPT": json.dumps(slow_script),
    }
    params = StdioServerParameters(command=sys.executable, args=["-m", "heed.cli", "mcp"], env=env)
    async with Client(params) as client:
        data(await client.call_tool("create_bank", {"bank_id": "notes"}))
        data(
            await client.call_tool(
                "retain", {"bank_id": "notes", "items": [{"content": "Alice has two cats."}]}
            )
        )
        rule = data(
            await client.call_tool(
                "create_directive", {"bank_id": "notes", "name": "r", "content": "Be brief."}
            )
        )
        progress = Progress()
        call = asyncio.create_task(
            client.call_tool(
                "create_mental_model",
                {"bank_id": "notes", "name": "Pets", "source_query": QUERY, "mental_model_id": "p"},
                progress_callback=progress,
            )
        )
        await until(lambda: "reflecting" in progress.messages, 30)
        await asyncio.sleep(0.3)  # inside the scripted model's latency
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        run_id = progress.run_id()
        listed = data(await client.call_tool("list_mental_models", {"bank_id": "notes"}))
        assert [m["id"] for m in listed["mental_models"]] == ["p"]
    settings = Settings(data_dir=data_dir, llm_provider="scripted")
    with live_server(create_app(settings)) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as api:
            for _ in range(500):
                run = (await api.get(f"/v1/runs/{run_id}")).json()
                if run["phase"] == "cancelled":
                    break
                await asyncio.sleep(0.01)
            rules = (await api.get("/v1/default/banks/notes/directives")).json()
    assert (run["phase"], run["kind"], run["cancel_reason"]) == (
        "cancelled",
        "mental_model_refresh",
        MCP_CANCELLED,
    )
    assert [r["id"] for r in rules["items"]] == [rule["id"]]


def test_the_tag_limit_is_the_http_apis() -> None:
    from heed.api import input_rules
    from heed.mcp import tools

    assert tools.TAG_CHARS == input_rules.MAX_TAG_CHARS


def test_a_bank_may_list_every_tool_and_only_those() -> None:
    from heed.mcp.tools import HeedTools
    from heed.memory.bank_config.settings import MCP_TOOLS

    class Recorder:
        def __init__(self) -> None:
            self.names: list[str] = []

        def add_tool(self, tool: Any, description: str) -> None:
            self.names.append(tool.__name__)

        def resource(self, *args: Any, **kwargs: Any) -> Any:
            return lambda f: f

    recorder = Recorder()
    HeedTools(None).register(recorder)  # type: ignore[arg-type]
    assert sorted(recorder.names) == sorted(MCP_TOOLS)
