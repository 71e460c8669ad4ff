"""How many event streams a tenant holds open (:class:`StreamSlots`), bounded per process.

An open stream -- a run's journal (``/v1/runs/{id}/stream``) or a session channel
(``/v1/sessions/{id}/events``) -- costs a broker subscription, a task and its buffers for
as long as its client keeps it, and once it has started answering it holds no place in the
in-flight bound (:mod:`heed.api.admission`: an idle tail costs no CPU). So nothing else
bounds how many one client can pile up. ``HEED_TENANT_MAX_STREAMS`` does, per tenant and
per process: past it a new stream is refused with 429 naming the limit, with
``Retry-After``, before it subscribes to anything. A stream's slot is released when its
response ends, however it ends (finished, client gone, server draining).
"""

from __future__ import annotations

from collections.abc import Callable

from heed.errors import HeedError

__all__ = ["StreamSlots", "TooManyStreams"]


class TooManyStreams(HeedError):
    """The tenant already holds as many open streams as it may: 429 naming the limit."""

    status_code = 429

    def __init__(self, limit: int, retry_after: int = 5) -> None:
        super().__init__(
            f"this tenant already has {limit} event streams open on this server, the most it "
            f"may hold (HEED_TENANT_MAX_STREAMS={limit}); close some (a browser tab holds one "
            "per session and one per live turn) or retry later",
            headers={"Retry-After": str(retry_after)},
        )
        self.limit = limit


class StreamSlots:
    """Counts open streams per tenant; :meth:`acquire` refuses past ``per_tenant``.

    Used on the event loop only (no lock: no await between the check and the count).
    """

    def __init__(self, per_tenant: int) -> None:
        if per_tenant < 1:
            raise ValueError("per_tenant must be at least 1")
        self.per_tenant = per_tenant
        self._open: dict[str, int] = {}

    def open(self, tenant: str) -> int:
        """How many streams *tenant* holds open now."""
        return self._open.get(tenant, 0)

    def acquire(self, tenant: str) -> Callable[[], None]:
        """Take a slot for one stream of *tenant*; returns its release (idempotent).

        Raises :class:`TooManyStreams` when the tenant holds ``per_tenant`` already.
        """
        held = self._open.get(tenant, 0)
        if held >= self.per_tenant:
            raise TooManyStreams(self.per_tenant)
        self._open[tenant] = held + 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            left = self._open.get(tenant, 0) - 1
            if left > 0:
                self._open[tenant] = left
            else:
                self._open.pop(tenant, None)

        return release
