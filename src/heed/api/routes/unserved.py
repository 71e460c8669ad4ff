"""The client routes heed answers ``501``: one route per :data:`heed.api.unserved.NOT_IMPLEMENTED`
entry, whose body names the route and why (``{"detail": "<METHOD path>: not implemented in
heed: <reason>"}``), so a client learns what is missing instead of getting a bare 404.

They are in the OpenAPI document (deprecated, their only answer a 501 with that body), so
``Allow`` and the document agree about the methods of their paths.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from heed.api.routing import HeedRoute
from heed.api.unserved import NOT_IMPLEMENTED, UnservedRoute, not_implemented_detail

__all__ = ["NotImplementedResponse", "router"]

router = APIRouter(tags=["not implemented"], route_class=HeedRoute)


class NotImplementedResponse(BaseModel):
    """The body of a 501: ``"<METHOD path>: not implemented in heed: <reason>"``."""

    detail: str


def _answer(route: UnservedRoute) -> Callable[..., Coroutine[Any, Any, JSONResponse]]:
    """The handler of *route*: its path parameters declared (as text), its answer the 501."""
    detail = not_implemented_detail(route)

    async def not_implemented(**_: str) -> JSONResponse:
        return JSONResponse({"detail": detail}, status_code=501)

    not_implemented.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=str)
            for name in re.findall(r"\{([^}]+)\}", route.path)
        ]
    )
    return not_implemented


for _route in NOT_IMPLEMENTED:
    router.add_api_route(
        _route.path,
        _answer(_route),
        methods=[_route.method],
        status_code=501,
        response_model=NotImplementedResponse,
        summary=f"Not implemented in heed: {_route.reason}",
        description=not_implemented_detail(_route),
        deprecated=True,
        name=f"not_implemented:{_route.method} {_route.path}",
    )
