"""Hindsight's ``/version`` feature flags, computed from what this server does.

Hindsight's client reads ``features`` to learn which capabilities a deployment has. Each
flag here is a fact about the running server, never a constant:

- ``observations``: the server consolidates retains into observations by default (the
  learning settings, ``HEED_OBSERVATIONS`` and the retain provider: see
  :func:`heed.memory.build_learning`); a bank's ``enable_observations`` overrides it for that
  bank, as in Hindsight, where this flag also shows the global default.
- ``worker``: background operations run (the ``retain`` kind has a worker) and can be
  followed (the operations routes are served).
- every other flag: the routes that make the capability are all served by this app
  (:data:`ROUTE_FEATURES`; the app's router is asked, as it would route a request); a route
  answered 501 (:data:`heed.api.unserved.NOT_IMPLEMENTED`) is routed but not served.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any, Final

from starlette.routing import BaseRoute, Match

from heed.api.unserved import NOT_IMPLEMENTED, normalise
from heed.memory.bank_runs import RETAIN_KIND

__all__ = ["FEATURES", "ROUTE_FEATURES", "features", "serves"]

_BANK: Final = "/v1/default/banks/{bank_id}"

#: The flags Hindsight's ``FeaturesInfo`` has, in its order.
FEATURES: Final = (
    "observations",
    "mcp",
    "worker",
    "bank_config_api",
    "bank_llm_health",
    "file_upload_api",
    "document_export_api",
    "document_import_api",
    "audit_log",
    "llm_trace",
    "store_document_text",
)

#: The flags that say routes are served: each is true when every ``(method, path)`` it lists
#: is (what Hindsight gates behind the flag's setting).
ROUTE_FEATURES: Final[Mapping[str, tuple[tuple[str, str], ...]]] = {
    "mcp": (("POST", "/mcp"),),
    "worker": (("GET", f"{_BANK}/operations"), ("GET", f"{_BANK}/operations/{{operation_id}}")),
    "bank_config_api": (
        ("GET", f"{_BANK}/config"),
        ("PATCH", f"{_BANK}/config"),
        ("DELETE", f"{_BANK}/config"),
    ),
    "bank_llm_health": (("POST", f"{_BANK}/health/llm"),),
    "file_upload_api": (("POST", f"{_BANK}/files/retain"),),
    "document_export_api": (
        ("POST", f"{_BANK}/document-transfer/export"),
        ("GET", "/v1/default/files/download/{key}"),
    ),
    "document_import_api": (("POST", f"{_BANK}/document-transfer"),),
    "audit_log": (("GET", f"{_BANK}/audit-logs"),),
    "llm_trace": (("GET", f"{_BANK}/llm-requests"),),
    # heed keeps every document's text; reading it back is the route that shows it.
    "store_document_text": (("GET", f"{_BANK}/documents/{{document_id}}"),),
}

_PARAM: Final = re.compile(r"\{[^}/]*\}")

#: Routes answered 501 (:data:`heed.api.unserved.NOT_IMPLEMENTED`): routed, yet not served.
NOT_IMPLEMENTED_KEYS: Final = frozenset(route.key for route in NOT_IMPLEMENTED)


def serves(routes: Iterable[BaseRoute], method: str, path: str) -> bool:
    """Whether *routes* route a *method* request to *path* (each ``{parameter}`` filled
    with a sample value) to an endpoint: the router's own matching, so the answer holds
    whatever prefixes, converters or nesting the routes use."""
    scope: dict[str, Any] = {
        "type": "http",
        "method": method,
        "path": _PARAM.sub("x", path),
        "root_path": "",
        "query_string": b"",
        "headers": [],
    }
    return any(route.matches(scope)[0] == Match.FULL for route in routes)


def features(
    routes: Iterable[BaseRoute], *, observations: bool, run_kinds: Collection[str]
) -> dict[str, bool]:
    """Every flag of :data:`FEATURES`, from *routes* (the app's), whether the server
    consolidates by default (*observations*) and the kinds of run it has workers for."""
    routes = list(routes)
    flags = {
        name: all(
            serves(routes, method, path) and (method, normalise(path)) not in NOT_IMPLEMENTED_KEYS
            for method, path in needed
        )
        for name, needed in ROUTE_FEATURES.items()
    }
    flags["observations"] = observations
    flags["worker"] = flags["worker"] and RETAIN_KIND in run_kinds
    return {name: flags[name] for name in FEATURES}
