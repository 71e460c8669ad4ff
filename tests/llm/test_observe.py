"""heed.llm.observe: who hears a retry or a failure, and that watching never breaks a call."""

from __future__ import annotations

import asyncio
import logging

import pytest

from heed.llm.observe import (
    LlmObserver,
    add_global_observer,
    current_observers,
    notify_failure,
    notify_retry,
    observing,
    remove_global_observer,
)


def recorder(log: list[str], name: str) -> LlmObserver:
    return LlmObserver(
        on_retry=lambda p, s, r, d: log.append(f"{name} retry {p} {s} {r} {d}"),
        on_failure=lambda p, s, r: log.append(f"{name} failure {p} {s} {r}"),
    )


def test_nested_observers_all_hear_innermost_last_then_globals() -> None:
    log: list[str] = []
    everywhere = recorder(log, "global")
    add_global_observer(everywhere)
    try:
        with observing(recorder(log, "outer")):
            with observing(recorder(log, "inner")):
                notify_retry("openai", 429, "rate_limited", 0.5)
            notify_failure("openai", 503, "upstream_error")
        notify_failure("local", None, "unreachable")
    finally:
        remove_global_observer(everywhere)
    assert log == [
        "outer retry openai 429 rate_limited 0.5",
        "inner retry openai 429 rate_limited 0.5",
        "global retry openai 429 rate_limited 0.5",
        "outer failure openai 503 upstream_error",
        "global failure openai 503 upstream_error",
        "global failure local None unreachable",
    ]
    assert current_observers() == ()
    remove_global_observer(everywhere)  # a second removal is a no-op


def test_an_observer_with_one_callback_is_enough() -> None:
    seen: list[str] = []
    with observing(LlmObserver(on_failure=lambda p, s, r: seen.append(r))):
        notify_retry("openai", 500, "upstream_error", 0.1)
        notify_failure("openai", 500, "upstream_error")
    assert seen == ["upstream_error"]


def test_a_failing_observer_is_logged_and_ignored(caplog: pytest.LogCaptureFixture) -> None:
    heard: list[str] = []

    def explode(*args: object) -> None:
        raise RuntimeError("observer bug")

    caplog.set_level(logging.WARNING, logger="heed.llm")
    with (
        observing(LlmObserver(on_retry=explode, on_failure=explode)),
        observing(recorder(heard, "next")),
    ):
        notify_retry("openai", 503, "upstream_error", 0.2, detail="upstream failed (503)")
        notify_failure("openai", 503, "upstream_error", detail="upstream failed (503)")
    assert len(heard) == 2, "the next observer still heard both"
    messages = [r.getMessage() for r in caplog.records]
    assert any("retrying in 0.20 s" in m and "upstream failed (503)" in m for m in messages)
    assert any("failed (upstream_error" in m for m in messages)
    assert sum("an LLM observer failed" in m for m in messages) == 2


async def test_observers_belong_to_their_context() -> None:
    """A task inherits its creator's observers; a concurrent task does not see them."""
    first: list[str] = []
    second: list[str] = []
    in_block = asyncio.Event()
    done = asyncio.Event()

    async def watched() -> None:
        with observing(recorder(first, "first")):
            in_block.set()
            child = asyncio.create_task(asyncio.sleep(0, result=current_observers()))
            assert len(await child) == 1
            await done.wait()

    async def other() -> None:
        await in_block.wait()
        with observing(recorder(second, "second")):
            notify_failure("openai", None, "unreachable")
        done.set()

    await asyncio.gather(watched(), other())
    assert first == []
    assert second == ["second failure openai None unreachable"]
