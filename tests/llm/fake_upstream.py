"""A fake OpenAI-compatible server for tests and benchmarks.

A raw ASGI app served by uvicorn on a real 127.0.0.1 port in its own thread
(its own event loop, so a busy client loop cannot delay what it records). It
answers ``POST /v1/chat/completions`` from a plan of :class:`Behaviour` objects
(one per request, then ``default``), or, when set, from ``responder`` (a function of the
request's body; ``None`` falls back to the plan), streams chunks at a set interval, and
records per request when each chunk was sent and when the client closed the
connection (``http.disconnect``, watched on ``receive`` the whole time).

Times are ``time.monotonic()``, comparable with the test's clock.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

from tests.support import live_server


def text_chunks(words: list[str], *, finish: str | None = "stop") -> list[dict[str, Any]]:
    """``chat.completion.chunk`` objects that stream *words* as content deltas."""
    chunks: list[dict[str, Any]] = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": w}}]} for w in words
    ]
    if finish:
        chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    return chunks


def tool_call_chunks(calls: list[tuple[str, str, list[str]]]) -> list[dict[str, Any]]:
    """Chunks streaming tool calls ``(id, name, argument pieces)`` the way OpenAI does:
    the first delta carries index, id and name; later ones append argument text."""
    chunks: list[dict[str, Any]] = []
    for index, (call_id, name, pieces) in enumerate(calls):
        first = {
            "index": index,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }
        chunks.append({"choices": [{"index": 0, "delta": {"tool_calls": [first]}}]})
        for piece in pieces:
            delta = {"index": index, "function": {"arguments": piece}}
            chunks.append({"choices": [{"index": 0, "delta": {"tool_calls": [delta]}}]})
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    return chunks


def usage_chunk(prompt: int, completion: int) -> dict[str, Any]:
    return {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}


@dataclass
class Behaviour:
    """How the fake answers one request."""

    status: int = 200
    body: Any = None  # error body (JSON-encoded unless bytes/str)
    headers: dict[str, str] = field(default_factory=dict)
    chunks: list[Any] = field(default_factory=list)  # dicts (JSON) or raw str data lines
    interval: float = 0.0  # seconds before each chunk
    header_delay: float = 0.0  # seconds before the response starts
    done: bool = True  # send ``data: [DONE]`` at the end


@dataclass
class Record:
    """What happened to one request."""

    body: dict[str, Any]
    started_at: float
    sent_at: list[float] = field(default_factory=list)
    disconnected_at: float | None = None
    completed_at: float | None = None

    @property
    def chunks_sent(self) -> int:
        return len(self.sent_at)

    def wait_disconnected(self, timeout: float) -> bool:
        """Block until the client closed the connection; False after *timeout* s."""
        deadline = time.monotonic() + timeout
        while self.disconnected_at is None:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        return True


def most_at_once(records: list[Record]) -> int:
    """The most of *records*' requests the upstream was serving at one instant (a request
    ends when it completed, or when the client closed it)."""
    edges = sorted(
        [(r.started_at, 1) for r in records]
        + [(r.completed_at or r.disconnected_at or time.monotonic(), -1) for r in records]
    )
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


class FakeUpstream:
    """The ASGI app plus its plan and records (thread-safe enough for tests)."""

    def __init__(self) -> None:
        self.default = Behaviour(chunks=[*text_chunks(["Hello", " world"]), usage_chunk(3, 2)])
        self._plan: deque[Behaviour] = deque()
        self.records: list[Record] = []
        self._lock = threading.Lock()
        #: Answers a request by its body (runs on the fake's loop); ``None``: the plan.
        self.responder: Callable[[dict[str, Any]], Behaviour | None] | None = None

    def plan(self, *behaviours: Behaviour) -> None:
        """The next requests get these behaviours, in order, then ``default``."""
        with self._lock:
            self._plan.clear()
            self._plan.extend(behaviours)

    def reset(self) -> None:
        with self._lock:
            self._plan.clear()
            self.records.clear()
            self.responder = None
            self.default = Behaviour(chunks=[*text_chunks(["Hello", " world"]), usage_chunk(3, 2)])

    def _next(self, body: dict[str, Any]) -> Behaviour:
        chosen = self.responder(body) if self.responder is not None else None
        if chosen is not None:
            return chosen
        with self._lock:
            return self._plan.popleft() if self._plan else self.default

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        raw = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["path"] != "/v1/chat/completions":
            await self._send_plain(send, 404, b'{"error": {"message": "no such route"}}', {})
            return
        record = Record(body=json.loads(raw or b"{}"), started_at=time.monotonic())
        with self._lock:
            self.records.append(record)
        behaviour = self._next(record.body)

        disconnected = asyncio.Event()

        async def watch() -> None:
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    record.disconnected_at = time.monotonic()
                    disconnected.set()
                    return

        watcher = asyncio.create_task(watch())
        try:
            await self._respond(behaviour, record, send, disconnected)
            # keep watching briefly so a close right after the last chunk is still seen
            record.completed_at = time.monotonic()
            await asyncio.wait({watcher}, timeout=0.05)
        finally:
            watcher.cancel()

    async def _pause(self, seconds: float, disconnected: asyncio.Event) -> bool:
        """Sleep; True if the client disconnected meanwhile."""
        if seconds > 0:
            with suppress(TimeoutError):
                await asyncio.wait_for(disconnected.wait(), seconds)
        return disconnected.is_set()

    async def _respond(
        self, b: Behaviour, record: Record, send: Any, disconnected: asyncio.Event
    ) -> None:
        if await self._pause(b.header_delay, disconnected):
            return
        if b.status != 200:
            body = b.body if b.body is not None else {"error": {"message": f"status {b.status}"}}
            if isinstance(body, str):
                payload = body.encode()
            elif isinstance(body, bytes):
                payload = body
            else:
                payload = json.dumps(body).encode()
            await self._send_plain(send, b.status, payload, b.headers)
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")]
                + [(k.encode(), v.encode()) for k, v in b.headers.items()],
            }
        )
        for chunk in b.chunks:
            if await self._pause(b.interval, disconnected):
                return
            data = chunk if isinstance(chunk, str) else json.dumps(chunk)
            await send(
                {
                    "type": "http.response.body",
                    "body": f"data: {data}\n\n".encode(),
                    "more_body": True,
                }
            )
            record.sent_at.append(time.monotonic())
        if b.done and not disconnected.is_set():
            await send(
                {"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True}
            )
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    async def _send_plain(send: Any, status: int, payload: bytes, headers: dict[str, str]) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                ]
                + [(k.encode(), v.encode()) for k, v in headers.items()],
            }
        )
        await send({"type": "http.response.body", "body": payload})


@dataclass
class RunningUpstream:
    app: FakeUpstream
    port: int

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


@contextmanager
def serve_fake_upstream(timeout: float = 20.0) -> Iterator[RunningUpstream]:
    """Run a :class:`FakeUpstream` with uvicorn on 127.0.0.1 in a thread."""
    with live_server(FakeUpstream(), timeout=timeout) as server:
        yield RunningUpstream(app=server.app, port=server.port)
