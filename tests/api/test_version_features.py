"""``/version`` features are facts: each flag the server says is on works, each it says is off
is absent.

Two real servers, learning on (``HEED_OBSERVATIONS=on``) and off (the default with a
provider that is not ``openai``). For every flag of the unmodified client's ``FeaturesInfo``
the test exercises the capability: a true flag's routes answer 2xx and do their work; a false
flag's routes are absent (404 from the router, or 501), and ``observations: false`` means a
retain leaves nothing for a consolidation. A flag of the client's model with no check here
fails the test, so a new flag cannot go unverified.
"""

from __future__ import annotations

import io
import time
import uuid
import zipfile
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from hindsight_client import Hindsight
from hindsight_client_api.models.features_info import FeaturesInfo

from heed.api.app import create_app
from heed.api.features import ROUTE_FEATURES
from heed.llm import ScriptedProvider
from heed.settings import Settings
from tests.support import LiveServer, live_server, wait_for

NOTE = "Alice keeps bees on her roof in Lyon."


@pytest.fixture(params=["learning-on", "learning-off"], scope="module")
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("features"),
        llm_provider="scripted",
        observations="on" if request.param == "learning-on" else "auto",
        consolidation_debounce_seconds=0.05,
    )
    with live_server(create_app(settings)) as srv:
        srv.app.state.services.retain_provider.current = ScriptedProvider(
            {"replies": [{"when": "new facts:", "json": {"actions": []}}]}
        )
        yield srv


def new_bank(server: LiveServer) -> str:
    bank = "feat-" + uuid.uuid4().hex[:8]
    httpx.put(f"{server.url}/v1/default/banks/{bank}", json={}, timeout=30).raise_for_status()
    return bank


def ok(response: httpx.Response) -> httpx.Response:
    assert 200 <= response.status_code < 300, (response.request.url, response.text)
    return response


def operation_done(server: LiveServer, bank: str, operation_id: str) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        r = ok(httpx.get(f"{server.url}/v1/default/banks/{bank}/operations/{operation_id}"))
        body: dict[str, Any] = r.json()
        return body if body["status"] in ("completed", "failed", "cancelled") else None

    done: dict[str, Any] = wait_for(ended, seconds=60, interval=0.05)
    assert done["status"] == "completed", done
    return done


def retain(server: LiveServer, bank: str, **item: Any) -> None:
    ok(
        httpx.post(
            f"{server.url}/v1/default/banks/{bank}/memories",
            json={"items": [{"content": NOTE, **item}]},
            timeout=30,
        )
    )


# -- each flag's capability, exercised ----------------------------------------------------------


def observations_on(server: LiveServer, bank: str) -> None:
    retain(server, bank)

    def consolidated() -> dict[str, Any] | None:
        listed = ok(httpx.get(f"{server.url}/v1/default/banks/{bank}/operations")).json()
        runs = [o for o in listed["operations"] if o["task_type"] == "consolidation"]
        return runs[0] if runs and runs[0]["status"] == "completed" else None

    wait_for(consolidated, seconds=30, interval=0.05)


def observations_off(server: LiveServer, bank: str) -> None:
    retain(server, bank)
    time.sleep(0.5)  # ten debounces: a consolidation would have been submitted
    base = f"{server.url}/v1/default/banks/{bank}"
    pending = ok(httpx.get(f"{base}/memories/list", params={"consolidation_state": "pending"}))
    assert pending.json()["items"] == []
    kinds = {o["task_type"] for o in ok(httpx.get(f"{base}/operations")).json()["operations"]}
    assert "consolidation" not in kinds


def mcp_on(server: LiveServer, bank: str) -> None:
    ok(
        httpx.post(
            f"{server.url}/mcp",
            headers={"Accept": "application/json, text/event-stream"},
            json={
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "features", "version": "0"},
                },
            },
            timeout=30,
        )
    )


def worker_on(server: LiveServer, bank: str) -> None:
    submitted = ok(
        httpx.post(
            f"{server.url}/v1/default/banks/{bank}/memories",
            json={"items": [{"content": NOTE}], "async": True},
            timeout=30,
        )
    ).json()
    [operation_id] = submitted["operation_ids"]
    operation_done(server, bank, operation_id)


def bank_config_on(server: LiveServer, bank: str) -> None:
    url = f"{server.url}/v1/default/banks/{bank}/config"
    ok(httpx.patch(url, json={"updates": {"reflect_mission": "Help Alice."}}, timeout=30))
    assert ok(httpx.get(url)).json()["overrides"]["reflect_mission"] == "Help Alice."
    ok(httpx.delete(url, timeout=30))
    assert "reflect_mission" not in ok(httpx.get(url)).json()["overrides"]


