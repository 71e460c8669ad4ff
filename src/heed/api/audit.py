"""The HTTP edge's audit entries: who did what to which bank, from the request context.

:func:`audit_hook` is the lifecycle middleware's ``audit`` hook
(:data:`heed.api.middleware.AuditHook`): each admitted POST, PUT, PATCH or DELETE to a
route with a ``bank_id`` becomes one entry of :class:`heed.observability.Observability`:
the action is the route's name (``retain_memories``, ``delete_bank``...), the transport
``http``, the request its method and route template, the response its status, and the
metadata the tenant's principal (a key's id, never the key) and the request's duration.
Bodies and headers are never kept.
"""

from __future__ import annotations

import time

from heed.api.middleware import AuditHook
from heed.observability import Observability
from heed.runtime import RequestContext

__all__ = ["audit_hook"]


def audit_hook(observability: Observability) -> AuditHook:
    """The middleware's audit hook over *observability* (see the module docstring)."""

    def record(
        ctx: RequestContext,
        bank_id: str,
        action: str,
        method: str,
        route: str,
        status: int,
        seconds: float,
    ) -> None:
        ended = time.time()
        observability.record_audit(
            tenant=ctx.tenant,
            bank_id=bank_id,
            action=action,
            transport="http",
            started_at=ended - seconds,
            ended_at=ended,
            principal=ctx.principal,
            request={"method": method, "route": route},
            response={"status": status},
            metadata={"principal": ctx.principal, "tenant": ctx.tenant},
        )

    return record
