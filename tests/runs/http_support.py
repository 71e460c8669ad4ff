"""Helpers for run/session tests over a real socket: servers, SSE parsing, sessions."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from heed.api.app import create_app
from heed.llm.base import ChatMessage, StreamEvent, TextDelta, ToolSpec
from heed.settings import Settings
from tests.support import LiveServer, live_server, wait_for

SLOW_SCRIPT = json.dumps({"token_delay": 0.05, "replies": []})  # echo, 50 ms per word


def run_settings(make_settings: Callable[..., Settings], **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "llm_provider": "scripted",
        "llm_script": json.dumps({"token_delay": 0.005, "replies": []}),
        "run_reaper_interval": 0.2,
        "stream_heartbeat_seconds": 0.5,
        "stream_poll_seconds": 0.2,
    }
    values.update(overrides)
    return make_settings(**values)


@contextmanager
def run_server(settings: Settings) -> Iterator[LiveServer]:
    with live_server(create_app(settings)) as server:
        yield server


@dataclass
class Frame:
    event: str = "message"
    id: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    comment: bool = False


async def sse_frames(response: httpx.Response) -> AsyncIterator[Frame]:
    """Parse an SSE response into frames (comments included, marked)."""
    frame = Frame()
    lines: list[str] = []
    async for line in response.aiter_lines():
        if line == "":
            if lines:
                frame.data = json.loads("\n".join(lines))
            if lines or frame.event != "message" or frame.id is not None:
                yield frame
            frame, lines = Frame(), []
            continue
        if line.startswith(":"):
            yield Frame(event="comment", comment=True)
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            frame.event = value
        elif name == "id":
            frame.id = value
        elif name == "data":
            lines.append(value)


def new_session(client: httpx.Client, **body: Any) -> str:
    r = client.post("/v1/sessions", json=body)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def run_phase(client: httpx.Client, run_id: str) -> str:
    return str(client.get(f"/v1/runs/{run_id}").json()["phase"])


@contextmanager
def server_process(
    data_dir: Path, port: int, **extra_env: str
) -> Iterator[subprocess.Popen[bytes]]:
    """``heed serve`` as a real child process (scripted provider, 50 ms per word)."""
    env = {
        **os.environ,
        "HEED_DATA_DIR": str(data_dir),
        "HEED_LLM_PROVIDER": "scripted",
        "HEED_LLM_SCRIPT": json.dumps({"token_delay": 0.05, "replies": []}),
        "HEED_RUN_REAPER_INTERVAL": "0.2",
        "HEED_STREAM_HEARTBEAT_SECONDS": "0.5",
        "HEED_STREAM_POLL_SECONDS": "0.2",
        **extra_env,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "heed.cli", "serve", "--port", str(port), "--log-level", "warning"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:

            def up() -> bool:
                if proc.poll() is not None:
                    raise AssertionError(proc.stderr.read().decode() if proc.stderr else "died")
                try:
                    return client.get("/health").status_code == 200
                except httpx.TransportError:
                    return False

            wait_for(up, seconds=30, interval=0.05)
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class WedgedProvider:
    """A provider stuck in a thread that never checks its token (until released)."""

    name = "wedged"
    model = "wedged"
    follows_tools = True

    def __init__(self, max_wait: float = 60.0) -> None:
        self.max_wait = max_wait
        self.release = threading.Event()
        self.entered = threading.Event()

    async def stream(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[ToolSpec] | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
    ) -> AsyncGenerator[StreamEvent, None]:
        yield TextDelta("partial ")
        self.entered.set()
        await asyncio.to_thread(self.release.wait, self.max_wait)
        yield TextDelta("never")

    async def load(self) -> None:
        pass

    async def aclose(self) -> None:
        self.release.set()
