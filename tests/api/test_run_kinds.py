"""The runs API names every kind of run the server registers, and filters by each."""

from __future__ import annotations

from collections.abc import Iterator
from typing import get_args

import httpx
import pytest

from heed.api.app import create_app
from heed.api.routes.runs import RunKind
from heed.settings import Settings
from tests.support import LiveServer, live_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = Settings(data_dir=tmp_path_factory.mktemp("kinds"), llm_provider="scripted")
    with live_server(create_app(settings)) as srv:
        yield srv


def test_every_registered_kind_is_a_run_kind_of_the_api(server: LiveServer) -> None:
    registered = set(server.app.state.services.manager.kinds)
    assert registered == set(get_args(RunKind))
    for kind in sorted(registered):
        response = httpx.get(f"{server.url}/v1/runs", params={"kind": kind}, timeout=10)
        assert response.status_code == 200, (kind, response.text)
    unknown = httpx.get(f"{server.url}/v1/runs", params={"kind": "nonsense"}, timeout=10)
    assert unknown.status_code in (400, 422) and "kind" in unknown.text
