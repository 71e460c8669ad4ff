"""Test support: a real uvicorn server on a loopback port in a thread, polling, metrics."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import uvicorn

from heed.api.server import server_config

AppT = TypeVar("AppT")  # a FastAPI app, or any ASGI app


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class LiveServer(Generic[AppT]):
    """A running server: its base URL and the app object (to inspect state)."""

    app: AppT
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@contextmanager
def live_server(app: AppT, *, timeout: float = 20.0) -> Iterator[LiveServer[AppT]]:
    """Serve *app* with uvicorn on 127.0.0.1 in a background thread until the block exits."""
    port = free_port()
    services = getattr(getattr(app, "state", None), "services", None)
    if services is not None:  # a heed app: served as `heed serve` serves it
        config = server_config(
            app, services.settings, host="127.0.0.1", port=port, log_level="warning", lifespan="on"
        )
    else:
        config = uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"
        )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("test server did not start")
        time.sleep(0.01)
    try:
        yield LiveServer(app=app, host="127.0.0.1", port=port)
    finally:
        server.should_exit = True
        thread.join(timeout)


def wait_for(predicate: Callable[[], Any], seconds: float = 10.0, interval: float = 0.02) -> Any:
    """Poll *predicate* until it returns something truthy (returned); fail after *seconds*."""
    deadline = time.monotonic() + seconds
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(interval)


def metric_value(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text, 0.0 when absent."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        metric, _, value = line.rpartition(" ")
        if "{" in metric:
            metric_name, _, label_part = metric.partition("{")
            got = ",".join(sorted(label_part.rstrip("}").split(",")))
        else:
            metric_name, got = metric, ""
        if metric_name == name and got == want:
            return float(value)
    return 0.0
