"""Key guessing, slowed: failed authentications counted per client address.

Every response with status 401 (a wrong bearer key, a wrong key at ``/v1/auth/login``, an
expired cookie) counts against the client's address. Past ``max_failures`` within
``window`` seconds, the address's requests that try to authenticate (an ``Authorization``
header or a login) are answered 429 with ``Retry-After`` before any key is compared, until
the window has passed. Correct keys from that address wait too: the throttle cannot tell a
guesser from a user behind the same address, and a 429 that lasts a minute is the price.

Written by hand: a fixed window per address in a bounded dict on the one event loop; the
rate-limit libraries bring storage backends and background timers this does not need.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

__all__ = ["FailureThrottle"]

_MAX_ADDRESSES: Final = 10_000


class FailureThrottle:
    """Counts authentication failures per address (see the module docstring)."""

    def __init__(
        self,
        max_failures: int = 20,
        window: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_failures = max_failures
        self.window = window
        self._clock = clock
        self._windows: OrderedDict[str, tuple[float, int]] = OrderedDict()

    def retry_after(self, address: str | None) -> int | None:
        """Seconds until *address* may try again, or None when it may try now."""
        if address is None or self.max_failures <= 0:
            return None
        entry = self._windows.get(address)
        if entry is None:
            return None
        started, failures = entry
        left = started + self.window - self._clock()
        if left <= 0:
            del self._windows[address]
            return None
        return math.ceil(left) if failures >= self.max_failures else None

    def failed(self, address: str | None) -> None:
        """Count one failed authentication from *address*."""
        if address is None or self.max_failures <= 0:
            return
        now = self._clock()
        started, failures = self._windows.pop(address, (now, 0))
        if now - started >= self.window:
            started, failures = now, 0
        self._windows[address] = (started, failures + 1)
        while len(self._windows) > _MAX_ADDRESSES:
            self._windows.popitem(last=False)  # the least recently failed address
