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
)
"""Routes answered 501 with a body naming the route and why (see the module docstring)."""

NOT_YET_SERVED: Final[tuple[UnservedRoute, ...]] = (
    UnservedRoute("GET", "/v1/bank-template-schema", "bank templates are not built yet"),
    UnservedRoute("GET", f"{_BANK}/aliases", "bank aliases are not built yet"),
    UnservedRoute("POST", f"{_BANK}/aliases", "bank aliases are not built yet"),
    UnservedRoute("PATCH", f"{_BANK}/aliases/{{alias}}", "bank aliases are not built yet"),
    UnservedRoute("DELETE", f"{_BANK}/aliases/{{alias}}", "bank aliases are not built yet"),
    UnservedRoute(
        "GET",
        f"{_BANK}/attachments/{{attachment_id}}",
        "heed keeps no inline attachments of retained content yet",
    ),
    UnservedRoute(
        "POST",
        f"{_BANK}/consolidation-strategies/preview",
        "per-scope consolidation strategies are not built yet",
    ),
    UnservedRoute(
        "PATCH", f"{_BANK}/documents/{{document_id}}", "document edits are not built yet"
    ),
    UnservedRoute(
        "POST",
        f"{_BANK}/documents/{{document_id}}/reprocess",
        "re-extracting a stored document is not built yet",
    ),
    UnservedRoute("GET", f"{_BANK}/export", "bank templates are not built yet"),
    UnservedRoute("POST", f"{_BANK}/import", "bank templates are not built yet"),
    UnservedRoute("POST", f"{_BANK}/health/llm", "the per-bank LLM probe is not built yet"),
    UnservedRoute(
        "DELETE", f"{_BANK}/memories", "clearing a bank's memories as a run is not built yet"
    ),
    UnservedRoute(
        "POST",
        f"{_BANK}/memories/dry-run-extract",
        "an extraction that writes nothing is not built yet",
    ),
    UnservedRoute(
        "PATCH",
        f"{_BANK}/memories/{{memory_id}}",
        "memory edits (edit, invalidate, revert with history) are not built yet",
    ),
    UnservedRoute(
        "POST", f"{_BANK}/prompts/preview", "rendering an operation's prompts is not built yet"
    ),
)
"""Routes heed does not serve yet (404), each with a one-line reason; this list only shrinks."""
