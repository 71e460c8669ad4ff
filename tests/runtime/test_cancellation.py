"""CancellationToken semantics."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from heed.runtime import (
    DEADLINE_EXCEEDED,
    CancellationToken,
    OperationCancelled,
    RequestContext,
    current_context,
    detached,
    raise_if_cancelled,
    use_context,
)


def test_cancel_is_idempotent_and_first_reason_wins() -> None:
    token = CancellationToken()
    assert not token.cancelled and token.reason is None
    assert token.cancel("first") is True
    assert token.cancel("second") is False
    assert token.cancelled and token.reason == "first"
    with pytest.raises(OperationCancelled) as caught:
        token.raise_if_cancelled()
    assert caught.value.reason == "first"
    assert isinstance(caught.value, Exception)


def test_callbacks_run_once_and_at_once_when_already_cancelled() -> None:
    token = CancellationToken()
    seen: list[str] = []
    token.on_cancel(seen.append)
    removed = token.on_cancel(lambda r: seen.append("removed " + r))
    removed.remove()
    token.cancel("stop")
    token.cancel("again")
    assert seen == ["stop"]
    late: list[str] = []
    token.on_cancel(late.append)
    assert late == ["stop"]


def test_children_follow_parent_never_the_reverse() -> None:
    parent = CancellationToken()
    child = parent.child()
    grandchild = child.child()
    sibling = parent.child()
    sibling.cancel("only me")
    assert not parent.cancelled and not child.cancelled
    parent.cancel("parent gone")
    assert child.reason == "parent gone" and grandchild.reason == "parent gone"


def test_child_of_cancelled_parent_is_cancelled() -> None:
    parent = CancellationToken()
    parent.cancel("early")
    assert parent.child().reason == "early"


def test_deadline_cancels_without_an_event_loop() -> None:
    token = CancellationToken().with_deadline(0.05)
    assert not token.cancelled
    assert token.wait_sync(5) is True
    assert token.reason == DEADLINE_EXCEEDED


async def test_deadline_cancels_inside_an_event_loop_and_fires_callbacks() -> None:
    token = CancellationToken().with_deadline(0.05)
    fired = asyncio.Event()
    loop = asyncio.get_running_loop()
    token.on_cancel(lambda _r: loop.call_soon_threadsafe(fired.set))
    await asyncio.wait_for(fired.wait(), 5)
    assert token.reason == DEADLINE_EXCEEDED


def test_earlier_deadline_wins() -> None:
    token = CancellationToken(deadline=time.monotonic() + 60)
    token.set_deadline(time.monotonic() + 0.01)
    token.set_deadline(time.monotonic() + 120)
    assert token.wait_sync(5)


async def test_wait_returns_reason_when_cancelled_from_another_thread() -> None:
    token = CancellationToken()
    threading.Timer(0.05, token.cancel, args=("from thread",)).start()
    assert await asyncio.wait_for(token.wait(), 5) == "from thread"


async def test_wait_returns_at_once_when_already_cancelled() -> None:
    token = CancellationToken()
    token.cancel("done")
    assert await token.wait() == "done"


def test_concurrent_cancel_from_many_threads_has_one_winner() -> None:
    for _ in range(20):
        token = CancellationToken()
        calls: list[str] = []
        token.on_cancel(calls.append)
        winners: list[bool] = []
        barrier = threading.Barrier(8)

        def race(
            i: int,
            token: CancellationToken = token,
            winners: list[bool] = winners,
            barrier: threading.Barrier = barrier,
        ) -> None:
            barrier.wait()
            winners.append(token.cancel(f"thread {i}"))

        threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert winners.count(True) == 1
        assert len(calls) == 1 and calls[0] == token.reason


def test_checkpoint_is_a_no_op_without_context() -> None:
    raise_if_cancelled()  # internal callers with no request behave unchanged
    assert current_context().tenant == "default"


def test_context_checkpoint_and_detached_token() -> None:
    ctx = RequestContext(tenant="acme")
    with use_context(ctx):
        free = detached()
        ctx.token.cancel("client disconnected")
        with pytest.raises(OperationCancelled):
            raise_if_cancelled()
    assert free.tenant == "acme"
    assert not free.token.cancelled
    with use_context(free):
        raise_if_cancelled()


def test_with_timeout_makes_a_child_that_expires() -> None:
    ctx = RequestContext()
    short = ctx.with_timeout(0.02)
    assert short.token.wait_sync(5)
    assert short.token.reason == DEADLINE_EXCEEDED
    assert not ctx.token.cancelled
