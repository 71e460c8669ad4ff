"""Web UI login: a key becomes an HttpOnly session cookie (see :mod:`heed.api.auth`).

- ``GET /v1/auth/session``: whether keys are required and who the caller is
  (``{"keys_required", "authenticated", "tenant", "csrf_token"}``); public.
- ``POST /v1/auth/login`` ``{key}``: 200 with the tenant and CSRF token, and the
  ``heed_session`` (HttpOnly, SameSite=Strict) and ``heed_csrf`` cookies; an
  unknown key is a 401; without keys configured, a 400 (there is nothing to log
  into). Public.
- ``POST /v1/auth/logout``: clears both cookies.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from heed.api.auth import ANONYMOUS_TENANT, CSRF_COOKIE, SESSION_COOKIE
from heed.api.deps import AuthenticatorDep, RevocationsDep
from heed.api.input_rules import MAX_ID_CHARS, RequestBody
from heed.api.routing import HeedRoute
from heed.errors import HeedError
from heed.runtime import current_context

router = APIRouter(prefix="/v1/auth", tags=["auth"], route_class=HeedRoute)


class LoginIn(RequestBody):
    key: str = Field(min_length=1, max_length=MAX_ID_CHARS)


@router.get("/session")
async def session(request: Request, authenticator: AuthenticatorDep) -> dict[str, Any]:
    """Who the caller is; the UI asks this first to decide whether to show the login."""
    tenant = current_context().tenant
    authenticated = not authenticator.keys_required or tenant != ANONYMOUS_TENANT
    return {
        "keys_required": authenticator.keys_required,
        "authenticated": authenticated,
        "tenant": tenant if authenticated else None,
        "csrf_token": authenticator.csrf_token(request.scope.get("headers", [])),
    }


@router.post("/login")
async def login(body: LoginIn, request: Request, authenticator: AuthenticatorDep) -> JSONResponse:
    """Exchange an API key for a UI session cookie."""
    if not authenticator.keys_required:
        raise HeedError("this server has no API keys configured: there is nothing to log into")
    ui = authenticator.login(body.key.strip())
    if ui is None:
        raise HeedError("unknown API key", status_code=401)
    response = JSONResponse({"tenant": ui.tenant, "csrf_token": ui.csrf_token})
    secure = request.url.scheme == "https"
    response.set_cookie(
        SESSION_COOKIE,
        ui.session_cookie,
        max_age=ui.max_age,
        httponly=True,
        samesite="strict",
        secure=secure,
    )
    response.set_cookie(
        CSRF_COOKIE, ui.csrf_token, max_age=ui.max_age, samesite="strict", secure=secure
    )
    return response


@router.post("/logout")
async def logout(
    request: Request, authenticator: AuthenticatorDep, revocations: RevocationsDep
) -> JSONResponse:
    """End the UI session: refused from now on by every instance, and the cookies cleared."""
    session = authenticator.session_of(request.scope.get("headers", []))
    if session is not None:
        await revocations.revoke(*session)
    response = JSONResponse({"logged_out": True})
    response.delete_cookie(SESSION_COOKIE, httponly=True, samesite="strict")
    response.delete_cookie(CSRF_COOKIE, samesite="strict")
    return response
