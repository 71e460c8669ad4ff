#!/usr/bin/env python3
"""Screenshots of the web UI's main views, for the README (docs/screenshots/*.png).

Starts a heed server on a loopback port with a temporary data dir and the scripted
chat provider, fills a memory bank and a session through the HTTP API and the UI,
and photographs the pages with Debian's Chromium driven by Playwright:

- ``chat.png``: a session with a tool call, a stopped turn, a turn streaming and a
  message queued behind it;
- ``memory.png``: a bank's page after a recall (with the stage-timing chart) and a
  reflect (its answer and the memories it used);
- ``narrow.png`` and ``narrow-drawer.png``: the chat on a phone-sized screen.

Usage: ``.venv/bin/python scripts/screenshots.py [--out docs/screenshots]``
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.support: the loopback server helper

from playwright.sync_api import sync_playwright  # noqa: E402
from tests.support import live_server  # noqa: E402

from heed.api.app import create_app  # noqa: E402
from heed.settings import Settings  # noqa: E402

FACTS = [
    "Alice adopted two cats, Miso and Tofu, in March 2024. Miso is shy; Tofu is not.",
    "Alice is planning a trip to Lisbon with Bob in May.",
    "Bob is allergic to peanuts.",
    "Alice's sister Carol lives in Porto and works as an architect.",
    "The vet appointment for Tofu is on the first Monday of June.",
]

PACKING = (
    "Here is a packing list for Lisbon in May: light layers for warm afternoons and cool "
    "evenings, comfortable walking shoes for the hills of Alfama, a rain jacket, sunscreen, "
    "a reusable water bottle, adapters for type F sockets, copies of your travel documents, "
    "and peanut-free snacks for Bob on the train to Porto to see Carol."
)
PLAN = (
    "Day one: arrive in Lisbon, check in near Baixa and walk down to the river at sunset. "
    "Day two: tram 28 early, before the crowds, then the castle and lunch in Alfama. "
    "Day three: the train to Porto to visit Carol, back in the evening. "
    "Day four: Belém, the monastery, and pastries."
)

REFLECT_ANSWER = (
    "Tofu sees the vet on the first Monday of June. Plan the Lisbon trip in May around it; "
    "Carol in Porto could look after the cats if you stay longer."
)

SCRIPT: dict[str, Any] = {
    "token_delay": 0.02,
    "replies": [
        {"tool_calls": [{"name": "recall", "arguments": {"query": "Alice's cats"}}]},
        {
            "text": "You adopted two cats in March 2024: Miso, who is shy, and Tofu, "
            "who has a vet appointment on the first Monday of June."
        },
        {"text": PACKING, "token_delay": 0.12},
        {"text": PLAN, "token_delay": 0.12},
        {"text": "Done: a table for two on Friday at 8 pm, peanut-free menu noted for Bob."},
    ],
}

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def assistant_words(page: Any, turn: int) -> int:
    text = page.evaluate(
        "(n) => [...document.querySelectorAll(`#transcript > li.turn:nth-child(${n}) .text`)]"
        ".map((t) => t.textContent).join('')",
        turn,
    )
    return len(str(text).split())


def wait_words(page: Any, turn: int, count: int) -> None:
    """Wait until the *turn*-th turn (from 1) shows *count* words."""
    for _ in range(400):
        if assistant_words(page, turn) >= count:
            return
        page.wait_for_timeout(50)
    raise RuntimeError("the reply did not stream")


def take(out: Path, chromium: str) -> None:
    data = Path(tempfile.mkdtemp(prefix="heed-shots-"))
    settings = Settings(
        data_dir=data,
        llm_provider="scripted",
        llm_script=json.dumps(SCRIPT),
        reflect_llm_script=json.dumps({"replies": [{"text": REFLECT_ANSWER}]}),
        stream_heartbeat_seconds=2.0,
    )
    try:
        with live_server(create_app(settings)) as server, sync_playwright() as pw:
            http = httpx.Client(base_url=server.url, timeout=30)
            http.put("/v1/default/banks/personal", json={"name": "personal"}).raise_for_status()
            items = [{"content": fact} for fact in FACTS]
            http.post("/v1/default/banks/personal/memories", json={"items": items})
            http.put("/v1/default/banks/work", json={"name": "work"}).raise_for_status()
            http.post("/v1/sessions", json={"title": "Weekly review", "bank_id": "work"})
            http.post("/v1/sessions", json={"title": "Recipes"})
            sid = http.post(
                "/v1/sessions", json={"title": "Lisbon trip", "bank_id": "personal"}
            ).json()["id"]

            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(f"{server.url}/#/chat/{sid}")
            page.wait_for_selector("#message-input:not([disabled])")

            def send(text: str) -> None:
                page.fill("#message-input", text)
                page.press("#message-input", "Enter")

            send("What do you remember about my cats?")
            page.wait_for_selector('#transcript > li.turn[data-phase="completed"]')
            send("Write me a packing list for Lisbon.")
            wait_words(page, 2, 24)
            page.click("#stop")
            page.wait_for_selector('#transcript > li.turn[data-phase="cancelled"]')
            page.wait_for_timeout(500)
            send("Plan four days, one line per day.")
            wait_words(page, 3, 30)
            send("And book a table for Friday.")
            page.wait_for_selector("#queue li.queued")
            page.mouse.move(0, 0)
            page.screenshot(path=str(out / "chat.png"))
            page.wait_for_selector(
                "#transcript > li.turn:nth-child(4)[data-phase=completed]", timeout=60_000
            )

            page.set_viewport_size({"width": 1280, "height": 1180})
            page.goto(f"{server.url}/#/memory/personal")
            page.wait_for_selector("#memory-list li")
            page.fill("#recall-query", "When is Tofu's vet appointment?")
            page.press("#recall-query", "Enter")
            page.wait_for_selector("#recall-trace .bar-row")
            page.fill("#reflect-query", "When could we travel without missing the vet?")
            page.press("#reflect-query", "Enter")
            page.wait_for_selector("#reflect-facts li")
            page.fill("#retain-text", "Carol's birthday is on the 12th of July.")
            page.screenshot(path=str(out / "memory.png"))

            phone = browser.new_page(viewport={"width": 390, "height": 780}, is_mobile=True)
            phone.goto(f"{server.url}/#/chat/{sid}")
            phone.wait_for_selector('#transcript > li.turn[data-phase="completed"]')
            phone.wait_for_timeout(300)
            phone.screenshot(path=str(out / "narrow.png"))
            phone.click("#drawer-toggle")
            phone.wait_for_timeout(400)
            phone.screenshot(path=str(out / "narrow-drawer.png"))
            browser.close()
            http.close()
    finally:
        shutil.rmtree(data, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    take(args.out, args.chromium)
    for path in sorted(args.out.glob("*.png")):
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
