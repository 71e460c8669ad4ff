"""The memory page's tabs for what a bank learns: observations (Consolidate with its live
progress and Stop, sources and history on demand), mental models (create, Refresh with the
refresh run's journal live, Stop leaves the content as it was, history) and directives
(create, switch off and on, delete); plus the pure pieces of those modules.

A real server on a socket with the scripted provider: consolidation's calls go to the retain
provider and a refresh's reflect to the reflect provider, each swapped for a script with
``latency`` where a test has to press Stop while the model is still "thinking".
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from heed.llm.scripted import ScriptedProvider
from tests.browser.helpers import SseWatch, client, set_hidden, ui_server, ui_settings, wait_for
from tests.support import LiveServer

FIRST = "Alice adopted a cat named Miso in March."
SECOND = "Alice adopted a second cat named Tofu in May."
BELIEF = "Alice has a cat named Miso."
REVISED = "Alice has two cats, Miso and Tofu."


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """Banks keep observations; consolidation starts only when asked (no debounce timer fires
    during a test) and takes one fact per round, so each round is a progress event."""
    settings = ui_settings(
        tmp_path_factory.mktemp("learning") / "data",
        observations="on",
        consolidation_debounce_seconds=3600,
        consolidation_batch=1,
    )
    with ui_server(settings) as live:
        yield live


@contextmanager
def retain_script(server: LiveServer, script: dict[str, Any]) -> Iterator[ScriptedProvider]:
    """Consolidation's model (the retain provider) plays *script* inside the block."""
    slot = server.app.state.services.retain_provider
    previous = slot.get()
    provider = ScriptedProvider(script)
    slot.current = provider
    try:
        yield provider
    finally:
        slot.current = previous


@contextmanager
def reflect_script(server: LiveServer, script: dict[str, Any]) -> Iterator[ScriptedProvider]:
    """Reflect's model (a mental model's refresh asks it) plays *script* inside the block."""
    service = server.app.state.services.reflect
    previous = service.provider
    provider = ScriptedProvider(script)
    service.provider = provider
    try:
        yield provider
    finally:
        service.provider = previous


def new_bank(server: LiveServer, bank: str, *facts: str) -> None:
    with client(server) as c:
        c.put(f"/v1/default/banks/{bank}", json={"name": bank}).raise_for_status()
        for fact in facts:  # one retain each: consolidation takes them in this order
            c.post(
                f"/v1/default/banks/{bank}/memories", json={"items": [{"content": fact}]}
            ).raise_for_status()


def get(server: LiveServer, path: str, **params: Any) -> Any:
    with client(server) as c:
        response = c.get(path, params=params)
        response.raise_for_status()
        return response.json()


