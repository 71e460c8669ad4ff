"""Disconnect policies: what a route's work does when its client leaves.

``cancel`` is the default for every route: the request's token is cancelled on
``http.disconnect`` and the work stops at its next checkpoint (the response is
499). A route whose work must finish anyway declares ``continue``::

    @router.post("/things", dependencies=[Depends(continue_on_disconnect)])

Its work then runs under a detached token that the client leaving does not
cancel (deadlines and explicit cancels still apply).
"""

from __future__ import annotations

from typing import Literal

from starlette.requests import Request

from heed.runtime import detached, set_context

__all__ = ["DisconnectPolicy", "continue_on_disconnect"]

DisconnectPolicy = Literal["cancel", "continue"]


async def continue_on_disconnect(request: Request) -> None:
    """FastAPI dependency: run this route's work under a token detached from the client."""
    ctx = detached()
    set_context(ctx)
    request.state.disconnect_policy = "continue"
    request.state.request_context = ctx
