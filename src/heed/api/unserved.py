"""The routes of the Hindsight client heed does not serve, in one place, each with its reason.

heed's yardstick is the unmodified ``hindsight-client`` (its generated
``hindsight_client_api.api``). Every route that client can call is either served by heed,
or listed here:

- :data:`NOT_IMPLEMENTED`: routes heed answers ``501`` (by :mod:`heed.api.routes.unserved`)
  with ``{"detail": "<METHOD path>: not implemented in heed: <reason>"}``: routes that
  cannot mean anything in heed (Hindsight itself removed them, say);
- :data:`NOT_YET_SERVED`: routes heed does not serve yet (they answer 404), each with a
  one-line reason; this list only shrinks.

``tests/api/test_route_walk.py`` walks the client's routes and heed's and fails on a client
route that is neither served nor listed, on a listed route that is served, and on a
``NOT_IMPLEMENTED`` route that does not answer 501 naming itself. docs/api-compatibility.md
lists both tables (the same test checks it does). Paths are the client's templates;
parameter names do not matter (routes are compared with ``{...}`` segments normalised).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

__all__ = ["NOT_IMPLEMENTED", "NOT_YET_SERVED", "UnservedRoute", "not_implemented_detail"]

_BANK: Final = "/v1/default/banks/{bank_id}"


@dataclass(frozen=True, slots=True)
class UnservedRoute:
    """A route of the client heed does not serve: its method, path template and why."""

    method: str
    path: str
    reason: str

    @property
    def key(self) -> tuple[str, str]:
        """``(METHOD, path with every {...} segment as {})``: how routes are compared."""
        return self.method, normalise(self.path)


def normalise(path: str) -> str:
    """*path* with every ``{name}`` segment written ``{}`` (parameter names do not matter)."""
    return re.sub(r"\{[^}]*\}", "{}", path)


def not_implemented_detail(route: UnservedRoute) -> str:
    """The ``detail`` of the 501 a :data:`NOT_IMPLEMENTED` route answers."""
    return f"{route.method} {route.path}: not implemented in heed: {route.reason}"


NOT_IMPLEMENTED: Final[tuple[UnservedRoute, ...]] = (
    UnservedRoute(
        "GET",
        f"{_BANK}/document-transfer",
        "removed in Hindsight too (a synchronous whole-bank export); use POST "
        f"{_BANK}/document-transfer/export, which runs as an operation",
    ),
    UnservedRoute(
        "POST",
        f"{_BANK}/background",
        "removed in Hindsight too (the background was folded into the reflect mission); "
        f"write reflect_mission with PATCH {_BANK}/config",
    ),
    UnservedRoute(
        "GET",
        f"{_BANK}/attachments/{{attachment_id}}",
        "heed stores no attachments: a retain item carrying attachments is refused by name, "
        "so no attachment id ever exists",
    ),
    UnservedRoute(
        "POST",
        f"{_BANK}/prompts/preview",
        "heed builds each prompt inside its stage from the data that stage reads (the "
        "numbered units of a retain, the facts of a consolidation round, a reflect's tool "
        "results), so there is no prompt to render without running the stage; POST "
        f"{_BANK}/memories/dry-run-extract runs an extraction and writes nothing",
    ),
)
"""Routes answered 501 with a body naming the route and why (see the module docstring)."""

NOT_YET_SERVED: Final[tuple[UnservedRoute, ...]] = (
    UnservedRoute("GET", f"{_BANK}/audit-logs", "audit logs are not kept yet"),
    UnservedRoute("GET", f"{_BANK}/audit-logs/stats", "audit logs are not kept yet"),
    UnservedRoute("GET", f"{_BANK}/audit-logs/{{log_id}}", "audit logs are not kept yet"),
    UnservedRoute(
        "POST",
        f"{_BANK}/consolidation-strategies/preview",
        "per-scope consolidation strategies are not built yet",
    ),
    UnservedRoute("POST", f"{_BANK}/health/llm", "the per-bank LLM probe is not built yet"),
    UnservedRoute("GET", f"{_BANK}/llm-requests", "LLM request traces are not kept yet"),
    UnservedRoute("GET", f"{_BANK}/llm-requests/stats", "LLM request traces are not kept yet"),
    UnservedRoute(
        "POST",
        f"{_BANK}/memories/dry-run-extract",
        "an extraction that writes nothing is not built yet",
    ),
)
"""Routes heed does not serve yet (404), each with a one-line reason; this list only shrinks."""
