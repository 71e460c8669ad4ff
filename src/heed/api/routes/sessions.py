"""Sessions over HTTP.

- ``POST /v1/sessions`` ``{title?, bank_id?}``: 201 with the session (an unknown bank: 404).
- ``GET /v1/sessions``: ``{"sessions": [...]}`` for the caller's tenant.
- ``GET /v1/sessions/{id}``: the session with its transcript (``messages``).
- ``PATCH /v1/sessions/{id}`` ``{title}``; ``DELETE /v1/sessions/{id}`` (cancels its runs).
- ``POST /v1/sessions/{id}/turns`` ``{content, multitask_strategy}``: 202 with
  ``{run, run_id, stream_url, events_url}``. ``message`` is an alias of ``content``;
  sending neither is a 422 like any missing field. ``reject`` (default) answers 409 naming
  the busy run with ``Retry-After``; ``enqueue`` queues (429 naming
  ``HEED_MAX_QUEUED_TURNS_PER_SESSION`` once the session holds that many queued turns);
  ``interrupt`` cancels the busy run and starts once it has stopped. Unknown or deleted
  session: 404.
- ``GET /v1/sessions/{id}/status``: ``busy`` (lifecycle) and ``active_run_id``
  (attachable runs only), for hidden-tab polling.
- ``GET /v1/sessions/{id}/events``: the session channel (SSE): ``turn_started``
  (replayed on subscribe only for attachable runs), ``session_updated``,
  ``task_complete``; heartbeat comments. Past ``HEED_TENANT_MAX_STREAMS`` open streams of
  the tenant (channels and run streams together): 429.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ConfigDict, Field
from starlette.responses import StreamingResponse

from heed.api.deps import DrainDep, SessionsDep, SettingsDep, StreamSlotsDep
from heed.api.input_rules import Identifier, IdPath, Limit, Name, RequestBody
from heed.api.openapi import BUSY_SESSION, CONFLICT, NOT_FOUND, TOO_MANY, event_stream
from heed.api.routing import HeedRoute
from heed.api.sse import HEARTBEAT_FRAME, named_frame, sse_response
from heed.runs.journal import Heartbeat
from heed.runs.manager import RunConflict
from heed.runtime import current_context, current_token
from heed.sessions.service import stream_url

router = APIRouter(prefix="/v1/sessions", tags=["sessions"], route_class=HeedRoute)


class SessionIn(RequestBody):
    # remember_messages needs a bank: said in the schema, enforced by SessionService.create.
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"properties": {"remember_messages": {"const": False}}},
                {"required": ["bank_id"], "properties": {"bank_id": {"type": "string"}}},
            ]
        },
    )

    title: Name = ""
    bank_id: Identifier | None = None
    remember_messages: bool = Field(
        default=False,
        description="Retain each user message into the session's bank (needs a bank_id).",
    )


class SessionPatch(RequestBody):
    title: Name | None = None
    remember_messages: bool | None = None


class TurnIn(RequestBody):
    # One of the two is required: said in the schema, enforced in start_turn (a 422 either way).
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": ["content"], "properties": {"content": {"type": "string"}}},
                {"required": ["message"], "properties": {"message": {"type": "string"}}},
            ]
        },
    )

    content: str | None = Field(default=None, max_length=200_000)
    message: str | None = Field(default=None, max_length=200_000)
    multitask_strategy: Literal["reject", "enqueue", "interrupt"] = "reject"


def _tenant() -> str:
    return current_context().tenant


@router.post("", status_code=201, responses=NOT_FOUND)
async def create_session(body: SessionIn, sessions: SessionsDep) -> dict[str, Any]:
    """Create a session; a ``bank_id`` must name an existing bank of the tenant (else 404),
    and ``remember_messages`` needs one (else 400): :meth:`SessionService.create
    <heed.sessions.service.SessionService.create>` says so."""
    session = await sessions.create(
        _tenant(),
        title=body.title,
        bank_id=body.bank_id,
        remember_messages=body.remember_messages,
    )
    return session.to_public()


@router.get("")
async def list_sessions(sessions: SessionsDep, limit: Limit = 100) -> dict[str, Any]:
    listed = await sessions.list_sessions(_tenant(), limit)
    return {"sessions": [s.to_public() for s in listed]}


@router.get("/{session_id}")
async def get_session(session_id: IdPath, sessions: SessionsDep) -> dict[str, Any]:
    session = await sessions.get(session_id, _tenant())
    messages = await sessions.transcript(session_id)
    return {**session.to_public(), "messages": [m.to_public() for m in messages]}


@router.patch("/{session_id}", responses=CONFLICT)
async def update_session(
    session_id: IdPath, body: SessionPatch, sessions: SessionsDep
) -> dict[str, Any]:
    """Rename the session and/or switch ``remember_messages`` (409 for a session with no
    bank); a field left out is left as it is."""
    session = await sessions.update(
        session_id, _tenant(), title=body.title, remember_messages=body.remember_messages
    )
    return session.to_public()


@router.delete("/{session_id}")
async def delete_session(session_id: IdPath, sessions: SessionsDep) -> dict[str, Any]:
    await sessions.delete(session_id, _tenant())
    return {"deleted": True, "id": session_id}


@router.post("/{session_id}/turns", status_code=202, responses={**BUSY_SESSION, **TOO_MANY})
async def start_turn(session_id: IdPath, body: TurnIn, sessions: SessionsDep) -> Any:
    content = body.content if body.content is not None else body.message
    if content is None:
        raise RequestValidationError(
            [
                {
                    "type": "missing",
                    "loc": ("body", "content"),
                    "msg": "Field required (a turn needs `content`, or its alias `message`)",
                    "input": body.model_dump(exclude_unset=True),
                }
            ]
        )
    try:
        run = await sessions.start_turn(
            session_id, _tenant(), content, strategy=body.multitask_strategy
        )
    except RunConflict as exc:
        return JSONResponse(
            {
                "detail": exc.message,
                "busy_run_id": exc.busy.id,
                "busy_run": exc.busy.to_public(),
            },
            status_code=409,
            headers=exc.headers,
        )
    return {
        "run": run.to_public(),
        "run_id": run.id,
        "stream_url": stream_url(run.id),
        "events_url": f"/v1/sessions/{session_id}/events",
    }


@router.get("/{session_id}/status")
async def session_status(session_id: IdPath, sessions: SessionsDep) -> dict[str, Any]:
    await sessions.get(session_id, _tenant())
    return await sessions.status(session_id)


@router.get(
    "/{session_id}/events",
    response_class=StreamingResponse,
    responses={
        **event_stream(
            "The session channel: `turn_started`, `session_updated` and `task_complete` "
            "events (data: the event JSON) and `: heartbeat` comments, until the client "
            "leaves."
        ),
        **TOO_MANY,
    },
)
async def session_events(
    session_id: IdPath,
    sessions: SessionsDep,
    settings: SettingsDep,
    drain: DrainDep,
    stream_slots: StreamSlotsDep,
) -> Any:
    await sessions.get(session_id, _tenant())
    release = stream_slots.acquire(_tenant())  # 429 past HEED_TENANT_MAX_STREAMS
    heartbeat = settings.stream_heartbeat_seconds
    token = current_token()

    async def frames() -> AsyncIterator[str]:
        async for item in sessions.follow_channel(
            session_id, heartbeat=heartbeat, token=token, shutdown=drain.token
        ):
            if isinstance(item, Heartbeat):
                yield HEARTBEAT_FRAME
            else:
                yield named_frame(str(item["type"]), item)

    return sse_response(frames(), release=release)
