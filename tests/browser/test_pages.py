"""The memory page, the sessions sidebar, keyboard use and the narrow-screen layout."""

from __future__ import annotations

import re
from typing import Any

from tests.browser.helpers import (
    assistant_text,
    client,
    new_session,
    open_chat,
    run_phase,
    send,
    set_script,
    wait_for,
    words,
)
from tests.support import LiveServer


def test_memory_page_retain_list_recall_with_stage_timings_and_reflect(
    page: Any, server: LiveServer
) -> None:
    page.goto(f"{server.url}/#/memory")
    page.wait_for_selector("#bank-empty")
    page.fill("#bank-new", "ui-bank")
    page.press("#bank-new", "Enter")
    page.wait_for_url(re.compile(r".*#/memory/ui-bank$"))
    page.wait_for_selector("#bank-list a.current")
    assert page.text_content("#bank-title") == "Bank: ui-bank"
    page.wait_for_selector("#memory-list ~ p, #card-memories", state="attached")
    page.wait_for_function("() => /No memories yet/.test(document.body.innerText)")

    facts = [
        "Alice adopted two cats, Miso and Tofu, in March 2024.",
        "Bob moved to Lisbon last summer and works as a baker.",
    ]
    page.fill("#retain-text", facts[0])
    page.click("#retain-form button[type=submit]")
    page.wait_for_selector("#retain-form .form-status.ok")
    page.fill("#retain-text", facts[1])
    page.press("#retain-text", "Control+Enter")  # keyboard submit
    page.wait_for_function("() => document.querySelectorAll('#memory-list li').length === 2")
    listed = page.inner_text("#memory-list")
    assert all(fact in listed for fact in facts)
    assert page.text_content("#memory-count") == "2 memories"

    page.fill("#recall-query", "cats")
    page.press("#recall-query", "Enter")
    page.wait_for_selector("#recall-results li")
    first = page.locator("#recall-results li .fact-text").first.text_content()
    assert first == facts[0]
    rows = page.locator("#recall-trace .bar-row")
    stages = [rows.nth(i).get_attribute("data-stage") for i in range(rows.count())]
    assert len(stages) >= 5 and "embedding" in stages, stages
    widths = page.evaluate(
        "() => [...document.querySelectorAll('#recall-trace .bar')]"
        ".map((b) => b.getBoundingClientRect().width)"
    )
    assert all(w > 0 for w in widths) and max(widths) > 50
    assert "Stage timings" in page.inner_text("#recall-trace")

    # Bad input gets a clear message, not a request.
    page.fill("#recall-query", "")
    page.press("#recall-query", "Enter")
    page.wait_for_selector("#recall-form .form-status.error")

    page.fill("#reflect-query", "What pets does Alice have?")
    page.press("#reflect-query", "Enter")
    page.wait_for_function(
        "() => !/Reflecting/.test(document.querySelector('#reflect-form .form-status').textContent)"
    )
    assert page.text_content("#reflect-answer")
    assert "based on" in page.text_content("#reflect-form .form-status")
    steps = page.locator("#reflect-steps li").all_text_contents()
    assert steps and steps[0].startswith("recall"), steps  # streamed: the agent recalls first
    assert page.text_content("#reflect-submit") == "Reflect"
    used = page.locator("#reflect-facts li .fact-text").all_text_contents()
    assert used and all(text in facts for text in used), used
    # What the reflect cost: the bank's tokens by kind of work (its stats' llm_usage).
    page.wait_for_selector("#bank-usage tr[data-kind=reflect]")
    cells = page.locator("#bank-usage tr[data-kind=reflect] td").all_text_contents()
    assert cells[0] == "reflect" and int(cells[1]) >= 1 and int(cells[4]) > 0, cells

    page.goto(f"{server.url}/#/memory/no-such-bank")
    page.wait_for_function(
        "() => /does not exist/.test(document.getElementById('bank-meta').textContent)"
    )


