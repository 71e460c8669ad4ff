"""Helpers for the browser tests: a scripted server, HTTP shortcuts, SSE connection counting."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from heed.api.app import create_app
from heed.llm.base import ChatProvider
from heed.settings import Settings
from tests.support import LiveServer, live_server

#: The hidden tab's status polling period in the UI (chat.js ``config.hiddenPollMs``).
HIDDEN_POLL_SECONDS = 3.0


def ui_settings(data_dir: Path, **overrides: Any) -> Settings:
    """A server for the UI: scripted turns, fast heartbeats and polls (timing under control)."""
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "llm_provider": "scripted",
        "llm_script": json.dumps({"token_delay": 0.01, "replies": []}),
        "stream_heartbeat_seconds": 1.0,
        "stream_poll_seconds": 0.2,
        "run_reaper_interval": 0.5,
    }
    values.update(overrides)
    return Settings(**values)


@contextmanager
def ui_server(settings: Settings) -> Iterator[LiveServer]:
    with live_server(create_app(settings)) as server:
        yield server


def set_script(server: LiveServer, script: dict[str, Any]) -> None:
    """Give the server's scripted turn provider a new script (replies, per-token delay)."""
    provider = server.app.state.services.turn_provider.get()
    provider.script = script


@contextmanager
def provider_swapped(server: LiveServer, provider: ChatProvider) -> Iterator[None]:
    """Use *provider* for turns inside the block (the scripted one again after it)."""
    slot = server.app.state.services.turn_provider
    previous = slot.get()
    slot.current = provider
    try:
        yield
    finally:
        slot.current = previous


def words(count: int, stem: str = "word") -> str:
    """A reply of *count* distinct words, so a doubled or cut passage is visible."""
    return " ".join(f"{stem}{i:03d}" for i in range(count)) + "."


def client(server: LiveServer) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=10.0)


def new_session(server: LiveServer, title: str = "", bank_id: str | None = None) -> str:
    with client(server) as c:
        response = c.post("/v1/sessions", json={"title": title, "bank_id": bank_id})
        response.raise_for_status()
        return str(response.json()["id"])


def run_phase(server: LiveServer, run_id: str) -> str:
    with client(server) as c:
        return str(c.get(f"/v1/runs/{run_id}").json()["phase"])


def session_status(server: LiveServer, session_id: str) -> dict[str, Any]:
    with client(server) as c:
        body: dict[str, Any] = c.get(f"/v1/sessions/{session_id}/status").json()
        return body


def wait_for(
    predicate: Callable[[], Any],
    seconds: float = 15.0,
    interval: float = 0.05,
    page: Any = None,
) -> Any:
    """Poll *predicate* until it returns something truthy; fail after *seconds*.

    Pass *page* when the predicate reads what Playwright reports through page events
    (network events): the sync API delivers them only while it runs, so the wait pumps it.
    """
    deadline = time.monotonic() + seconds
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {seconds} s")
        if page is not None:
            page.wait_for_timeout(int(interval * 1000))
        else:
            time.sleep(interval)


def is_event_stream(url: str) -> bool:
    path = url.split("?", 1)[0]
    return path.endswith("/events") or path.endswith("/stream")


class SseWatch:
    """Counts a page's event-stream connections from the browser's own network events."""

    def __init__(self, page: Any) -> None:
        self.requests: list[Any] = []
        self.ended: set[int] = set()
        self._lock = threading.Lock()
        page.on("request", self._on_request)
        page.on("requestfinished", self._on_end)
        page.on("requestfailed", self._on_end)

    def _on_request(self, request: Any) -> None:
        if is_event_stream(request.url):
            with self._lock:
                self.requests.append(request)

    def _on_end(self, request: Any) -> None:
        if is_event_stream(request.url):
            with self._lock:
                self.ended.add(id(request))

    @property
    def opened(self) -> int:
        return len(self.requests)

    def urls(self) -> list[str]:
        return [r.url for r in self.requests]

    def open_now(self) -> list[str]:
        with self._lock:
            return [r.url for r in self.requests if id(r) not in self.ended]


def pump(page: Any, seconds: float) -> None:
    """Wait *seconds* while letting Playwright deliver its events (a plain sleep would not)."""
    page.wait_for_timeout(int(seconds * 1000))


def open_chat(page: Any, server: LiveServer, session_id: str) -> None:
    page.goto(f"{server.url}/#/chat/{session_id}")
    page.wait_for_selector("#message-input:not([disabled])", timeout=10_000)


def send(page: Any, text: str) -> None:
    page.fill("#message-input", text)
    page.press("#message-input", "Enter")


def assistant_text(page: Any, index: int = -1) -> str:
    """The text of the assistant part of the turn at *index* (textContent, exact)."""
    value = page.evaluate(
        """(index) => {
            const turns = [...document.querySelectorAll('#transcript > li.turn')];
            const turn = turns.at(index);
            if (!turn) return null;
            return [...turn.querySelectorAll('.msg.assistant .text')]
                .map((t) => t.textContent).join('');
        }""",
        index,
    )
    return "" if value is None else str(value)


def turn_count(page: Any) -> int:
    return int(page.evaluate("() => document.querySelectorAll('#transcript > li.turn').length"))


def set_hidden(page: Any, hidden: bool) -> None:
    """Emulate the tab being hidden or shown (visibilityState override + visibilitychange)."""
    page.evaluate(
        """(hidden) => {
            const state = hidden ? 'hidden' : 'visible';
            const define = (name, value) =>
                Object.defineProperty(document, name, { value, configurable: true });
            define('visibilityState', state);
            define('hidden', hidden);
            document.dispatchEvent(new Event('visibilitychange'));
        }""",
        hidden,
    )
