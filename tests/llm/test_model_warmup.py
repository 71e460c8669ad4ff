"""The LLM's model loads at start-up in the background, and /version says how that went."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from heed.api.app import create_app
from heed.settings import Settings
from tests.support import live_server, wait_for


def _llm_status(url: str) -> dict[str, object]:
    status: dict[str, object] = httpx.get(f"{url}/version", timeout=10).json()["llm"]
    return status


def test_a_provider_that_loads_is_ready(make_settings: Callable[..., Settings]) -> None:
    with live_server(create_app(make_settings(llm_provider="scripted"))) as server:
        status = wait_for(lambda: (s := _llm_status(server.url))["state"] == "ready" and s)
    assert status["detail"] is None and isinstance(status["seconds"], float)


def test_a_model_that_cannot_load_is_reported_with_its_error(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings(llm_provider="local", llm_model="no-such-model")
    with live_server(create_app(settings)) as server:
        status = wait_for(lambda: (s := _llm_status(server.url))["state"] == "failed" and s)
        assert "no-such-model" in str(status["detail"])
        # the server serves on regardless
        assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
