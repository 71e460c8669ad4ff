"""Reflect: ``POST /v1/default/banks/{bank_id}/reflect`` (see :mod:`heed.reflect`).

Wire-compatible with ``hindsight-client``: ``query``, ``budget``, ``max_tokens``,
``context``, ``include.facts`` (adds ``based_on``), ``include.tool_calls``
(adds ``trace``; ``include.tool_calls.output: false`` drops tool outputs),
``response_schema`` (adds ``structured_output`` / ``structured_output_error``);
``usage`` is always returned.

The reflect runs under the request's token: a client that leaves stops it (its
current model call within milliseconds, the loop before its next iteration),
and the request is logged as 499.

``stream: true`` answers ``text/event-stream`` instead: ``tool_call``,
``tool_result``, ``text_delta`` (model text as it arrives, with its
``iteration``), ``answer`` (the final text), then ``done`` whose data is the
whole response object as above, or ``error`` (``detail``, ``status``) if the
reflect failed after the stream began. Errors found before any work (unknown
bank, invalid ``response_schema``) are plain JSON errors, as without ``stream``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.responses import Response, StreamingResponse

from heed.api.input_rules import IdPath
from heed.api.openapi import UPSTREAM, event_stream
from heed.api.sse import named_frame
from heed.api.wire import reflect as wire
from heed.api.wire.memory_convert import engine_of
from heed.errors import HeedError
from heed.memory.models import FACT_TYPES, Bank, InvalidInput, StoredUnit
from heed.reflect import ReflectAgent, ReflectOutcome, ReflectRequest, check_schema
from heed.reflect.service import ReflectService
from heed.runtime import OperationCancelled, run_in_thread, settle

__all__ = ["router"]

router = APIRouter(prefix="/v1/default/banks/{bank_id}", tags=["reflect"])


def _service(request: Request) -> ReflectService:
    service: ReflectService = request.app.state.services.reflect
    return service


async def _engine_request(body: wire.ReflectRequest) -> ReflectRequest:
    """Validate the wire body (400 naming the field) and build the engine request."""
    if not body.query.strip():
        raise InvalidInput("query is empty")
    if body.tag_groups:
        raise InvalidInput("tag_groups is not supported by heed; use tags and tags_match")
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
        max_tokens=body.max_tokens,
        response_schema=body.response_schema,
        tags=body.tags,
        tags_match=body.tags_match or "any",
        include_tool_output=tool_calls.output if tool_calls is not None else True,
    )


def _fact(unit: StoredUnit) -> wire.ReflectFact:
    return wire.ReflectFact(
        id=unit.id,
        text=unit.text,
        type=unit.fact_type,
        context=unit.context,
        occurred_start=unit.occurred_start,
        occurred_end=unit.occurred_end,
        mentioned_at=unit.mentioned_at,
        document_id=unit.document_id,
        chunk_id=unit.chunk_id,
        tags=unit.tags,
        metadata=unit.metadata,
    )


def _response(outcome: ReflectOutcome, body: wire.ReflectRequest) -> dict[str, Any]:
    include = body.include
    usage = outcome.usage
    response = wire.ReflectResponse(
        text=outcome.text,
        based_on=(
            wire.ReflectBasedOn(memories=[_fact(u) for u in outcome.based_on])
            if include is not None and include.facts is not None
            else None
        ),
        structured_output=outcome.structured_output,
        structured_output_error=outcome.structured_output_error,
        usage=wire.TokenUsage(
            input_tokens=usage.prompt_tokens,
            output_tokens=usage.completion_tokens,
            total_tokens=usage.total_tokens,
        ),
        trace=(
            wire.ReflectTrace(
                tool_calls=[
                    wire.ReflectToolCall(
                        tool=t.tool,
                        input=t.input,
                        output=t.output,
                        duration_ms=t.duration_ms,
                        iteration=t.iteration,
                    )
                    for t in outcome.tool_calls
                ],
                llm_calls=[
                    wire.ReflectLLMCall(scope=c.scope, duration_ms=c.duration_ms)
                    for c in outcome.llm_calls
                ],
            )
            if include is not None and include.tool_calls is not None
            else None
        ),
    )
    return response.model_dump(mode="json")


@router.post(
    "/reflect",
    response_model=wire.ReflectResponse,
    responses={
        **event_stream(
            "The answer; with `stream: true`, server-sent events instead: `tool_call`, "
            "`tool_result`, `text_delta`, `answer`, then `done` (data: the whole response "
            "object) or `error` (data: `detail` and `status`)."
        ),
        **UPSTREAM,
    },
)
async def reflect(bank_id: IdPath, body: wire.ReflectRequest, request: Request) -> Response:
    """Answer *query* from the bank's memories with the reflect agent loop."""
    engine_request = await _engine_request(body)
    bank = await engine_of(request).get_bank(bank_id)
    agent = _service(request).agent()
    if body.stream:
        return StreamingResponse(
            _stream(agent, bank, engine_request, body),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    outcome = await agent.run(bank, engine_request)
    return JSONResponse(_response(outcome, body))


async def _stream(
    agent: ReflectAgent, bank: Bank, engine_request: ReflectRequest, body: wire.ReflectRequest
) -> AsyncIterator[str]:
    """The SSE frames of one streamed reflect (see the module docstring)."""
    frames: asyncio.Queue[str] = asyncio.Queue()

    async def listener(event: str, data: dict[str, Any]) -> None:
        await frames.put(named_frame(event, data))

    # The task inherits the request context, so the client leaving cancels its token.
    work = asyncio.create_task(agent.run(bank, engine_request, listener), name="heed-reflect")
    try:
        while True:
            get = asyncio.ensure_future(frames.get())
            await asyncio.wait({get, work}, return_when=asyncio.FIRST_COMPLETED)
            if get.done():
                yield get.result()
                continue
            get.cancel()
            while not frames.empty():
                yield frames.get_nowait()
            break
        try:
            outcome = work.result()
        except OperationCancelled:
            raise  # the client left: nothing to say, and nobody to say it to
        except HeedError as exc:
            yield named_frame("error", {"detail": exc.message, "status": exc.status_code})
            return
        yield named_frame("done", _response(outcome, body))
    finally:
        await settle(work)  # a stream closed early stops the work, and waits for it
