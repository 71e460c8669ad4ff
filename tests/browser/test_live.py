"""Live behaviour across time and tabs: no attach loop, hidden tabs, several tabs on one session."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.browser.helpers import (
    HIDDEN_POLL_SECONDS,
    SseWatch,
    assistant_text,
    client,
    new_session,
    open_chat,
    provider_swapped,
    pump,
    run_phase,
    send,
    session_status,
    set_hidden,
    set_script,
    wait_for,
    words,
)
from tests.runs.http_support import WedgedProvider
from tests.support import LiveServer

COUNT_MUTATIONS = """() => {
    window.__mutations = 0;
    new MutationObserver((records) => { window.__mutations += records.length; })
        .observe(document.getElementById('transcript'),
                 { childList: true, subtree: true, characterData: true, attributes: true });
}"""


def test_idle_session_with_a_wedged_cancelling_run_does_not_loop(
    page: Any, server: LiveServer
) -> None:
    """The seed's bug: a cancelling run replayed as live made the page attach, read the
    terminal event, resubscribe, forever. Over 10 s: at most two event-stream connections
    and no re-render."""
    wedged = WedgedProvider()
    with provider_swapped(server, wedged):
        sid = new_session(server, "wedged")
        with client(server) as c:
            run_id = c.post(f"/v1/sessions/{sid}/turns", json={"content": "hang"}).json()["run_id"]
            wait_for(wedged.entered.is_set)
            assert c.post(f"/v1/runs/{run_id}/cancel").json()["phase"] == "cancelling"
        status = session_status(server, sid)
        assert status["busy"] is True and status["active_run_id"] is None

        streams = SseWatch(page)
        try:
            open_chat(page, server, sid)
            page.wait_for_selector("#transcript .msg.user", timeout=10_000)
            page.wait_for_function(
                "() => document.getElementById('session-state').textContent === 'busy'",
                timeout=10_000,
            )
            page.evaluate(COUNT_MUTATIONS)
            pump(page, 10.0)

            mutations = page.evaluate("() => window.__mutations")
            assert streams.opened <= 2, streams.urls()
            assert not [u for u in streams.urls() if "/v1/runs/" in u], "attached a cancelling run"
            assert mutations == 0, f"the transcript re-rendered ({mutations} mutations)"
            assert page.is_hidden("#stop")
            assert run_phase(server, run_id) == "cancelling"
        finally:
            wedged.release.set()
        wait_for(lambda: run_phase(server, run_id) == "cancelled")


@pytest.mark.parametrize(
    "wakeup_words",
    [
        pytest.param(80, id="wakeup-longer-than-a-poll"),  # 4 s: caught running, attached live
        pytest.param(2, id="wakeup-between-two-polls"),  # over before a poll: transcript refresh
    ],
)
def test_hidden_tab_holds_no_stream_and_shows_a_wakeup_turn_within_one_poll(
    page: Any, server: LiveServer, wakeup_words: int
) -> None:
    wakeup_reply = words(wakeup_words, "woke")
    set_script(
        server,
        {
            "token_delay": 0.05,
            "replies": [
                {"when": "[wakeup]", "text": wakeup_reply},
                {
                    "tool_calls": [
                        {
                            "name": "start_task",
                            "arguments": {"action": "wait", "seconds": 4, "title": "nap"},
                        }
                    ]
                },
                {"text": "Started a background task."},
            ],
        },
    )
    sid = new_session(server, "hidden")
    streams = SseWatch(page)
    open_chat(page, server, sid)
    send(page, "start a background task")
    page.wait_for_selector('#transcript > li.turn[data-phase="completed"]', timeout=10_000)

    set_hidden(page, True)
    hidden_at = len(streams.requests)
    wait_for(lambda: not streams.open_now(), seconds=2.0, page=page)

    # The server starts the wakeup turn on its own when the task completes; its first act is
    # to store the wakeup message in the transcript.
    def wakeup_started() -> str | None:
        with client(server) as c:
            messages = c.get(f"/v1/sessions/{sid}").json()["messages"]
        woken = [m["run_id"] for m in messages if m.get("source") == "wakeup"]
        return woken[0] if woken else None

    wakeup_run = wait_for(wakeup_started, seconds=15.0, interval=0.02, page=page)
    started = time.monotonic()
    assert not streams.open_now(), "a hidden idle tab held an event stream"
    page.wait_for_selector(f'#transcript > li.turn.wakeup[data-run-id="{wakeup_run}"]')
    shown_after = time.monotonic() - started
    assert shown_after <= HIDDEN_POLL_SECONDS + 2.0, f"wakeup shown after {shown_after:.1f} s"

    page.wait_for_selector(
        f'#transcript > li.turn[data-run-id="{wakeup_run}"][data-phase="completed"]',
        timeout=15_000,
    )
    assert assistant_text(page) == wakeup_reply
    hidden_streams = streams.urls()[hidden_at:]
    assert not [u for u in hidden_streams if u.split("?")[0].endswith("/events")]
    assert all(wakeup_run in u for u in hidden_streams), hidden_streams
    if wakeup_words * 0.05 > HIDDEN_POLL_SECONDS:  # outlives a poll period: attached live
        assert hidden_streams, "the hidden tab never attached to the running wakeup turn"
    wait_for(lambda: not streams.open_now(), seconds=3.0, page=page)

    # Shown again: the channel comes back, and nothing is drawn twice.
    set_hidden(page, False)
    wait_for(
        lambda: any(u.split("?")[0].endswith("/events") for u in streams.open_now()), page=page
    )
    pump(page, 1.0)
    assert page.locator("#transcript > li.turn.wakeup").count() == 1
    assert page.inner_text("#transcript").count("woke000") == 1


def test_two_tabs_see_the_same_tokens(page: Any, server: LiveServer) -> None:
    reply = words(50, "both")
    set_script(server, {"token_delay": 0.04, "replies": [{"text": reply}]})
    sid = new_session(server, "two tabs")
    other = page.context.new_page()
    watch_other = SseWatch(other)
    open_chat(page, server, sid)
    open_chat(other, server, sid)
    wait_for(
        lambda: any(u.split("?")[0].endswith("/events") for u in watch_other.open_now()),
        page=other,
    )
    pump(other, 0.3)

    send(page, "speak to both tabs")
    seen_by_other: list[str] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        seen_by_other.append(assistant_text(other))
        if seen_by_other[-1] == reply:
            break
        other.wait_for_timeout(40)
    page.wait_for_selector('#transcript > li.turn[data-phase="completed"]', timeout=10_000)
    other.wait_for_selector('#transcript > li.turn[data-phase="completed"]', timeout=10_000)

    assert assistant_text(page) == reply
    assert assistant_text(other) == reply
    live = {s for s in seen_by_other if s and s != reply}
    assert len(live) >= 3, "the second tab did not see the tokens live"
    assert all(reply.startswith(s) for s in seen_by_other)
    assert other.inner_text("#transcript").count("speak to both tabs") == 1
    other.close()
