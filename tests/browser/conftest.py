"""Browser tests: Python Playwright driving Debian's Chromium, launched by its own binary.

Never ``playwright install`` (it downloads a browser, which fails here). When
Chromium is missing the tests skip with a loud message; with
``HEED_REQUIRE_BROWSER=1`` (set by ``.ci/run``) that skip becomes a failure.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _unavailable(reason: str) -> None:
    message = f"BROWSER TESTS NOT RUN: {reason}"
    if os.environ.get("HEED_REQUIRE_BROWSER") == "1":
        pytest.fail(message + " (HEED_REQUIRE_BROWSER=1)", pytrace=False)
    print(f"\n*** {message} ***", file=sys.stderr)
    pytest.skip(message)


@pytest.fixture(scope="session")
def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        _unavailable("Chromium is not installed (apt-get install chromium)")
    assert path is not None
    return path


@pytest.fixture(scope="module")
def browser(chromium_path: str) -> Iterator[Any]:
    """One Chromium per test module.

    Module scope, not session: Playwright's sync API keeps an event loop running
    in the main thread while it is open, which would break the asyncio tests of
    other modules.
    """
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the playwright package is not installed")
    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS)
        try:
            yield instance
        finally:
            instance.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    try:
        yield page
    finally:
        context.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One scripted heed server per test module (tests set their own script)."""
    from tests.browser.helpers import ui_server, ui_settings

    with ui_server(ui_settings(tmp_path_factory.mktemp("ui") / "data")) as live:
        yield live