def test_observations_consolidate_live_stop_then_sources_and_history(
    page: Any, server: LiveServer
) -> None:
    bank = "learn-obs"
    new_bank(server, bank, FIRST, SECOND)
    units = get(server, f"/v1/default/banks/{bank}/memories/list")["items"]
    ids = {u["text"]: u["id"] for u in units}
    assert set(ids) == {FIRST, SECOND}

    page.goto(f"{server.url}/#/memory/{bank}/observations")
    page.wait_for_selector('#tab-observations[aria-selected="true"]')
    assert page.is_hidden("#panel-memories")
    page.wait_for_function(
        "() => /No observations yet/.test("
        "document.getElementById('observation-status').textContent)"
    )

    # Round 1 (the first fact) creates an observation; round 2's model call hangs for a minute.
    create = {"json": {"actions": [{"action": "create", "text": BELIEF, "facts": [0]}]}}
    hang = {"latency": 60, "json": {"actions": []}}
    with retain_script(server, {"select": "sequence", "replies": [create, hang]}) as model:
        page.click("#consolidate")
        page.wait_for_selector('#consolidation-progress[data-phase="running"]')
        assert page.is_disabled("#consolidate")
        page.wait_for_selector(
            '#consolidation-progress .run-steps li[data-type="progress"]:has-text("round 1")'
        )
        wait_for(lambda: len(model.requests) >= 2)  # round 2's call is in progress
        state = page.text_content("#consolidation-progress .run-state") or ""
        assert "round 1: 1 fact consolidated, 1 created" in state, state
        run_id = page.get_attribute("#consolidation-progress", "data-run-id")
        assert run_id
        # What round 1 wrote shows while the run goes on.
        page.wait_for_selector("#observation-list li.observation")
        assert page.text_content("#observation-list li.observation .fact-text") == BELIEF
        assert page.get_attribute("#consolidation-progress", "data-phase") == "running"

        stop = page.locator('#consolidation-progress button[aria-label="stop the consolidation"]')
        assert stop.is_visible()
        started = time.monotonic()
        stop.click()
        page.wait_for_selector('#consolidation-progress[data-phase="cancelled"]', timeout=10_000)
        assert time.monotonic() - started < 5, "the stop waited for the model"
    assert get(server, f"/v1/runs/{run_id}")["phase"] == "cancelled"
    assert page.is_hidden("#consolidation-progress .run-stop")
    stopped = page.text_content("#consolidation-progress .run-state") or ""
    assert "Consolidation stopped" in stopped and "stay waiting" in stopped, stopped
    pending = get(server, f"/v1/default/banks/{bank}/memories/list", consolidation_state="pending")[
        "items"
    ]
    assert [u["text"] for u in pending] == [SECOND]
    page.wait_for_selector("#observation-list li.observation")
    assert page.text_content("#observation-list li.observation .fact-text") == BELIEF
    assert page.text_content("#observation-list .proof-count") == "proof count 1"

    # Again: the pending fact refines the observation (its earlier text goes to its history).
    update = {"action": "update", "observations": [0], "text": REVISED, "facts": [0]}
    with retain_script(server, {"replies": [{"json": {"actions": [update]}}]}):
        page.click("#consolidate")
        page.wait_for_selector('#consolidation-progress[data-phase="completed"]', timeout=15_000)
    assert page.text_content("#consolidation-progress .run-state") == (
        "Consolidation completed: 1 fact consolidated, 1 observation updated."
    )
    assert page.is_enabled("#consolidate")
    page.wait_for_function(
        "(text) => document.querySelector('#observation-list li.observation .fact-text')"
        "?.textContent === text",
        arg=REVISED,
    )
    assert page.locator("#observation-list li.observation").count() == 1
    assert page.text_content("#observation-count") == "1 observation"
    item = page.locator("#observation-list li.observation").first
    assert item.locator(".proof-count").text_content() == "proof count 2"

    # Sources and history are read when opened.
    item.locator("details.sources summary").click()
    page.wait_for_selector("#observation-list details.sources li.source >> nth=1")
    sources = item.locator("details.sources li.source .fact-text").all_text_contents()
    assert sorted(sources) == sorted([FIRST, SECOND])
    item.locator("details.history summary").click()
    page.wait_for_selector("#observation-list details.history li.version")
    versions = item.locator("details.history li.version")
    assert versions.count() == 1
    assert versions.first.locator(".fact-text").text_content() == BELIEF
    assert "updated" in (versions.first.locator(".fact-meta").text_content() or "")


