"""heed's error base class, free of any web framework.

Engine and provider code raise :class:`HeedError` subclasses; the HTTP layer
(:mod:`heed.api.errors`, which re-exports this class) turns them into answers
with the error's ``status_code``, its ``message`` as ``detail`` and its
``headers`` (for example ``Retry-After``).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["HeedError"]


class HeedError(Exception):
    """An error with an HTTP status that names the caller's problem (or upstream's)."""

    status_code = 400

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.headers: dict[str, str] = dict(headers or {})
        if status_code is not None:
            self.status_code = status_code
