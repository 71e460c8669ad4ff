"""A real webhook receiver for tests: ``http.server`` on a loopback port, in a thread.

Each path answers what the test set (``answers[path] = (status, headers)``, default 200),
optionally after a delay, and every request is recorded (path, headers, raw body)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    url: str
    received: list[Received] = field(default_factory=list)
    answers: dict[str, tuple[int, dict[str, str]]] = field(default_factory=dict)
    delays: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def at(self, path: str) -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.path.split("?")[0] == path]


@contextmanager
def receiver() -> Iterator[Receiver]:
    state: dict[str, Receiver] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            rec = state["r"]
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            with rec.lock:
                rec.received.append(Received(self.path, dict(self.headers.items()), body))
            path = self.path.split("?")[0]
            time.sleep(rec.delays.get(path, 0.0))
            status, headers = rec.answers.get(path, (200, {}))
            payload = b'{"ok": true}' if status < 300 else b"receiver says no"
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state["r"] = Receiver(url=f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state["r"]
    finally:
        server.shutdown()
        server.server_close()