def test_mental_model_refresh_live_stop_keeps_content_then_a_refresh_writes_it(
    page: Any, server: LiveServer
) -> None:
    bank = "learn-mm"
    new_bank(server, bank, FIRST)
    first_answer = "Alice has one cat, Miso."
    streams = SseWatch(page)
    page.goto(f"{server.url}/#/memory/{bank}")
    page.click("#tab-mental-models")
    page.wait_for_url(f"**/#/memory/{bank}/mental-models")
    page.wait_for_function(
        "() => /No mental models yet/.test("
        "document.getElementById('mental-model-status').textContent)"
    )

    # Create: its first refresh runs at once and writes the content.
    with reflect_script(server, {"replies": [{"text": first_answer}]}):
        page.fill("#mm-name", "Alice's pets")
        page.fill("#mm-query", "What pets does Alice have?")
        page.click("#mm-create")
        page.wait_for_selector(
            '#mental-model-list li.mental-model .run-progress[data-phase="completed"]',
            timeout=15_000,
        )
    model = page.locator("#mental-model-list li.mental-model").first
    model_id = model.get_attribute("data-id")
    assert model_id
    assert model.locator(".mm-content").text_content() == first_answer
    assert model.locator(".mm-name").text_content() == "Alice's pets"
    assert "What pets does Alice have?" in (model.locator(".mm-query").text_content() or "")
    model_path = f"/v1/default/banks/{bank}/mental-models/{model_id}"
    assert get(server, model_path)["content"] == first_answer

    # Something new in the model's scope: a refresh of unchanged sources would be skipped
    # without asking the model (heed.mental_models.fingerprint).
    with client(server) as c:
        c.post(
            f"/v1/default/banks/{bank}/memories",
            json={"items": [{"content": "Alice adopted a second cat, Tofu, in May."}]},
        ).raise_for_status()

    # Refresh while the model takes a minute: the journal shows live, Stop cancels the run.
    with reflect_script(server, {"replies": [{"text": "Never written.", "latency": 60}]}) as slow:
        model.locator('button[aria-label="refresh Alice\'s pets"]').click()
        progress = model.locator(".run-progress")
        page.wait_for_selector(
            f'li.mental-model[data-id="{model_id}"] .run-progress[data-phase="running"]'
        )
        page.wait_for_selector(
            f'li.mental-model[data-id="{model_id}"] .run-steps li[data-type="progress"]'
            ':has-text("reflecting (0/2)")'
        )
        wait_for(lambda: slow.requests, seconds=15)  # the model call is in progress
        assert model.locator(".mm-refresh").is_disabled()
        assert "Refresh: reflecting (0/2)" in (progress.locator(".run-state").text_content() or "")
        run_id = progress.get_attribute("data-run-id")
        assert run_id
        wait_for(lambda: [u for u in streams.open_now() if run_id in u], page=page)

        # A hidden browser tab holds no stream; shown again, it follows the run again.
        set_hidden(page, True)
        wait_for(lambda: not streams.open_now(), seconds=5, page=page)
        set_hidden(page, False)
        wait_for(lambda: [u for u in streams.open_now() if run_id in u], seconds=5, page=page)
        page.wait_for_selector(
            f'li.mental-model[data-id="{model_id}"] .run-steps li[data-type="progress"]'
        )
        assert progress.get_attribute("data-phase") == "running"
        assert get(server, f"/v1/runs/{run_id}")["phase"] == "running"

        started = time.monotonic()
        progress.locator('button[aria-label="stop the refresh"]').click()
        page.wait_for_selector(
            f'li.mental-model[data-id="{model_id}"] .run-progress[data-phase="cancelled"]',
            timeout=10_000,
        )
        assert time.monotonic() - started < 5, "the stop waited for the model"
    state = progress.locator(".run-state").text_content() or ""
    assert "Refresh stopped" in state and "The content is unchanged." in state, state
    assert get(server, f"/v1/runs/{run_id}")["phase"] == "cancelled"
    assert get(server, model_path)["content"] == first_answer
    assert model.locator(".mm-content").text_content() == first_answer
    assert model.locator(".mm-refresh").is_enabled()

    # A second refresh completes and the new content appears.
    second_answer = "Alice has two cats, Miso and Tofu."
    with reflect_script(server, {"token_delay": 0.01, "replies": [{"text": second_answer}]}):
        model.locator(".mm-refresh").click()
        page.wait_for_function(
            "([id, text]) => document.querySelector("
            '`li.mental-model[data-id="${id}"] .mm-content`)?.textContent === text',
            arg=[model_id, second_answer],
            timeout=15_000,
        )
    assert progress.get_attribute("data-phase") == "completed"
    assert progress.locator(".run-state").text_content() == "Refreshed: new content written."
    assert get(server, model_path)["content"] == second_answer

    # History: the content it replaced, newest first.
    model.locator("details.mm-history summary").click()
    page.wait_for_selector(f'li.mental-model[data-id="{model_id}"] li.version')
    assert model.locator("li.version .fact-text").first.text_content() == first_answer

    # A reload attaches to nothing (no refresh is running) and shows the content.
    page.reload()
    page.wait_for_selector(f'li.mental-model[data-id="{model_id}"]')
    assert page.text_content(f'li.mental-model[data-id="{model_id}"] .mm-content') == second_answer
    assert page.is_hidden(f'li.mental-model[data-id="{model_id}"] .run-progress')