def test_sessions_sidebar_create_rename_delete_and_keyboard(page: Any, server: LiveServer) -> None:
    with client(server) as c:
        c.put("/v1/default/banks/trips", json={"name": "trips"}).raise_for_status()
    reply = words(120, "kb")
    set_script(server, {"token_delay": 0.05, "replies": [{"text": reply}]})
    page.goto(f"{server.url}/")
    page.wait_for_selector("#new-session-bank option[value=trips]", state="attached")

    # Create, bound to a memory bank.
    page.fill("#new-session-title", "Trip plans")
    page.select_option("#new-session-bank", "trips")
    page.press("#new-session-title", "Enter")
    page.wait_for_url(re.compile(r".*#/chat/ses_\w+$"))
    sid = page.url.rsplit("/", 1)[1]
    page.wait_for_function(
        "() => document.getElementById('session-title').textContent === 'Trip plans'"
    )
    assert page.text_content("#session-bank") == "memory bank: trips"
    row = page.locator(f'#session-list li.session[data-id="{sid}"]')
    assert row.get_attribute("class") and "current" in row.get_attribute("class")
    with client(server) as c:
        assert c.get(f"/v1/sessions/{sid}").json()["bank_id"] == "trips"

    # Keyboard only: the composer has focus, Enter sends, Escape stops.
    page.keyboard.type("plan a long trip")
    page.keyboard.press("Enter")
    wait_for(lambda: len(assistant_text(page).split()) >= 5)
    page.wait_for_selector(f'#session-list li.session[data-id="{sid}"] .dot.busy')
    page.keyboard.press("Escape")
    page.wait_for_selector('#transcript > li.turn[data-phase="cancelled"]', timeout=10_000)
    run_id = page.get_attribute("#transcript > li.turn", "data-run-id")
    assert run_id
    wait_for(lambda: run_phase(server, run_id) == "cancelled")
    page.wait_for_selector(f'#session-list li.session[data-id="{sid}"] .dot:not(.busy)')

    # Rename inline (Enter saves).
    page.click('#session-list button[aria-label="rename Trip plans"]')
    page.fill("#session-list .rename-input", "Holiday")
    page.press("#session-list .rename-input", "Enter")
    page.wait_for_selector('#session-list .session-title:text("Holiday")')
    assert page.text_content("#session-title") == "Holiday"
    with client(server) as c:
        assert c.get(f"/v1/sessions/{sid}").json()["title"] == "Holiday"

    # Delete with an inline confirmation.
    other = new_session(server, "Keep me")
    page.reload()
    page.wait_for_selector(f'#session-list li.session[data-id="{other}"]')
    page.click('#session-list button[aria-label="delete Holiday"]')
    page.click('#session-list li.session button:text("Delete")')
    page.wait_for_selector(f'#session-list li.session[data-id="{sid}"]', state="detached")
    with client(server) as c:
        assert c.get(f"/v1/sessions/{sid}").status_code == 404


def test_narrow_screen_drawer_and_no_horizontal_scroll(browser: Any, server: LiveServer) -> None:
    set_script(server, {"token_delay": 0.0, "replies": [{"text": words(30, "narrow")}]})
    sid = new_session(server, "A narrow session with a rather long title")
    context = browser.new_context(viewport={"width": 390, "height": 780}, is_mobile=True)
    page = context.new_page()
    try:
        open_chat(page, server, sid)
        assert page.is_visible("#drawer-toggle")
        sidebar_box = page.locator("#session-sidebar").bounding_box()
        assert sidebar_box is None or sidebar_box["x"] + sidebar_box["width"] <= 1
        send(page, "hello from a phone")
        page.wait_for_selector('#transcript > li.turn[data-phase="completed"]')
        assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
        composer = page.locator("#composer").bounding_box()
        assert composer and composer["y"] + composer["height"] <= 780

        page.click("#drawer-toggle")
        page.wait_for_function(
            "() => document.getElementById('session-sidebar').getBoundingClientRect().x >= 0"
        )
        assert page.get_attribute("#drawer-toggle", "aria-expanded") == "true"
        page.keyboard.press("Escape")
        page.wait_for_function(
            "() => document.getElementById('session-sidebar').getBoundingClientRect().right <= 1"
        )

        page.click("nav.pages a[data-page=memory]")
        page.wait_for_selector("#memory-view:not([hidden])")
        assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
    finally:
        context.close()


def test_reflect_streams_and_stop_ends_the_server_work(page: Any, server: LiveServer) -> None:
    from heed.llm.scripted import ScriptedProvider

    slow = ScriptedProvider({"token_delay": 0.1, "replies": [{"text": words(200, "think")}]})
    service = server.app.state.services.reflect
    previous = service.provider
    service.provider = slow
    try:
        with client(server) as c:
            c.put("/v1/default/banks/slow", json={"name": "slow"}).raise_for_status()
            items = [{"content": "Dana plays the cello every Sunday morning."}]
            c.post("/v1/default/banks/slow/memories", json={"items": items}).raise_for_status()
        page.goto(f"{server.url}/#/memory/slow")
        page.wait_for_selector("#memory-list li")
        page.fill("#reflect-query", "What does Dana do on Sundays?")
        page.press("#reflect-query", "Enter")
        page.wait_for_function(
            "() => /think005/.test(document.getElementById('reflect-answer').textContent)"
        )
        assert page.text_content("#reflect-submit") == "Stop"
        assert "think199" not in page.text_content("#reflect-answer")
        page.click("#reflect-submit")
        page.wait_for_function(
            "() => /Stopped/.test(document.querySelector('#reflect-form .form-status').textContent)"
        )
        assert page.text_content("#reflect-submit") == "Reflect"
        # The server stopped generating: no token is produced a while after the stop.
        page.wait_for_timeout(400)
        last = slow.last_token_at
        page.wait_for_timeout(600)
        assert slow.last_token_at == last, "the reflect kept generating after Stop"
    finally:
        service.provider = previous
