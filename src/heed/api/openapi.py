"""The OpenAPI document: heed's error answers, documented once for every operation.

What heed answers besides success, and who answers it:

- **400** ``{"detail": str}``: a request the schema cannot refuse by itself. The
  lifecycle middleware refuses a ``Host`` outside the allow-list and a body that
  breaks the text rule (not UTF-8, a lone surrogate); routes and engines refuse
  what only they can judge (a timestamp that does not parse, a wordless query,
  a ``response_schema`` that is not JSON Schema).
- **401**, **403** ``{"detail": str}``: the authenticator (no or unknown key when
  keys are configured; a remote client without keys, a missing CSRF header).
- **404** ``{"detail": str}``: the resource a path names does not exist (or is
  another tenant's); a route whose body names one declares it too.
- **409** ``{"detail": str, ...}`` with ``Retry-After``: the resource is busy
  (declared by the routes that answer it, with :data:`CONFLICT`).
- **413** ``{"detail": str}``: the body is larger than ``HEED_MAX_BODY_BYTES``.
- **422** ``{"detail": [{"loc", "msg", "type", ...}, ...]}``: the request does
  not match this document (FastAPI's validation-error shape; heed's own 422s use
  it too).
- **429** ``{"detail": str}`` with ``Retry-After``: a per-session or per-tenant bound
  (declared by the routes that answer it, with :data:`TOO_MANY`).
- **502** ``{"detail": str}``: the LLM upstream failed (declared with :data:`UPSTREAM`).
- **503** ``{"detail": str}``, usually with ``Retry-After``: a full lane queue,
  or a server draining for shutdown.

499 (the client left) is never seen by a client and is not documented; 500 is a bug.

Why one function over the generated document, rather than ``responses=`` on
every router: most of these answers do not come from routes. The middleware
answers 400, 401, 403, 413 and 503 before routing, for every path, so they
belong to every operation there is, including those of a router added later;
the one place that sees every operation is the document FastAPI generates.
:func:`install_openapi` adds them there, and 404 wherever a path parameter
names a resource. Only what a single route can answer (409, 502, a 404 about a
body field, a ``text/event-stream`` 200) is declared on that route, with the
constants below, so that the models live in one module.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Final

from fastapi import FastAPI
from pydantic import BaseModel

__all__ = [
    "BUSY_SESSION",
    "CONFLICT",
    "EXPORT_QUOTA",
    "NOT_FOUND",
    "SSE_EVENT_SCHEMA",
    "TOO_MANY",
    "UPLOAD_REFUSED",
    "UPSTREAM",
    "ErrorDetail",
    "Overloaded",
    "RunConflictDetail",
    "document_errors",
    "event_stream",
    "install_openapi",
    "upload_body",
]

_SCHEMAS: Final = "#/components/schemas/"
_METHODS: Final = frozenset({"get", "put", "post", "delete", "options", "head", "patch", "trace"})


class ErrorDetail(BaseModel):
    """Every error heed answers except a 422: ``detail`` names the problem."""

    detail: str


class Overloaded(ErrorDetail):
    """503: a lane's queue is full (``lane``, ``retry_after``) or the server is draining."""

    lane: str | None = None
    retry_after: int | None = None


class RunConflictDetail(ErrorDetail):
    """409 from a chat turn: the session is busy with ``busy_run`` (strategy ``reject``)."""

    busy_run_id: str | None = None
    busy_run: dict[str, Any] | None = None


_RETRY_AFTER: Final = {
    "Retry-After": {
        "description": "Seconds to wait before retrying.",
        "schema": {"type": "integer", "minimum": 0},
    }
}


def _error(description: str, model: type[BaseModel] = ErrorDetail) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": _SCHEMAS + model.__name__}}},
    }


_EVERY_OPERATION: Final[dict[str, dict[str, Any]]] = {
    "400": _error(
        "Bad request: a Host header outside the allow-list, a body that is not valid UTF-8 "
        "or holds a lone surrogate, or a value only the server can judge."
    ),
    "401": _error("No or unknown API key (only when HEED_API_KEYS is set)."),
    "403": _error(
        "Forbidden: a remote client of a server without API keys, a cookie session "
        "without its CSRF header, or /metrics without the metrics key."
    ),
    "413": _error("The request body exceeds HEED_MAX_BODY_BYTES."),
    "503": {
        **_error("Overloaded (a lane's queue is full) or shutting down.", Overloaded),
        "headers": _RETRY_AFTER,
    },
}
_PATH_RESOURCE: Final = _error("Not found: what the path names does not exist for this tenant.")

NOT_FOUND: Final[dict[int | str, dict[str, Any]]] = {
    404: {"model": ErrorDetail, "description": "Not found: something the body names."}
}
"""For a route whose body names a resource (path parameters get 404 on their own)."""

CONFLICT: Final[dict[int | str, dict[str, Any]]] = {
    409: {
        "model": ErrorDetail,
        "description": "The resource is busy or the request conflicts with an earlier one.",
        "headers": _RETRY_AFTER,
    }
}
"""For the routes that answer 409 (busy session, bank being deleted, idempotency mismatch)."""

