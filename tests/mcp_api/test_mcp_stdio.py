"""``heed mcp``: the same tools over stdio, in a child process, with the SDK's client.

A ``heed serve`` on the same data directory sees the runs the stdio server starts, and
the cancel of a stdio call ends its run ``cancelled``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client, StdioServerParameters

from heed.api.app import create_app
from heed.settings import Settings
from tests.mcp_api.test_mcp_server import LONG, Progress, data, error_text
from tests.support import live_server

SCRIPT = {"replies": [{"text": "unused"}, {"text": LONG, "token_delay": 0.02}]}


def heed_mcp(
    data_dir: Path, *args: str, script: dict[str, Any] = SCRIPT, **env_vars: str
) -> StdioServerParameters:
    env = {
        **os.environ,
        "HEED_DATA_DIR": str(data_dir),
        "HEED_LLM_PROVIDER": "scripted",
        "HEED_LLM_SCRIPT": json.dumps(script),
        **env_vars,
    }
    return StdioServerParameters(
        command=sys.executable, args=["-m", "heed.cli", "mcp", *args], env=env
    )


@asynccontextmanager
async def stdio_client(data_dir: Path, *args: str) -> AsyncIterator[Client]:
    async with Client(heed_mcp(data_dir, *args)) as client:
        yield client


async def test_stdio_serves_the_tools_and_a_cancel_ends_the_run(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    async with stdio_client(data_dir) as client:
        data(await client.call_tool("create_bank", {"bank_id": "notes"}))
        stored = data(
            await client.call_tool(
                "retain", {"bank_id": "notes", "items": [{"content": "Alice has two cats."}]}
            )
        )
        assert stored["units"] >= 1
        found = data(await client.call_tool("recall", {"bank_id": "notes", "query": "cats"}))
        assert "cats" in found["results"][0]["text"]
        assert "not found" in error_text(
            await client.call_tool("recall", {"bank_id": "other", "query": "cats"})
        )
        progress = Progress()
        call = asyncio.create_task(
            client.call_tool(
                "reflect", {"bank_id": "notes", "query": "Pets?"}, progress_callback=progress
            )
        )
        for _ in range(1000):
            if "recall returned" in progress.messages:
                break
            await asyncio.sleep(0.01)
        assert "recall returned" in progress.messages
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        run_id = progress.run_id()
        settings = Settings(data_dir=data_dir, llm_provider="scripted")
        with live_server(create_app(settings)) as server:
            async with httpx.AsyncClient(base_url=server.url) as http:
                for _ in range(500):
                    run = (await http.get(f"/v1/runs/{run_id}")).json()
                    if run["phase"] == "cancelled":
                        break
                    await asyncio.sleep(0.01)
                banks = (await http.get("/v1/default/banks")).json()
    assert (run["phase"], run["kind"], run["cancel_reason"]) == (
        "cancelled",
        "reflect",
        "mcp call cancelled",
    )
    assert "notes" in [b["bank_id"] for b in banks["banks"]]


async def test_a_call_cancelled_over_http_returns_once_its_run_stopped(tmp_path: Path) -> None:
    """The cancel comes from another process: the journal shows the run's terminal event at
    once, and the stdio worker hears of it only at its next lease renewal. The call must
    end when the run is terminal, as ``POST /v1/runs/{id}/cancel?wait=true`` does."""
    data_dir = tmp_path / "data"
    params = heed_mcp(
        data_dir,
        script={"replies": [{"text": LONG, "token_delay": 0.02}]},
        HEED_RUN_REAPER_INTERVAL="1.0",
        HEED_STREAM_POLL_SECONDS="0.1",
    )
    settings = Settings(data_dir=data_dir, llm_provider="scripted")
    async with Client(params) as client:
        progress = Progress()
        call = asyncio.create_task(
            client.call_tool("start_turn", {"message": "Tell me"}, progress_callback=progress)
        )
        with live_server(create_app(settings)) as server:
            async with httpx.AsyncClient(base_url=server.url) as http:
                for _ in range(1000):
                    if progress.messages:
                        run = (await http.get(f"/v1/runs/{progress.run_id()}")).json()
                        if run["phase"] == "running":
                            break
                    await asyncio.sleep(0.01)
                run_id = progress.run_id()
                cancel = await http.post(f"/v1/runs/{run_id}/cancel", params={"reason": "stop"})
                assert cancel.json()["phase"] == "cancelling", cancel.text
                result = await asyncio.wait_for(call, 30)
                at_return = (await http.get(f"/v1/runs/{run_id}")).json()
    assert at_return["phase"] == "cancelled", at_return
    assert f"run {run_id} ended cancelled: stop" in error_text(result)


def test_the_tenant_must_be_named_when_keys_are_set(tmp_path: Path) -> None:
    env = {**os.environ, "HEED_DATA_DIR": str(tmp_path), "HEED_API_KEYS": "k1=alpha"}
    base = [sys.executable, "-m", "heed.cli", "mcp"]
    for args, message in [
        ([], "say whose tools these are with --api-key"),
        (["--api-key", "wrong"], "--api-key is not one of HEED_API_KEYS"),
        (["--api-key", "k1", "--tenant", "x"], "not both"),
    ]:
        done = subprocess.run(
            [*base, *args], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 2 and message in done.stderr, done.stderr
