"""The page shell loads from heed itself and reports the server's health."""

from __future__ import annotations

from typing import Any

from heed.api.app import create_app
from heed.settings import Settings
from tests.support import live_server


def test_index_loads_without_external_requests(page: Any, settings: Settings) -> None:
    app = create_app(settings)
    requested: list[str] = []
    with live_server(app) as server:
        page.on("request", lambda request: requested.append(request.url))
        page.goto(server.url + "/")
        page.wait_for_selector("#server-status.ok", timeout=10_000)
        assert page.text_content("#server-status") == "server healthy"
    assert requested, "the page made no requests"
    assert all(url.startswith(server.url) for url in requested), requested