BUSY_SESSION: Final[dict[int | str, dict[str, Any]]] = {
    409: {
        "model": RunConflictDetail,
        "description": "The session is busy (``multitask_strategy: reject``): ``busy_run`` is "
        "the run it is busy with.",
        "headers": _RETRY_AFTER,
    }
}
"""For the chat turn route."""

TOO_MANY: Final[dict[int | str, dict[str, Any]]] = {
    429: {
        "model": ErrorDetail,
        "description": "A per-session or per-tenant bound is reached: ``detail`` names the "
        "limit (``HEED_MAX_QUEUED_TURNS_PER_SESSION``, ``HEED_TENANT_MAX_STREAMS``).",
        "headers": _RETRY_AFTER,
    }
}
"""For the routes that a bound refuses with 429 (queued turns, open streams)."""

UPLOAD_REFUSED: Final[dict[int | str, dict[str, Any]]] = {
    415: {"model": ErrorDetail, "description": "The body is not multipart/form-data."},
    429: {
        "model": ErrorDetail,
        "description": "The uploads in progress hold as many bytes as one tenant may have "
        "spooled (``HEED_UPLOAD_SPOOL_TENANT_BYTES``) or all tenants may "
        "(``HEED_UPLOAD_SPOOL_MAX_BYTES``): ``detail`` names it.",
        "headers": _RETRY_AFTER,
    },
    507: {
        "model": ErrorDetail,
        "description": "The upload would leave the server's upload directory less free space "
        "than ``HEED_UPLOAD_MIN_FREE_BYTES``.",
        "headers": _RETRY_AFTER,
    },
}
"""For the routes that take an upload (:mod:`heed.api.uploads`)."""


EXPORT_QUOTA: Final[dict[int | str, dict[str, Any]]] = {
    429: {
        "model": ErrorDetail,
        "description": "The tenant's stored exports are at its quota "
        "(``HEED_EXPORT_TENANT_MAX_COUNT``, ``HEED_EXPORT_TENANT_MAX_BYTES``): ``detail`` "
        "names it; ``Retry-After`` is when the oldest expires.",
        "headers": _RETRY_AFTER,
    }
}
"""For the routes that export a bank (:mod:`heed.transfer.service`)."""


def upload_body(field: str, description: str) -> dict[str, Any]:
    """``openapi_extra=`` of a route that reads its multipart body itself (an upload): the
    request body FastAPI would have documented for a ``File`` parameter *field*."""
    return {
        "requestBody": {
            "required": True,
            "content": {
                "multipart/form-data": {
                    "schema": {
                        "type": "object",
                        "required": [field],
                        "properties": {
                            field: {
                                "type": "string",
                                "contentMediaType": "application/octet-stream",
                                "description": description,
                            }
                        },
                    }
                }
            },
        }
    }


UPSTREAM: Final[dict[int | str, dict[str, Any]]] = {
    502: {"model": ErrorDetail, "description": "The LLM upstream failed or answered nonsense."}
}
"""For the routes that wait on an LLM call before answering."""

SSE_EVENT_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "required": ["data"],
    "properties": {
        "event": {"type": "string"},
        "data": {"type": "string", "contentMediaType": "application/json"},
        "id": {"type": "string"},
        "retry": {"type": "integer", "minimum": 0},
    },
}
"""One server-sent event (OpenAPI 3.2's ``itemSchema`` convention, as FastAPI's own)."""


def event_stream(description: str) -> dict[int | str, dict[str, Any]]:
    """``responses=`` of a route whose 200 is (or, on request, may be) ``text/event-stream``."""
    return {
        200: {
            "description": description,
            "content": {"text/event-stream": {"itemSchema": SSE_EVENT_SCHEMA}},
        }
    }


def _has_path_parameter(operation: dict[str, Any]) -> bool:
    return any(p.get("in") == "path" for p in operation.get("parameters", []))


def document_errors(schema: dict[str, Any]) -> dict[str, Any]:
    """Add heed's error answers and models to a generated document (in place; returned)."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in (ErrorDetail, Overloaded, RunConflictDetail):
        generated = model.model_json_schema(ref_template=_SCHEMAS + "{model}")
        components.update(generated.pop("$defs", {}))
        components.setdefault(model.__name__, generated)
    validation = components.get("HTTPValidationError")
    if validation is not None:  # heed's 422 always carries the list (errors._invalid_request)
        validation["required"] = ["detail"]
    for item in schema.get("paths", {}).values():
        for method, operation in item.items():
            if method not in _METHODS:
                continue
            responses: dict[str, Any] = operation.setdefault("responses", {})
            for code, response in _EVERY_OPERATION.items():
                responses.setdefault(code, copy.deepcopy(response))
            if _has_path_parameter(operation):
                responses.setdefault("404", copy.deepcopy(_PATH_RESOURCE))
            operation["responses"] = dict(sorted(responses.items()))
    return schema


def install_openapi(app: FastAPI) -> None:
    """Make ``app.openapi()`` return the generated document with heed's errors added."""
    generate: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document_errors(generate())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
