"""One MCP tool call: whose it is, the token that stops it, and how its errors read.

A tool call runs inside the MCP SDK, not inside a heed route, so nothing of the HTTP
request's context reaches it by itself: on the handshake-era transport the handler runs
in the MCP session's task group, whose contextvars are those of whichever request opened
the session. So every call builds its own context explicitly (:func:`tool_call`):

- **Identity** comes from the HTTP request that carried the call, which the lifecycle
  middleware authenticated (``scope["state"]["request_context"]``: the bearer key's
  tenant), or, over stdio, from the tenant ``heed mcp`` was started for. Never from the
  session: a session id is not a credential.
- **The token** is a child of that request's token, so the client closing the stream (the
  2026-07-28 transport's cancel) stops the work like any HTTP disconnect. When the SDK
  cancels the handler (a ``notifications/cancelled`` from the client, or the stream
  closing), the ``asyncio.CancelledError`` trips the token with :data:`MCP_CANCELLED`;
  :func:`heed.runtime.run_in_thread` has by then already waited for its thread, so the
  call returns only once its CPU work stopped, and its lane slot with it.
- **Errors** a caller can act on (:class:`~heed.errors.HeedError`: an unknown bank, bad
  input, a busy session) become :class:`ToolError` results naming the problem; anything
  else is the SDK's generic "error executing tool", logged with its traceback.

Work that is a run (reflect, a chat turn, a mental model's refresh) is started with
:func:`start_run`, so a cancel that comes while it is being submitted cannot leave it
running unseen, and followed with :func:`follow_run`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Final, Literal, TypeVar

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError

from heed.errors import HeedError
from heed.runs.events import EventType
from heed.runs.manager import RunManager
from heed.runs.model import Run, RunEvent
from heed.runtime import OperationCancelled, RequestContext, current_context, settle, use_context

__all__ = [
    "MCP_CANCELLED",
    "STOP_WAIT_SECONDS",
    "DisconnectPolicy",
    "Progress",
    "follow_run",
    "identity_of",
    "progress_reporter",
    "start_run",
    "tool_call",
]

T = TypeVar("T")

#: The cancel reason of work whose MCP call was cancelled (or whose stream closed).
MCP_CANCELLED: Final = "mcp call cancelled"
#: How long a call whose run ended waits for the run's worker to stop (the HTTP cancel's
#: default); a run still not terminal then is reported as it is.
STOP_WAIT_SECONDS: Final = 30.0

DisconnectPolicy = Literal["cancel", "continue"]

#: ``report(progress, total, message)``: queue a progress notification (never blocks).
Progress = Callable[[float, float | None, str], None]


def identity_of(ctx: Context[Any], fallback: RequestContext | None) -> RequestContext:
    """The authenticated context of the HTTP request that carried this call, or
    *fallback* (stdio). Raises :class:`ToolError` when there is neither."""
    request = ctx.request_context.request
    scope = getattr(request, "scope", None)
    if isinstance(scope, dict):
        found = scope.get("state", {}).get("request_context")
        if isinstance(found, RequestContext):
            return found
    if fallback is not None:
        return fallback
    raise ToolError("this call carries no identity: call heed's MCP endpoint over HTTP or stdio")


@asynccontextmanager
async def tool_call(base: RequestContext) -> AsyncIterator[RequestContext]:
    """Run the ``async with`` body as one tool call of *base*'s identity (see the module
    docstring); yields the call's context, which is also the active one.

    Raises :class:`ToolError` for a :class:`~heed.errors.HeedError` or a cancellation the
    body raised (the message names it); re-raises ``asyncio.CancelledError`` after
    tripping the call's token.
    """
    token = base.token.child()
    call = base.with_token(token)
    try:
        with use_context(call):
            yield call
    except asyncio.CancelledError:
        token.cancel(MCP_CANCELLED)
        raise
    except OperationCancelled as exc:
        raise ToolError(f"cancelled: {exc.reason}") from exc
    except HeedError as exc:
        raise ToolError(exc.message) from exc
    finally:
        token.release_parent()


@asynccontextmanager
async def progress_reporter(ctx: Context[Any]) -> AsyncIterator[Progress]:
    """A non-blocking ``report(progress, total, message)`` for code that reports from
    synchronous callbacks (the engine's retain); notifications go out in order from one
    task, which is drained on a normal exit and stopped on an error or a cancel.

    A no-op on the wire when the client sent no progress token (the SDK drops it).
    """
    queue: asyncio.Queue[tuple[float, float | None, str] | None] = asyncio.Queue()

    async def pump() -> None:
        while (item := await queue.get()) is not None:
            await ctx.report_progress(*item)

    sender = asyncio.create_task(pump(), name="heed-mcp-progress")
    try:
        yield lambda progress, total, message: queue.put_nowait((progress, total, message))
    except BaseException:
        await settle(sender)
        raise
    queue.put_nowait(None)
    await settle(sender, stop=lambda: None)


async def start_run(
    manager: RunManager,
    submit: Awaitable[T],
    run_of: Callable[[T], Run | None],
    *,
    on_disconnect: DisconnectPolicy = "cancel",
) -> T:
    """Await *submit*, which starts a run, and return what it returned.

    A run is written before its submit returns, so a call cancelled (the handler's
    ``CancelledError``) while *submit* is under way would leave a run nobody follows. Here
    *submit* always finishes; then, with ``on_disconnect="cancel"``, the run it started
    (``run_of(result)``; ``None``: it started none of its own, say a busy run it joined) is
    cancelled and waited for before the ``CancelledError`` is re-raised.
    """
    task = asyncio.ensure_future(submit)
    try:
        await settle(task, stop=lambda: None)
    except asyncio.CancelledError:
        if on_disconnect == "cancel" and not task.cancelled() and task.exception() is None:
            run = run_of(task.result())
            if run is not None:
                await _cancel_and_wait(manager, run.id)
        raise
    return task.result()


async def follow_run(
    manager: RunManager,
    run_id: str,
    report: Progress,
    *,
    on_disconnect: DisconnectPolicy = "cancel",
    heartbeat: float = 10.0,
) -> Run:
    """Follow run *run_id*'s journal to its end, reporting its steps; returns the ended run,
    once it is terminal (its worker stopped; at most :data:`STOP_WAIT_SECONDS`).

    The first report names the run, so a client that loses the call can find it over
    HTTP (``GET /v1/runs/{id}``, ``/stream``, ``/cancel``). If the call is cancelled (the
    handler's ``CancelledError``, or the call token: its stream closed), then with
    ``on_disconnect="cancel"`` the run is cancelled and this returns, or re-raises, only
    once its worker stopped (and released its lane slot); with ``"continue"`` the run
    goes on for a later reader.
    """
    token = current_context().token
    report(0, None, f"run {run_id} started")
    steps = 0
    try:
        async for item in manager.journal.follow(run_id, 0, heartbeat=heartbeat, token=token):
            if not isinstance(item, list):
                continue  # a heartbeat, or a gap: only the steps matter here
            for event in item:
                if (message := _step(event)) is not None:
                    steps += 1
                    report(steps, None, message)
    except asyncio.CancelledError:
        if on_disconnect == "cancel":
            await _cancel_and_wait(manager, run_id)
        raise
    if token.cancelled:
        if on_disconnect == "cancel":
            await _cancel_and_wait(manager, run_id)
        raise OperationCancelled(token.reason or MCP_CANCELLED)
    # The journal ends at the run's terminal event, which a cancel writes when the run
    # becomes ``cancelling``, before its worker stopped (at once here, or at its next lease
    # renewal when the cancel came from another process): wait for the worker, as
    # ``POST /v1/runs/{id}/cancel?wait=true`` does.
    return await manager.wait_stopped(run_id, STOP_WAIT_SECONDS)


def _step(event: RunEvent) -> str | None:
    """The progress message of a journal event, or ``None`` for one not worth a report
    (text deltas: the answer comes whole in the result)."""
    data = event.data
    if event.type == EventType.TOOL_CALL:
        return f"calling {data.get('name')}"
    if event.type == EventType.TOOL_RESULT:
        return f"{data.get('name')} {'returned' if data.get('ok', True) else 'failed'}"
    if event.type == EventType.MESSAGE:
        return "answer written"
    if event.type == EventType.PROGRESS and data.get("stage"):
        return str(data["stage"])  # a mental model's refresh: reflecting, writing, done
    return None


async def _cancel_and_wait(manager: RunManager, run_id: str) -> None:
    """Cancel the run and wait until its worker stopped, even while this task is being
    cancelled again (the SDK's cancel scope re-delivers its cancellation at every await)."""
    cancel = asyncio.ensure_future(manager.cancel(run_id, MCP_CANCELLED, wait=True))
    await settle(cancel, stop=lambda: None)
