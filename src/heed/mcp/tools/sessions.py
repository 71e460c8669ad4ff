"""The session tool: ``start_turn``, a chat turn (a run) in a session, new or existing;
returns its text."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import Context
from pydantic import BaseModel, Field

from heed.errors import HeedError
from heed.mcp.calls import progress_reporter
from heed.mcp.tools.base import Name, OnDisconnect, ToolGroup, run_itself, run_text

__all__ = ["SessionTools", "TurnAnswer"]


class TurnAnswer(BaseModel):
    session_id: str
    run_id: str
    text: str


class SessionTools(ToolGroup):
    """Chat sessions."""

    tool_names = ("start_turn",)

    async def start_turn(
        self,
        message: Annotated[str, Field(min_length=1, max_length=200_000)],
        ctx: Context[Any],
        session_id: Name | None = None,
        bank_id: Name | None = None,
        on_disconnect: OnDisconnect = "cancel",
    ) -> TurnAnswer:
        """Send a message to a chat session and return the assistant's answer. Without a
        session_id a new session is created (with bank_id, over that memory bank). A
        session busy with another turn is an error naming the busy run."""
        async with self._call(ctx) as call, progress_reporter(ctx) as report:
            sessions = self.services.sessions
            created = session_id is None
            bound = (
                bank_id
                if session_id is None
                else (await sessions.get(session_id, call.tenant)).bank_id
            )
            if bound is not None:
                await self._allowed(bound, "start_turn")
            if session_id is None:
                title = message.strip().splitlines()[0][:60] if message.strip() else ""
                session = await sessions.create(call.tenant, title=title, bank_id=bank_id)
                session_id = session.id
            try:
                run = await self._start(
                    sessions.start_turn(session_id, call.tenant, message), run_itself, on_disconnect
                )
            except HeedError:
                if created:  # refused (the turn lane is full): leave no empty session behind
                    await sessions.delete(session_id, call.tenant)
                raise
            ended = await self._follow(run, report, on_disconnect)
        return TurnAnswer(session_id=session_id, run_id=ended.id, text=run_text(ended))
