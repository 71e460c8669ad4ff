"""Server-side logout: which UI sessions have ended, asked of the shared database.

``POST /v1/auth/logout`` records the session's id (:mod:`heed.storage.revocation_store`);
every cookie-authenticated request asks :meth:`Revocations.is_revoked` before its route
runs. The answer "not revoked" is cached per session for ``cache_seconds`` (1 s), so an
active browser costs one primary-key read a second, and a logout on one instance is
honoured by every instance within that second (at once on the instance that logged out).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Final, Protocol

from heed.runtime import run_in_thread

__all__ = ["RevocationStore", "Revocations"]

_MAX_CACHED: Final = 10_000


class RevocationStore(Protocol):
    """Where ended sessions are kept (:class:`heed.storage.revocation_store.SqlRevocationStore`).
    Calls block."""

    def revoke(self, session_id: str, expires_at: float) -> None: ...

    def is_revoked(self, session_id: str) -> bool: ...


class Revocations:
    """Ended UI sessions (see the module docstring). Used from one event loop."""

    def __init__(self, store: RevocationStore, cache_seconds: float = 1.0) -> None:
        self.store = store
        self.cache_seconds = cache_seconds
        self._checked: OrderedDict[str, float] = OrderedDict()  # session id -> when found live

    async def revoke(self, session_id: str, expires_at: float) -> None:
        """End *session_id* everywhere (until *expires_at*, epoch seconds)."""
        self._checked.pop(session_id, None)
        await run_in_thread(self.store.revoke, session_id, expires_at)

    async def is_revoked(self, session_id: str) -> bool:
        """Whether *session_id* was logged out of (see the module docstring)."""
        now = time.monotonic()
        checked = self._checked.get(session_id)
        if checked is not None and now - checked < self.cache_seconds:
            return False
        if await run_in_thread(self.store.is_revoked, session_id):
            self._checked.pop(session_id, None)
            return True
        self._checked[session_id] = now
        self._checked.move_to_end(session_id)
        while len(self._checked) > _MAX_CACHED:
            self._checked.popitem(last=False)
        return False
