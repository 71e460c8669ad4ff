"""A real webhook receiver for tests: ``http.server`` on a loopback port, in a thread.

Each path answers what the test set (``answers[path] = (status, headers)``, default 200),
optionally after a delay, with the test's body (``bodies[path]``) or a default one, or
drips its body (``drips[path] = seconds``: ``Content-Length: 100000``, then one byte every
*seconds* until the client leaves). Every request is recorded (path, headers, raw body).
With *tls* (a server context) it speaks HTTPS and records the TLS server name each client
sent (``server_names``)."""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DRIP_LENGTH = 100_000


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.monotonic)

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    url: str
    port: int
    received: list[Received] = field(default_factory=list)
    answers: dict[str, tuple[int, dict[str, str]]] = field(default_factory=dict)
    delays: dict[str, float] = field(default_factory=dict)
    bodies: dict[str, bytes] = field(default_factory=dict)
    drips: dict[str, float] = field(default_factory=dict)
    #: Drips still being answered, and the bytes each one sent.
    dripping: int = 0
    dripped: list[int] = field(default_factory=list)
    server_names: list[str | None] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

    def at(self, path: str) -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.path.split("?")[0] == path]


@contextmanager
def receiver(
    host: str = "127.0.0.1", port: int = 0, tls: ssl.SSLContext | None = None
) -> Iterator[Receiver]:
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
            if path in rec.drips:
                self._drip(rec, status, rec.drips[path])
                return
            payload = rec.bodies.get(path, b'{"ok": true}' if status < 300 else b"receiver says no")
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _drip(self, rec: Receiver, status: int, every: float) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(DRIP_LENGTH))
            self.end_headers()
            self.wfile.flush()
            sent = 0
            with rec.lock:
                rec.dripping += 1
            try:
                while sent < DRIP_LENGTH and not rec.stop.is_set():
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    sent += 1
                    rec.stop.wait(every)
            except OSError:
                pass  # the client left
            finally:
                with rec.lock:
                    rec.dripping -= 1
                    rec.dripped.append(sent)
            self.close_connection = True

        def log_message(self, *args: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # a client that left (heed hung up at its deadline): nothing to report

    server = Server((host, port), Handler)
    bound = int(server.server_address[1])
    state["r"] = Receiver(url=f"{'https' if tls else 'http'}://{host}:{bound}", port=bound)
    if tls is not None:

        def record(_socket: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
            with state["r"].lock:
                state["r"].server_names.append(name)

        tls.sni_callback = record  # type: ignore[assignment]
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state["r"]
    finally:
        state["r"].stop.set()
        server.shutdown()
        server.server_close()
