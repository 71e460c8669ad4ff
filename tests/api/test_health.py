"""Liveness and readiness probes (``GET /health/live``, ``GET /health/ready``), the paths and
shapes of the unmodified client's ``MonitoringApi``, on real servers.

Ready on SQLite and on PostgreSQL with Redis. Not ready, with a 503 naming what: the local
LLM that failed to load; Redis made unreachable (a proxy cut, the shared Redis keeps
running); PostgreSQL made unreachable the same way. Liveness answers throughout, and
readiness comes back once the service does.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
import psycopg
from hindsight_client_api.api.monitoring_api import MonitoringApi
from hindsight_client_api.api_client import ApiClient
from hindsight_client_api.configuration import Configuration
from hindsight_client_api.models.liveness_response import LivenessResponse

from heed.api.app import create_app
from heed.settings import Settings
from tests.pg_support import fresh_schema
from tests.support import LiveServer, live_server, wait_for
from tests.tcp_proxy import TcpProxy, tcp_proxy

REDIS_URL = os.environ.get("HEED_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
TIMEOUT = 1.0  # HEED_READY_TIMEOUT_SECONDS in these servers


def ready(server: LiveServer) -> httpx.Response:
    return httpx.get(f"{server.url}/health/ready", timeout=30)


def live(server: LiveServer) -> LivenessResponse:
    response = httpx.get(f"{server.url}/health/live", timeout=30)
    assert response.status_code == 200, response.text
    return LivenessResponse.from_dict(response.json())


def through_client(server: LiveServer) -> tuple[LivenessResponse, Any]:
    """Both probes called by the client's own generated API."""

    async def call() -> tuple[LivenessResponse, Any]:
        async with ApiClient(Configuration(host=server.url)) as api:
            monitoring = MonitoringApi(api)
            return await monitoring.get_liveness(), await monitoring.get_readiness()

    return asyncio.run(call())


def not_ready(server: LiveServer, component: str) -> dict[str, Any]:
    """Wait for a 503 naming *component*; its body."""

    def refused() -> dict[str, Any] | None:
        response = ready(server)
        if response.status_code != 503:
            return None
        body: dict[str, Any] = response.json()
        return body if component in body["not_ready"] else None

    body: dict[str, Any] = wait_for(refused, seconds=30, interval=0.1)
    assert body["status"] == "unhealthy"
    assert body["detail"].startswith("not ready: ") and component in body["detail"]
    assert body["checks"][component]["ready"] is False
    return body


def back_to_ready(server: LiveServer, seconds: float = 60) -> dict[str, Any]:
    response = wait_for(
        lambda: (r := ready(server)).status_code == 200 and r, seconds=seconds, interval=0.2
    )
    body: dict[str, Any] = response.json()
    return body


def settings(tmp: Any, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "data_dir": tmp,
        "llm_provider": "scripted",
        "ready_timeout_seconds": TIMEOUT,
    }
    values.update(overrides)
    return Settings(**values)


def test_ready_on_sqlite_with_every_check_passing(make_settings: Callable[..., Settings]) -> None:
    app = create_app(make_settings(llm_provider="scripted", ready_timeout_seconds=TIMEOUT))
    with live_server(app) as server:
        response = ready(server)
        assert response.status_code == 200, response.text
        body = response.json()
        assert (body["status"], body["database"], body["not_ready"]) == (
            "healthy",
            "connected",
            [],
        )
        assert {name: c["ready"] for name, c in body["checks"].items()} == {
            "database": True,
            "broker": True,
            "embeddings": True,
            "llm": True,
        }
        assert body["checks"]["database"]["detail"] == "sqlite answers"
        assert body["checks"]["broker"]["detail"] == "in-process"
        liveness, readiness = through_client(server)
        assert liveness.status == "alive" and liveness.uptime_seconds > 0
        assert readiness["status"] == "healthy"
        first = live(server).uptime_seconds
        time.sleep(0.05)
        assert live(server).uptime_seconds > first


