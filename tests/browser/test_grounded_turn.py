"""A grounded turn in a real browser: the turn's own recall shows as a tool step before the answer.

In a session bound to a memory bank, every turn recalls from the bank before the model is asked;
the recall is a ``recall`` tool step (journal ``tool_call`` / ``tool_result``, and in the stored
transcript an assistant message with the call followed by its tool message). The page draws it as
one compact, expandable tool line, live and again after a reload.
"""

from __future__ import annotations

from typing import Any

from tests.browser.helpers import assistant_text, client, new_session, open_chat, send, set_script
from tests.support import LiveServer

BANK = "alice"
FACTS = [
    "Alice adopted a grey cat named Pixel in March 2024.",
    "Alice works as a nurse at St. Mary's hospital in Leeds.",
    "Alice is allergic to peanuts.",
]
QUESTION = "What is the name of Alice's cat?"
ANSWER = "Her cat is called Pixel."
#: The tool name the turn's own recall must be drawn under.
TOOL_NAME = "recall"

#: The body of the last turn's assistant part, in DOM order: each child's kind and its text.
TURN_BODY = """() => {
    const turn = [...document.querySelectorAll('#transcript > li.turn')].at(-1);
    if (!turn) return null;
    const body = turn.querySelector('.msg.assistant .msg-body');
    return [...body.children].map((el) => ({
        kind: el.matches('details.tool') ? 'tool' : el.matches('.text') ? 'text' : el.className,
        name: el.querySelector('.tool-name')?.textContent ?? null,
        text: el.textContent,
    }));
}"""


#: Records what the turn showed when its first answer text appeared (the model's first token).
WATCH_FIRST_TEXT = """() => {
    window.__atFirstText = null;
    const transcript = document.getElementById('transcript');
    const observer = new MutationObserver(() => {
        const turn = [...transcript.querySelectorAll(':scope > li.turn')].at(-1);
        if (!turn?.querySelector('.msg.assistant .text')) return;
        window.__atFirstText = [...turn.querySelectorAll('details.tool')].map((el) => ({
            name: el.querySelector('.tool-name').textContent,
            result: el.querySelector('.tool-result-summary').textContent,
        }));
        observer.disconnect();
    });
    observer.observe(transcript, { childList: true, subtree: true });
}"""


def _seed_bank(server: LiveServer) -> None:
    with client(server) as c:
        c.put(f"/v1/default/banks/{BANK}", json={}).raise_for_status()
        items = [{"content": fact} for fact in FACTS]
        response = c.post(f"/v1/default/banks/{BANK}/memories", json={"items": items})
        response.raise_for_status()
        assert response.json()["units_count"] >= len(FACTS), response.json()


def _wait_completed(page: Any) -> None:
    page.wait_for_selector('#transcript > li.turn[data-phase="completed"]', timeout=20_000)
    page.wait_for_function(
        "(answer) => [...document.querySelectorAll('#transcript > li.turn:last-child "
        ".msg.assistant .text')].map((t) => t.textContent).join('') === answer",
        arg=ANSWER,
        timeout=20_000,
    )


def _assert_recall_step_before_answer(page: Any) -> None:
    """The last turn shows one ``recall`` tool line, its memories include Pixel, then the answer."""
    body: list[dict[str, Any]] = page.evaluate(TURN_BODY)
    kinds = [child["kind"] for child in body]
    assert kinds == ["tool", "text"], body
    tool, text = body
    assert tool["name"] == TOOL_NAME, body
    assert text["text"] == ANSWER
    assert assistant_text(page) == ANSWER

    line = page.locator("#transcript > li.turn").last.locator("details.tool")
    assert line.count() == 1
    assert line.locator(".tool-name").text_content() == TOOL_NAME
    assert QUESTION in (line.locator(".tool-args").text_content() or "")
    summary = line.locator(".tool-result-summary").text_content() or ""
    assert summary not in ("", "…", "done") and not summary.startswith("error"), summary
    # Compact: the result is folded away until the line is expanded.
    detail = line.locator("pre.tool-detail")
    assert line.get_attribute("open") is None
    assert detail.is_hidden()
    line.locator("summary").click()
    detail.wait_for(state="visible", timeout=10_000)
    shown = detail.inner_text()
    assert f"- {FACTS[0]}" in shown, shown
    assert "Pixel" in shown


def test_a_bank_bound_turn_shows_its_recall_before_the_answer_and_after_a_reload(
    page: Any, server: LiveServer
) -> None:
    set_script(server, {"token_delay": 0.05, "replies": [{"text": ANSWER}]})
    _seed_bank(server)
    sid = new_session(server, "grounded", bank_id=BANK)
    open_chat(page, server, sid)
    assert page.text_content("#session-bank") == f"memory bank: {BANK}"

    page.evaluate(WATCH_FIRST_TEXT)
    send(page, QUESTION)
    _wait_completed(page)
    # The recall and its result were drawn before the model's first token.
    seen: list[dict[str, str]] = page.evaluate("() => window.__atFirstText")
    assert [tool["name"] for tool in seen] == [TOOL_NAME], seen
    assert "Pixel" in seen[0]["result"], seen
    assert page.text_content("#transcript > li.turn:last-child .msg.user") == QUESTION
    _assert_recall_step_before_answer(page)

    # The stored transcript holds the step: an assistant tool call, its result, then the answer.
    with client(server) as c:
        messages = c.get(f"/v1/sessions/{sid}").json()["messages"]
    roles = [(m["role"], [t["name"] for t in m.get("tool_calls") or []]) for m in messages]
    assert roles == [("user", []), ("assistant", ["recall"]), ("tool", []), ("assistant", [])]
    assert "Pixel" in messages[2]["content"]

    # Drawn again from the stored transcript, the same step in the same place.
    page.reload()
    page.wait_for_selector("#message-input:not([disabled])", timeout=10_000)
    _wait_completed(page)
    assert page.locator("#transcript > li.turn").count() == 1
    _assert_recall_step_before_answer(page)
