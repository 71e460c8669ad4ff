"""Reflect: ``POST /v1/default/banks/{bank_id}/reflect`` (see :mod:`heed.reflect`).

Wire-compatible with ``hindsight-client``: ``query``, ``budget``, ``max_tokens``,
``context``, ``include.facts`` (adds ``based_on``), ``include.tool_calls``
(adds ``trace``; ``include.tool_calls.output: false`` drops tool outputs),
``response_schema`` (adds ``structured_output`` / ``structured_output_error``);
``usage`` is always returned.

A plain reflect runs under the request's token: a client that leaves stops it (its
current model call within milliseconds, the loop before its next iteration), and the
request is logged as 499.

``stream: true`` (heed's extension) makes the reflect a run (:mod:`heed.reflect.runs`)
and answers ``text/event-stream`` with its journal, exactly as
``GET /v1/runs/{run_id}/stream`` would (:mod:`heed.runs.events` names the events; the
``completed`` event's ``result`` is the response object above). The run id is in the
``X-Heed-Run-Id`` header, so the client can cancel it by id, or resume the stream with
``Last-Event-ID``. ``on_disconnect`` says what a client leaving before the end does:
``cancel`` (default) cancels the run at once, ``continue`` lets it finish for a later
reader. Errors found before any work (unknown bank, invalid ``response_schema``, a
provider that cannot be built) are plain JSON errors, as without ``stream``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from starlette.responses import Response

from heed.api.deps import MemoryDep, ReflectDep, ReflectRunsDep, RunManagerDep, SettingsDep
from heed.api.input_rules import IdPath
from heed.api.openapi import UPSTREAM, event_stream
from heed.api.policies import DisconnectPolicy
from heed.api.routing import HeedRoute
from heed.api.sse import journal_frames, sse_response
from heed.api.tag_query import refuse_tag_groups
from heed.api.wire import reflect as wire
from heed.memory.models import FACT_TYPES, InvalidInput
from heed.reflect import ReflectRequest, check_schema
from heed.reflect.result import ResultShape, reflect_result
from heed.runs.manager import RunManager
from heed.runtime import current_context, run_in_thread

__all__ = ["router"]

router = APIRouter(prefix="/v1/default/banks/{bank_id}", tags=["reflect"], route_class=HeedRoute)


async def _engine_request(body: wire.ReflectRequest) -> ReflectRequest:
    """Validate the wire body (400 naming the field) and build the engine request."""
    if not body.query.strip():
        raise InvalidInput("query is empty")
    refuse_tag_groups(body.tag_groups)
    for name, why in wire.NOT_IMPLEMENTED.items():
        if getattr(body, name) is not None:
            raise InvalidInput(f"{name} is not implemented by heed: {why}")
    if body.fact_types:
        unknown = [t for t in body.fact_types if t not in FACT_TYPES]
        if unknown:
            raise InvalidInput(
                f"unknown fact type(s) {', '.join(map(repr, unknown))}: use {', '.join(FACT_TYPES)}"
            )
    if body.response_schema is not None:
        await run_in_thread(check_schema, body.response_schema)
    tool_calls = body.include.tool_calls if body.include else None
    return ReflectRequest(
        query=body.query,
        budget=body.budget or "low",
        context=body.context,
        apply_all_directives=bool(body.apply_all_directives),
        max_tokens=body.max_tokens,
        response_schema=body.response_schema,
        tags=body.tags,
        tags_match=body.tags_match or "any",
        include_tool_output=tool_calls.output if tool_calls is not None else True,
        exclude_mental_models=bool(body.exclude_mental_models),
        exclude_mental_model_ids=body.exclude_mental_model_ids,
        fact_types=body.fact_types,
    )


def _shape(body: wire.ReflectRequest) -> ResultShape:
    include = body.include
    return ResultShape(
        facts=include is not None and include.facts is not None,
        trace=include is not None and include.tool_calls is not None,
    )


@router.post(
    "/reflect",
    response_model=wire.ReflectResponse,
    responses={
        **event_stream(
            "With `stream: true`: the journal of the reflect run, as from "
            "`GET /v1/runs/{run_id}/stream` (`id`: its seq, `event`: its type): `started`, "
            "`tool_call`, `tool_result`, `text_delta`, `message` (the answer), then `completed` "
            "(`result`: the whole response object), `failed` (`error`, `status`) or "
            "`cancelled`. The run id is in the `X-Heed-Run-Id` header."
        ),
        **UPSTREAM,
    },
)
async def reflect(
    bank_id: IdPath,
    body: wire.ReflectRequest,
    engine: MemoryDep,
    reflects: ReflectDep,
    reflect_runs: ReflectRunsDep,
    manager: RunManagerDep,
    settings: SettingsDep,
) -> Response:
    """Answer *query* from the bank's memories with the reflect agent loop."""
    engine_request = await _engine_request(body)
    bank = await engine.get_bank(bank_id)
    if body.stream:
        run = await reflect_runs.submit(bank, engine_request, _shape(body))
        heartbeat = settings.stream_heartbeat_seconds
        return _stream(manager, run.id, body.on_disconnect, heartbeat)
    outcome = await reflects.run(bank, engine_request)
    result = wire.ReflectResponse.model_validate(reflect_result(outcome, _shape(body)))
    return JSONResponse(result.model_dump(mode="json"))


def _stream(
    manager: RunManager, run_id: str, on_disconnect: DisconnectPolicy, heartbeat: float
) -> Response:
    """The reflect run's journal as SSE; a client that leaves before the terminal event
    cancels the run unless it asked for ``on_disconnect: "continue"``."""
    token = current_context().token
    journal = journal_frames(manager.journal, run_id, 0, heartbeat=heartbeat, token=token)
    handle = None
    if on_disconnect == "cancel":
        # From now until the journal's end, the request's token owns the run: the client
        # leaving cancels it, even before the stream has started (or at once if it is
        # gone already). The callback may run in any thread: hop to the loop.
        loop = asyncio.get_running_loop()
        handle = token.on_cancel(
            lambda reason: loop.call_soon_threadsafe(manager.cancel_soon, run_id, reason)
        )

    async def frames() -> AsyncIterator[str]:
        try:
            async for frame in journal:
                yield frame
        finally:
            if handle is not None:
                handle.remove()  # ended (or the client left, and the cancel is on its way)

    return sse_response(
        frames(),
        headers={"X-Heed-Run-Id": run_id, "Content-Location": f"/v1/runs/{run_id}/stream"},
    )