def test_directives_create_toggle_delete_and_the_tab_keyboard(
    page: Any, server: LiveServer
) -> None:
    bank = "learn-dir"
    new_bank(server, bank)
    page.goto(f"{server.url}/#/memory/{bank}")
    # Keyboard: the tabs are a tablist; arrows move between them, the route follows.
    page.wait_for_selector('#tab-memories[aria-selected="true"]')
    page.focus("#tab-memories")
    page.keyboard.press("End")
    page.wait_for_selector('#tab-directives[aria-selected="true"]')
    assert page.evaluate("() => document.activeElement.id") == "tab-directives"
    page.wait_for_url(f"**/#/memory/{bank}/directives")
    page.keyboard.press("ArrowLeft")
    page.wait_for_selector('#tab-mental-models[aria-selected="true"]')
    page.keyboard.press("ArrowRight")
    page.wait_for_selector('#tab-directives[aria-selected="true"]')
    assert page.get_attribute("#panel-directives", "aria-labelledby") == "tab-directives"
    page.wait_for_function(
        "() => /No directives yet/.test(document.getElementById('directive-status').textContent)"
    )

    page.fill("#directive-name", "Be brief")
    page.fill("#directive-content", "Answer in at most three sentences.")
    page.fill("#directive-priority", "5")
    page.click("#directive-create")
    page.wait_for_selector('#directive-list li.directive[data-active="true"]')
    page.fill("#directive-name", "Metric units")
    page.fill("#directive-content", "Give distances in kilometres.")
    page.fill("#directive-priority", "1")
    page.fill("#directive-tags", "travel, work,")
    page.press("#directive-content", "Tab")
    page.click("#directive-create")
    page.wait_for_function("() => document.querySelectorAll('#directive-list li').length === 2")
    names = page.locator("#directive-list .directive-name").all_text_contents()
    assert names == ["Be brief", "Metric units"]  # the order they are said: priority first
    assert page.text_content("#directive-count") == "2 directives, 2 active"
    listed = {d["name"]: d for d in get(server, f"/v1/default/banks/{bank}/directives")["items"]}
    assert listed["Metric units"]["tags"] == ["travel", "work"]
    assert listed["Be brief"]["priority"] == 5 and listed["Be brief"]["tags"] in (None, [])

    # Switch one off: stored, shown, and the list of active ones no longer has it.
    brief_id = listed["Be brief"]["id"]
    row = f'#directive-list li.directive[data-id="{brief_id}"]'
    page.uncheck('input[aria-label="active: Be brief"]')
    page.wait_for_selector(f'{row}[data-active="false"]')
    assert get(server, f"/v1/default/banks/{bank}/directives/{brief_id}")["is_active"] is False
    active = get(server, f"/v1/default/banks/{bank}/directives", active_only="true")["items"]
    assert [d["name"] for d in active] == ["Metric units"]
    assert page.text_content("#directive-count") == "2 directives, 1 active"
    page.reload()
    page.wait_for_selector(f'{row}[data-active="false"]')
    assert not page.is_checked('input[aria-label="active: Be brief"]')
    page.check('input[aria-label="active: Be brief"]')
    page.wait_for_selector(f'{row}[data-active="true"]')
    assert get(server, f"/v1/default/banks/{bank}/directives/{brief_id}")["is_active"] is True

    # Delete asks first.
    page.click('button[aria-label="delete Metric units"]')
    page.click("#directive-list .ask-first .confirm-yes")
    page.wait_for_function("() => document.querySelectorAll('#directive-list li').length === 1")
    remaining = get(server, f"/v1/default/banks/{bank}/directives", active_only="false")
    assert [d["name"] for d in remaining["items"]] == ["Be brief"]
    assert "Deleted" in (page.text_content("#directive-status") or "")


PURE = """async () => {
    const { describeEvent, describeProgress } = await import('/ui/progress.js');
    const { consolidationSummary } = await import('/ui/observations.js');
    const { refreshSummary } = await import('/ui/mental_models.js');
    const { parseTags } = await import('/ui/directives.js');
    const { bankHash } = await import('/ui/memory.js');
    return {
        staged: describeProgress({ stage: 'writing', processed: 1, total: 2 }),
        round: describeProgress({ rounds: 2, facts_consolidated: 3, observations_created: 1,
                                  observations_merged: 1, facts_failed: 0 }),
        call: describeEvent({ type: 'tool_call', data: { name: 'recall',
                                                        arguments: { query: 'cats' } } }),
        result: describeEvent({ type: 'tool_result', data: { output: { memories: [1] } } }),
        stopped: describeEvent({ type: 'cancelled', data: { reason: 'cancelled by client' } }),
        unknown: describeEvent({ type: 'gap', data: {} }),
        nothing: consolidationSummary({ rounds: 0, facts_consolidated: 0 }),
        merged: consolidationSummary({ rounds: 1, facts_consolidated: 2,
                                       observations_merged: 1, facts_failed: 1 }),
        written: refreshSummary({ outcome: 'content_written' }),
        empty: refreshSummary({ outcome: 'refresh_failed_empty_candidate' }),
        tags: parseTags(' a, b ,, a,c '),
        noTags: parseTags(' , '),
        hashes: [bankHash('b 1'), bankHash('b 1', 'memories'), bankHash('b', 'mental-models')],
    };
}"""


def test_the_learning_modules_pure_pieces(page: Any, server: LiveServer) -> None:
    page.goto(server.url + "/")
    got = page.evaluate(PURE)
    assert got == {
        "staged": "writing (1/2)",
        "round": "round 2: 3 facts consolidated, 1 created, 1 merged",
        "call": "recall “cats”",
        "result": "→ 1 memory",
        "stopped": "stopped: cancelled by client",
        "unknown": None,
        "nothing": "Consolidation completed: no memory was waiting.",
        "merged": "Consolidation completed: 2 facts consolidated, 1 observation merged; "
        "1 fact failed.",
        "written": "Refreshed: new content written.",
        "empty": "Refresh gave no answer: the content is unchanged.",
        "tags": ["a", "b", "c"],
        "noTags": None,
        "hashes": ["#/memory/b%201", "#/memory/b%201", "#/memory/b/mental-models"],
    }
