"""heed's error base class, free of any web framework.

Engine and provider code raise :class:`HeedError` subclasses; the HTTP layer
(:mod:`heed.api.errors`, which re-exports this class) turns them into answers
with the error's ``status_code``, its ``message`` as ``detail`` and its
``headers`` (for example ``Retry-After``).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["NUL", "HeedError", "InvalidText", "refuse_nul", "replace_nul"]

#: The one character no text heed stores may hold (see :class:`InvalidText`).
NUL = "\x00"


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


class InvalidText(HeedError, ValueError):
    """Text holding a NUL character (U+0000), which heed does not store (HTTP 400).

    PostgreSQL's ``text`` cannot hold NUL and SQLite can, so rather than let the two
    databases disagree, no store writes it: the HTTP edge refuses it in a request, each
    domain in its inputs (naming the field), and the stores, whatever path text reaches
    them by, refuse it before they write anything, on both databases alike.
    """

    status_code = 400


def replace_nul(value: str) -> str:
    """*value* with each NUL replaced by U+FFFD, where text must be kept whatever it holds
    (a run's error, an old row ``heed migrate`` copies) rather than refused."""
    return value.replace(NUL, "\ufffd") if NUL in value else value


def refuse_nul(value: str | None, what: str) -> None:
    """Raise :class:`InvalidText` naming *what* when *value* holds NUL."""
    if value is not None and NUL in value:
        raise InvalidText(f"{what} holds a NUL character (U+0000), which heed does not store")