def test_the_probes_are_public_with_keys(make_settings: Callable[..., Settings]) -> None:
    app = create_app(make_settings(llm_provider="scripted", api_keys={"a-key-of-a": "a"}))
    with live_server(app) as server:
        assert ready(server).status_code == 200  # no credentials: probes are public
        assert live(server).status == "alive"
        assert httpx.get(f"{server.url}/version", timeout=30).status_code == 401


def test_a_local_model_that_failed_to_load_is_not_ready(
    make_settings: Callable[..., Settings],
) -> None:
    app = create_app(
        make_settings(llm_provider="local", llm_model="no-such-model", ready_timeout_seconds=1)
    )
    with live_server(app) as server:
        body = not_ready(server, "llm")
        assert body["not_ready"] == ["llm"]
        assert body["checks"]["llm"]["detail"] == "the local model failed to load"
        assert body["database"] == "connected"
        assert live(server).status == "alive"


def _pg_target(url: str) -> tuple[str, int] | str:
    parts = psycopg.conninfo.conninfo_to_dict(url)
    host, port = str(parts.get("host") or "127.0.0.1"), int(parts.get("port") or 5432)
    return f"{host}/.s.PGSQL.{port}" if host.startswith("/") else (host, port)


def _through(url: str, proxy: TcpProxy) -> str:
    """*url* (a postgresql:// URL) connecting through *proxy*."""
    split = urlsplit(url)
    user = split.netloc.rpartition("@")[0]
    query = [(k, v) for k, v in parse_qsl(split.query) if k not in ("host", "port")]
    query += [("host", "127.0.0.1"), ("port", str(proxy.port))]
    netloc = f"{user}@" if user else ""
    return urlunsplit((split.scheme, netloc, split.path, urlencode(query), ""))


@contextmanager
def proxied_cluster_server(tmp: Any) -> Iterator[tuple[LiveServer, TcpProxy, TcpProxy]]:
    """A server on PostgreSQL and Redis, each reached through a proxy the test can cut."""
    redis = urlsplit(REDIS_URL)
    with (
        fresh_schema() as pg_url,
        tcp_proxy(_pg_target(pg_url)) as pg,
        tcp_proxy((redis.hostname or "127.0.0.1", redis.port or 6379)) as rd,
    ):
        redis_url = urlunsplit((redis.scheme, f"127.0.0.1:{rd.port}", redis.path, "", ""))
        app = create_app(
            settings(
                tmp,
                database_url=_through(pg_url, pg),
                redis_url=redis_url,
                redis_prefix=f"heed-test-{uuid.uuid4().hex[:8]}:",
            )
        )
        with live_server(app) as server:
            try:
                yield server, pg, rd
            finally:
                pg.restore()  # a clean shutdown writes its runs' ends
                rd.restore()


def test_ready_on_postgresql_and_redis_and_not_while_either_is_unreachable(
    tmp_path: Any,
) -> None:
    with proxied_cluster_server(tmp_path) as (server, pg, rd):
        body = back_to_ready(server)
        assert body["checks"]["database"]["detail"] == "postgresql answers"
        assert body["checks"]["broker"]["detail"] == "redis answers"
        _, readiness = through_client(server)
        assert readiness["status"] == "healthy"

        rd.cut()
        cut_at = time.monotonic()
        body = not_ready(server, "broker")
        assert time.monotonic() - cut_at < TIMEOUT + 10
        assert body["not_ready"] == ["broker"] and body["database"] == "connected"
        assert live(server).status == "alive"
        rd.restore()
        back_to_ready(server)

        pg.cut()
        body = not_ready(server, "database")
        assert body["database"] == "error"
        assert "database" in body["not_ready"] and "broker" not in body["not_ready"]
        started = time.monotonic()
        assert live(server).status == "alive"  # liveness never touches the database
        assert time.monotonic() - started < 5
        started = time.monotonic()
        assert ready(server).status_code == 503  # a probe stuck on the database is bounded
        assert time.monotonic() - started < TIMEOUT + 5
        pg.restore()
        body = back_to_ready(server)
        assert body["checks"]["database"]["detail"] == "postgresql answers"
