"""Admission at the edge: how many requests are being worked on, in total and per tenant.

A request is *in flight* from the moment its body has arrived until its response starts
(the status line is sent) or it ends. That is the part that costs CPU -- checking the
body, validation, the route's work -- and it is what a storm piles up; a long-lived stream
that has started answering (an SSE tail, idle between events) is not in flight, and
neither is a request whose client has not finished sending its body (that costs nothing
but a socket, and the connection's body timeout bounds it: :mod:`heed.api.connection`).
Past ``max_in_flight`` in total, or past ``per_tenant`` for the caller's tenant, a request
is refused at once with 503 and ``Retry-After``: checked once before its body is read
(:meth:`Admission.refusal`, so a storm's refusals cost a few microseconds) and again when
it takes its place (:meth:`Admission.enter`). One tenant's storm leaves
``max_in_flight - per_tenant`` places for everybody else.

Requests without credentials to public paths (the login, the UI's files) are one
anonymous caller; they are counted by an admission of their own, so they can neither
take the tenants' places nor be locked out by them.

Written by hand: it is two counters and a dict, on the one event loop; no library bounds
ASGI requests per tenant before the body is read.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Admission", "Ticket"]


@dataclass(eq=False, slots=True)
class Ticket:
    """One admitted request's place; give it back with :meth:`Admission.leave` (once)."""

    tenant: str
    left: bool = False


class Admission:
    """Counts in-flight requests (see the module docstring). Used from one event loop."""

    def __init__(self, max_in_flight: int, per_tenant: int | None = None) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.max_in_flight = max_in_flight
        self.per_tenant = (
            min(per_tenant, max_in_flight)
            if per_tenant is not None
            else max(1, max_in_flight * 3 // 4)
        )
        self.in_flight = 0
        self._by_tenant: dict[str, int] = {}
        self.refused_total = 0

    def refusal(self, tenant: str) -> str | None:
        """Why a request of *tenant* would be refused now (its 503 detail), or None.

        Takes nothing: a refusal is counted in ``refused_total``."""
        if self.in_flight >= self.max_in_flight:
            self.refused_total += 1
            return f"the server is at capacity ({self.max_in_flight} requests in progress)"
        mine = self._by_tenant.get(tenant, 0)
        if mine >= self.per_tenant:
            self.refused_total += 1
            return f"this tenant has {mine} requests in progress, the most one tenant may have"
        return None

    def enter(self, tenant: str) -> Ticket | str:
        """A ticket, or why the request is refused (its 503 detail)."""
        refused = self.refusal(tenant)
        if refused is not None:
            return refused
        mine = self._by_tenant.get(tenant, 0)
        self.in_flight += 1
        self._by_tenant[tenant] = mine + 1
        return Ticket(tenant)

    def leave(self, ticket: Ticket) -> None:
        """Give the place back; a second call for the same ticket does nothing."""
        if ticket.left:
            return
        ticket.left = True
        self.in_flight -= 1
        remaining = self._by_tenant[ticket.tenant] - 1
        if remaining:
            self._by_tenant[ticket.tenant] = remaining
        else:
            del self._by_tenant[ticket.tenant]