def file_upload_on(server: LiveServer, bank: str) -> None:
    base = f"{server.url}/v1/default/banks/{bank}"
    files = [("files", ("bees.txt", NOTE.encode()))]
    ok(httpx.post(f"{base}/files/retain", files=files, timeout=60))
    listed = ok(httpx.get(f"{base}/memories/list", params={"document_id": "bees.txt"})).json()
    assert [m["text"] for m in listed["items"]] == [NOTE]


def export_archive(server: LiveServer, bank: str) -> bytes:
    retain(server, bank, document_id="bees")
    submitted = ok(
        httpx.post(
            f"{server.url}/v1/default/banks/{bank}/document-transfer/export",
            params={"document_id": "bees"},
            timeout=30,
        )
    ).json()
    done = operation_done(server, bank, submitted["operation_id"])
    archive = ok(httpx.get(f"{server.url}{done['result_metadata']['download_url']}", timeout=30))
    assert zipfile.is_zipfile(io.BytesIO(archive.content))
    return archive.content


def document_export_on(server: LiveServer, bank: str) -> None:
    export_archive(server, bank)


def document_import_on(server: LiveServer, bank: str) -> None:
    archive = export_archive(server, bank)
    target = new_bank(server)
    submitted = ok(
        httpx.post(
            f"{server.url}/v1/default/banks/{target}/document-transfer",
            files={"file": ("bees.zip", archive, "application/zip")},
            timeout=60,
        )
    ).json()
    operation_done(server, target, submitted["operation_id"])
    ok(httpx.get(f"{server.url}/v1/default/banks/{target}/documents/bees"))


def store_document_text_on(server: LiveServer, bank: str) -> None:
    retain(server, bank, document_id="bees")
    document = ok(httpx.get(f"{server.url}/v1/default/banks/{bank}/documents/bees")).json()
    assert document["original_text"] == NOTE


def routes_answer(flag: str) -> Callable[[LiveServer, str], None]:
    """A flag whose capability is its routes alone: each answers 2xx to an empty request."""

    def check(server: LiveServer, bank: str) -> None:
        for method, path in ROUTE_FEATURES[flag]:
            url = server.url + path.replace("{bank_id}", bank)
            ok(httpx.request(method, url, json={} if method != "GET" else None, timeout=30))

    return check


#: Per flag: what shows it on. Off is the same for every route flag (:func:`absent`).
WHEN_ON: dict[str, Callable[[LiveServer, str], None]] = {
    "observations": observations_on,
    "mcp": mcp_on,
    "worker": worker_on,
    "bank_config_api": bank_config_on,
    "bank_llm_health": routes_answer("bank_llm_health"),
    "file_upload_api": file_upload_on,
    "document_export_api": document_export_on,
    "document_import_api": document_import_on,
    "audit_log": routes_answer("audit_log"),
    "llm_trace": routes_answer("llm_trace"),
    "store_document_text": store_document_text_on,
}


def absent(flag: str, server: LiveServer, bank: str) -> None:
    """Every route of *flag* is unknown to the router (404 ``Not Found``) or a 501."""
    for method, path in ROUTE_FEATURES[flag]:
        url = server.url + path.replace("{bank_id}", bank).replace("{", "").replace("}", "")
        response = httpx.request(method, url, timeout=30)
        assert response.status_code in (404, 501), (flag, method, path, response.text)
        if response.status_code == 404:
            assert response.json() == {"detail": "Not Found"}, (flag, path, response.text)


def test_every_flag_of_the_client_has_a_check() -> None:
    assert set(WHEN_ON) == set(FeaturesInfo.model_fields)
    assert set(ROUTE_FEATURES) | {"observations"} == set(WHEN_ON)


def test_each_flag_is_what_the_server_does(server: LiveServer) -> None:
    client = Hindsight(base_url=server.url, timeout=30)
    try:
        flags = client.get_version().features.to_dict()  # the client reads them
    finally:
        client.close()
    learning_on = server.app.state.services.settings.observations == "on"
    assert flags["observations"] is learning_on
    # Served by heed, once said to be off (a route added later turns its flag on by itself).
    served = ("bank_config_api", "file_upload_api", "document_export_api", "document_import_api")
    assert all(flags[name] for name in served), flags
    for flag, on in flags.items():
        bank = new_bank(server)
        if on:
            WHEN_ON[flag](server, bank)
        elif flag == "observations":
            observations_off(server, bank)
        else:
            absent(flag, server, bank)
