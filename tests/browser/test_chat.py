"""The chat page in a real browser: streaming, Stop, reload mid-stream, queue, error states.

The turn provider is the scripted one with per-token delays, so each test knows how
long a reply takes and what its text is.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from tests.browser.helpers import (
    SseWatch,
    assistant_text,
    client,
    new_session,
    open_chat,
    pump,
    run_phase,
    send,
    set_script,
    turn_count,
    wait_for,
    words,
)
from tests.support import LiveServer

RECORD_NOTICES = """() => {
    window.__notices = [];
    const banner = document.getElementById('banner');
    new MutationObserver(() => {
        for (const n of banner.querySelectorAll('.notice')) {
            const text = n.textContent;
            if (window.__notices.at(-1) !== text) window.__notices.push(text);
        }
    }).observe(banner, { childList: true, subtree: true, characterData: true });
}"""


def _sample_until_done(page: Any, timeout: float = 20.0) -> list[str]:
    """Texts of the last turn, sampled until it settles (completed, stopped or failed)."""
    samples: list[str] = []
    deadline = timeout * 1000
    waited = 0
    while waited < deadline:
        samples.append(assistant_text(page))
        phase = page.evaluate(
            "() => document.querySelector('#transcript > li.turn:last-child')?.dataset.phase"
        )
        if phase in ("completed", "cancelled", "failed", "interrupted"):
            samples.append(assistant_text(page))
            return samples
        page.wait_for_timeout(40)
        waited += 40
    raise AssertionError(f"the turn did not settle; last text {samples[-1:]!r}")


def test_send_a_message_and_the_reply_streams(page: Any, server: LiveServer) -> None:
    reply = words(40, "fox")
    set_script(server, {"token_delay": 0.04, "replies": [{"text": reply}]})
    sid = new_session(server, "streaming")
    open_chat(page, server, sid)

    send(page, "tell me about foxes")
    samples = _sample_until_done(page)

    assert samples[-1] == reply
    partial = {s for s in samples if s and s != reply}
    assert len(partial) >= 3, f"the reply did not stream (saw {len(partial)} partial states)"
    assert all(reply.startswith(s) for s in samples), "a partial state was not a prefix"
    assert page.text_content("#transcript .msg.user") == "tell me about foxes"
    assert page.get_attribute("#transcript > li.turn", "data-phase") == "completed"
    assert page.is_hidden("#stop")
    assert page.text_content("#session-state") == "idle"


def test_stop_mid_stream_settles_stopped_and_cancels_the_run(page: Any, server: LiveServer) -> None:
    long_reply = words(200, "long")
    after = words(5, "after")
    set_script(server, {"token_delay": 0.05, "replies": [{"text": long_reply}, {"text": after}]})
    sid = new_session(server, "stop")
    open_chat(page, server, sid)

    send(page, "talk for a long time")
    wait_for(lambda: len(assistant_text(page).split()) >= 10)
    page.click("#stop")
    page.wait_for_selector('#transcript > li.turn[data-phase="cancelled"]', timeout=10_000)

    turn = page.locator("#transcript > li.turn").last
    assert turn.locator(".turn-state").text_content() == "stopped"
    run_id = turn.get_attribute("data-run-id")
    assert run_id
    assert run_phase(server, run_id) in ("cancelling", "cancelled")
    wait_for(lambda: run_phase(server, run_id) == "cancelled")

    stopped_text = assistant_text(page)
    assert stopped_text and long_reply.startswith(stopped_text)
    assert len(stopped_text) < len(long_reply)
    pump(page, 0.5)
    assert assistant_text(page) == stopped_text, "tokens arrived after the stop settled"
    assert page.is_hidden("#stop")
    assert page.is_enabled("#message-input")

    # The input is usable: the next message goes through once the run has unwound.
    send(page, "and now briefly")
    page.wait_for_function(
        "() => document.querySelectorAll('#transcript > li.turn[data-phase=\"completed\"]').length",
        timeout=15_000,
    )
    assert assistant_text(page) == after
    with client(server) as c:
        messages = c.get(f"/v1/sessions/{sid}").json()["messages"]
    cancelled = [m for m in messages if m["role"] == "assistant" and m["status"] == "cancelled"]
    assert len(cancelled) == 1 and long_reply.startswith(cancelled[0]["content"])


def test_reload_mid_stream_shows_the_final_text_exactly_once(page: Any, server: LiveServer) -> None:
    reply = words(80, "para")
    set_script(server, {"token_delay": 0.04, "replies": [{"text": reply}]})
    sid = new_session(server, "reload")
    open_chat(page, server, sid)

    send(page, "a long answer please")
    wait_for(lambda: len(assistant_text(page).split()) >= 15)
    streams = SseWatch(page)
    page.reload()
    page.wait_for_selector("#transcript > li.turn", timeout=10_000)
    # Right after the reload the turn already shows what had been drawn (no blank restart).
    early = assistant_text(page)
    assert len(early.split()) >= 12 and reply.startswith(early)

    samples = _sample_until_done(page)
    final = samples[-1]
    assert final == reply
    assert all(reply.startswith(s) for s in samples)
    assert turn_count(page) == 1
    body = page.inner_text("#transcript")
    assert body.count("para000") == 1 and body.count("para079") == 1

    # It resumed after the last event it had drawn instead of replaying from the start.
    run_streams = [u for u in streams.urls() if "/stream" in u]
    assert run_streams, "no run stream after the reload"
    assert "after=0" not in run_streams[0], run_streams[0]

    # The stored transcript agrees with what the page shows.
    page.reload()
    page.wait_for_selector('#transcript > li.turn[data-phase="completed"]', timeout=10_000)
    assert assistant_text(page) == reply
    assert turn_count(page) == 1


def test_network_loss_mid_stream_resumes_without_doubling(page: Any, server: LiveServer) -> None:
    reply = words(80, "net")
    set_script(server, {"token_delay": 0.04, "replies": [{"text": reply}]})
    sid = new_session(server, "offline")
    open_chat(page, server, sid)

    streams = SseWatch(page)
    send(page, "stream while the network drops")
    wait_for(lambda: len(assistant_text(page).split()) >= 10)
    # Cut the run stream: abort the connection and refuse reconnects for a while.
    page.route("**/v1/runs/*/stream*", lambda route: route.abort("internetdisconnected"))
    page.context.set_offline(True)
    # The browser keeps an open response alive in offline emulation: drop it as a lost network
    # would (the reconnects that follow fail until the network is back).
    page.evaluate("() => window.heed.chat.followers.forEach((follower) => follower.drop())")
    pump(page, 0.3)
    assert "network lost" in page.inner_text("#banner").lower()
    pump(page, 1.5)
    page.context.set_offline(False)
    page.unroute("**/v1/runs/*/stream*")

    samples = _sample_until_done(page, timeout=30)
    assert samples[-1] == reply
    assert page.inner_text("#transcript").count("net000") == 1
    resumed = [u for u in streams.urls() if "/stream" in u][1:]
    assert resumed, "the connection was never cut (the test proves nothing)"
    assert all("after=0" not in u for u in resumed), resumed


def test_messages_typed_while_busy_are_queued_and_survive_a_reload(
    page: Any, server: LiveServer
) -> None:
    first = words(60, "first")
    second = words(4, "second")
    set_script(server, {"token_delay": 0.05, "replies": [{"text": first}, {"text": second}]})
    sid = new_session(server, "queue")
    open_chat(page, server, sid)

    send(page, "start something long")
    wait_for(lambda: assistant_text(page).startswith("first000"))
    assert page.text_content("#send") == "Queue"
    send(page, "queued follow-up")
    page.wait_for_selector("#queue li.queued", timeout=5_000)
    assert "queued follow-up" in page.inner_text("#queue")

    page.reload()
    page.wait_for_selector("#queue li.queued", timeout=5_000)
    assert "queued follow-up" in page.inner_text("#queue")
    stored = page.evaluate(f"() => localStorage.getItem('heed.queue.{sid}')")
    assert stored and json.loads(stored)[0]["text"] == "queued follow-up"

    # When the first turn ends, the queued message is sent and leaves the queue.
    page.wait_for_function(
        "() => document.querySelectorAll('#transcript > li.turn[data-phase=\"completed\"]')"
        ".length === 2",
        timeout=20_000,
    )
    assert page.is_hidden("#queue")
    assert assistant_text(page, 0) == first
    assert assistant_text(page, 1) == second
    assert page.inner_text("#transcript").count("queued follow-up") == 1


def test_error_states_busy_overloaded_network_lost(page: Any, server: LiveServer) -> None:
    reply = words(3, "ok")
    set_script(server, {"token_delay": 0.01, "replies": [{"text": reply}]})
    sid = new_session(server, "errors")
    open_chat(page, server, sid)
    # What the first three POSTs of the turn get: 409, 503 (both with Retry-After), a network
    # failure; later ones reach the server.
    answers: Iterator[tuple[int, str] | None] = iter(
        [(409, "session is busy"), (503, "turn lane full"), None]
    )
    passed = (0, "")

    def fake(route: Any) -> None:
        answer = next(answers, passed)
        if answer is passed:
            route.continue_()
        elif answer is None:
            route.abort("internetdisconnected")
        else:
            status, detail = answer
            route.fulfill(
                status=status,
                headers={"Retry-After": "1", "Content-Type": "application/json"},
                body=json.dumps({"detail": detail}),
            )

    page.route(f"**/v1/sessions/{sid}/turns", fake)
    page.evaluate(RECORD_NOTICES)
    send(page, "hello through the errors")
    page.wait_for_selector("#queue li.queued", timeout=5_000)
    assert "hello through the errors" in page.inner_text("#queue")
    page.wait_for_selector('#transcript > li.turn[data-phase="completed"]', timeout=15_000)
    assert assistant_text(page) == reply
    assert page.is_hidden("#queue")
    assert page.is_hidden("#banner")
    notices = [n.lower() for n in page.evaluate("() => window.__notices")]
    kinds = []
    for needle in ("busy (409)", "overloaded (503)", "network lost"):
        found = [i for i, text in enumerate(notices) if needle in text]
        assert found, f"never showed {needle!r}: {notices}"
        kinds.append(found[0])
    assert kinds == sorted(kinds), notices
    assert any("retrying in 1 s" in text for text in notices)
    assert page.inner_text("#transcript").count("hello through the errors") == 1
