"""The one idiom for broad exception handlers, checked over the whole source tree.

Every ``except Exception`` / ``except BaseException`` / bare ``except`` in
``src/heed`` must either start with ``reraise_cancellation(<name>)``, end in a
bare ``raise``, or follow an ``except OperationCancelled`` clause of the same
``try``. A ``# noqa: BLE001`` with a reason marks the rare handler that
deliberately captures everything (for example to ship an outcome elsewhere).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from heed.runtime import OperationCancelled, RequestContext, retry_async, use_context

SRC = Path(__file__).resolve().parents[1] / "src" / "heed"
BROAD = {"Exception", "BaseException"}


def _names(node: ast.expr | None) -> set[str]:
    if node is None:
        return {"<bare>"}
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Attribute):
        return {node.attr}
    if isinstance(node, ast.Tuple):
        return set().union(*(_names(e) for e in node.elts))
    return set()


def _reraises(handler: ast.ExceptHandler) -> bool:
    """True if the handler re-raises everything (ends in a bare ``raise``) or uses the idiom."""
    last = handler.body[-1]
    if isinstance(last, ast.Raise) and last.exc is None:
        return True
    first = handler.body[0]
    return (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Call)
        and isinstance(first.value.func, ast.Name)
        and first.value.func.id == "reraise_cancellation"
    )


def _violations() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        source = path.read_text()
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.Try):
                continue
            guarded = False
            for handler in node.handlers:
                names = _names(handler.type)
                if "OperationCancelled" in names:
                    guarded = True
                if not (names & (BROAD | {"<bare>"})):
                    continue
                if guarded or _reraises(handler):
                    continue
                if "noqa: BLE001" in lines[handler.lineno - 1]:
                    continue
                found.append(f"{path.relative_to(SRC.parent)}:{handler.lineno}")
    return found


def test_every_broad_handler_reraises_cancellation() -> None:
    assert _violations() == []


async def test_retry_wrapper_does_not_bury_or_retry_cancellation() -> None:
    ctx = RequestContext()
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        ctx.token.cancel("client disconnected")
        ctx.raise_if_cancelled()
        return "unreachable"

    with use_context(ctx), pytest.raises(OperationCancelled) as caught:
        await retry_async(flaky, attempts=5, base_delay=0.01)
    assert calls == 1
    assert caught.value.reason == "client disconnected"


async def test_retry_wrapper_retries_real_failures_then_reraises_them() -> None:
    calls = 0

    async def broken() -> str:
        nonlocal calls
        calls += 1
        raise ConnectionError("upstream down")

    with pytest.raises(ConnectionError):
        await retry_async(broken, attempts=3, base_delay=0.001)
    assert calls == 3


async def test_retry_backoff_wakes_on_cancel() -> None:
    ctx = RequestContext()
    calls = 0

    async def broken() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            ctx.token.cancel("stop")
        raise ConnectionError("down")

    with use_context(ctx), pytest.raises(OperationCancelled):
        await retry_async(broken, attempts=3, base_delay=30)
    assert calls == 1


def _suppresses_cancelled_error(node: ast.AST) -> bool:
    """``with contextlib.suppress(asyncio.CancelledError)`` (or ``suppress(CancelledError)``)."""
    if not isinstance(node, ast.With | ast.AsyncWith):
        return False
    return any(
        isinstance(call, ast.Call)
        and "suppress" in _names(call.func)
        and any("CancelledError" in _names(arg) for arg in call.args)
        for call in (item.context_expr for item in node.items)
    )


def test_no_child_task_is_stopped_by_hand() -> None:
    """A child task is stopped with ``heed.runtime.settle``: the hand-written
    ``task.cancel(); with suppress(CancelledError): await task`` abandons the child when the
    caller is cancelled again, and swallows the caller's own cancellation."""
    found = [
        f"{path.relative_to(SRC.parent)}:{node.lineno}"
        for path in sorted(SRC.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if _suppresses_cancelled_error(node)
    ]
    assert found == [], "use heed.runtime.settle: " + ", ".join(found)
