"""The web UI with API keys configured: login form, CSRF, logout, expiry and tenant isolation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.browser.helpers import ui_server, ui_settings, wait_for
from tests.support import LiveServer

KEYS = {"key-alpha-123": "alpha", "key-beta-456": "beta"}
ALPHA_KEY, BETA_KEY = KEYS


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server that requires API keys: two keys, two tenants."""
    data = tmp_path_factory.mktemp("keyed") / "data"
    with ui_server(ui_settings(data, api_keys=dict(KEYS))) as live:
        yield live


def bearer(server: LiveServer, key: str) -> httpx.Client:
    return httpx.Client(
        base_url=server.url, timeout=10.0, headers={"Authorization": f"Bearer {key}"}
    )


def session_titles(server: LiveServer, key: str) -> list[str]:
    with bearer(server, key) as c:
        response = c.get("/v1/sessions")
        response.raise_for_status()
        body = response.json()
    items = body if isinstance(body, list) else body.get("sessions") or body.get("items") or []
    return [str(item.get("title")) for item in items]


def sidebar_titles(page: Any) -> list[str]:
    return [str(t) for t in page.locator("#session-list .session-title").all_text_contents()]


def log_in(page: Any, key: str) -> None:
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Log in").click()


def expect_login_form(page: Any) -> None:
    page.wait_for_selector("#login-form", state="visible", timeout=10_000)
    assert page.get_by_label("API key").get_attribute("type") == "password"
    assert not page.locator("#app").is_visible()
    assert not page.locator("#logout").is_visible()


def expect_app(page: Any) -> None:
    page.wait_for_selector("#new-session-title", state="visible", timeout=10_000)
    assert page.locator("#login-form").count() == 0
    assert page.locator("#logout").is_visible()


def fetch_status(page: Any, path: str) -> int:
    return int(page.evaluate("(path) => fetch(path).then((r) => r.status)", path))


def test_login_csrf_reload_logout_and_tenants(page: Any, keyed: LiveServer) -> None:
    page.goto(keyed.url + "/")
    expect_login_form(page)

    # A wrong key: the error line says so, and the form stays.
    log_in(page, "not-a-key")
    alert = page.locator("#login-form [role=alert]")
    wait_for(lambda: "unknown API key" in (alert.text_content() or ""), page=page)
    expect_login_form(page)

    # The right key reaches the app.
    log_in(page, ALPHA_KEY)
    expect_app(page)
    cookies = {c["name"]: c for c in page.context.cookies()}
    assert cookies["heed_session"]["httpOnly"] is True

    # Creating a session is an unsafe POST with the cookie: it needs (and gets) the CSRF header.
    page.fill("#new-session-title", "alpha plans")
    with page.expect_request(
        lambda r: r.method == "POST" and r.url.endswith("/v1/sessions")
    ) as posted:
        page.click("#create-session")
    assert posted.value.headers.get("x-heed-csrf") == cookies["heed_csrf"]["value"]
    wait_for(lambda: "alpha plans" in sidebar_titles(page), page=page)
    assert "alpha plans" in session_titles(keyed, ALPHA_KEY)

    # A reload keeps the session (the cookie), without a new login.
    page.reload()
    page.wait_for_selector("#session-list .session-title", timeout=10_000)
    expect_app(page)
    assert "alpha plans" in sidebar_titles(page)

    # Log out: the form is back, and the API refuses the browser.
    page.get_by_role("button", name="Log out").click()
    expect_login_form(page)
    assert "heed_session" not in {c["name"] for c in page.context.cookies()}
    assert fetch_status(page, "/v1/sessions") == 401

    # The other tenant's key sees none of the first tenant's sessions.
    log_in(page, BETA_KEY)
    expect_app(page)
    page.wait_for_selector("#session-list li", timeout=10_000)
    assert sidebar_titles(page) == []
    assert "alpha plans" not in page.locator("#session-list").inner_text()
    assert fetch_status(page, "/v1/sessions") == 200
    assert "alpha plans" not in session_titles(keyed, BETA_KEY)


def test_an_ended_session_shows_the_form_and_reloads_the_route(
    page: Any, keyed: LiveServer
) -> None:
    with bearer(keyed, ALPHA_KEY) as c:
        session_id = c.post("/v1/sessions", json={"title": "kept open"}).json()["id"]
    page.goto(f"{keyed.url}/#/chat/{session_id}")
    log_in(page, ALPHA_KEY)
    page.wait_for_selector("#message-input:not([disabled])", timeout=10_000)
    assert page.text_content("#session-title") == "kept open"

    # The cookie goes away (expired): the next request answers 401 and the form comes back.
    # That request may be a background status poll rather than this create, so the create is
    # submitted through the DOM: it must fail unseen either way and make nothing.
    page.context.clear_cookies()
    page.evaluate(
        """() => {
            document.getElementById("new-session-title").value = "never made";
            document.getElementById("new-session").requestSubmit();
        }"""
    )
    expect_login_form(page)
    with bearer(keyed, ALPHA_KEY) as c:
        c.post("/v1/sessions", json={"title": "made meanwhile"}).raise_for_status()

    # Logging in again reloads the same route: the chat is open again, the list is fresh.
    log_in(page, ALPHA_KEY)
    expect_app(page)
    page.wait_for_selector("#message-input:not([disabled])", timeout=10_000)
    assert page.url.endswith(f"#/chat/{session_id}")
    assert page.text_content("#session-title") == "kept open"
    wait_for(lambda: "made meanwhile" in sidebar_titles(page), page=page)
    assert "never made" not in sidebar_titles(page)
    assert not page.locator("#banner").is_visible()

    # Logging in as another tenant instead starts the page afresh, on that tenant's data.
    page.context.clear_cookies()
    page.evaluate('() => document.getElementById("new-session").requestSubmit()')
    expect_login_form(page)
    with page.expect_navigation():
        log_in(page, BETA_KEY)
    expect_app(page)
    page.wait_for_selector("#session-list li", timeout=10_000)
    assert "#/chat/" + session_id not in page.url
    assert "kept open" not in sidebar_titles(page)
    assert page.text_content("#session-title") != "kept open"


def test_without_keys_there_is_no_login(page: Any, server: LiveServer) -> None:
    page.goto(server.url + "/")
    page.wait_for_selector("#new-session-title", state="visible", timeout=10_000)
    page.wait_for_selector("#session-list li", timeout=10_000)
    assert page.locator("#login-form").count() == 0
    assert not page.locator("#logout").is_visible()
