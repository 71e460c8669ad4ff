"""The request context: who is asking, and the token that says when to stop.

Every engine operation runs inside a :class:`RequestContext` held in a
contextvar. The HTTP layer creates one per request; the offload copies it into
worker threads, so a checkpoint deep inside a thread sees the request's token.

Internal callers (startup jobs, tests, the CLI) may run with no context at all:
:func:`raise_if_cancelled` is then a no-op and :func:`current_context` returns
the default tenant with a token nobody cancels.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Final, TypeVar

from heed.runtime.cancellation import CancellationToken

__all__ = [
    "DEFAULT_TENANT",
    "RequestContext",
    "current_context",
    "current_token",
    "detached",
    "raise_if_cancelled",
    "scoped_value",
    "set_context",
    "use_context",
]

_T = TypeVar("_T")

DEFAULT_TENANT: Final = "default"


@dataclass(frozen=True, slots=True)
class RequestContext:
    """Who a piece of work is for and the token that cancels it.

    ``deadline`` is a ``time.monotonic()`` instant or ``None``; the token carries
    the same deadline, so checkpoints enforce it.
    """

    tenant: str = DEFAULT_TENANT
    principal: str | None = None
    token: CancellationToken = field(default_factory=CancellationToken)
    deadline: float | None = None

    def raise_if_cancelled(self) -> None:
        """A checkpoint on this context's token."""
        self.token.raise_if_cancelled()

    def with_token(self, token: CancellationToken) -> RequestContext:
        """The same identity with another token."""
        return replace(self, token=token, deadline=token.deadline)

    def with_timeout(self, seconds: float) -> RequestContext:
        """A child context whose token is also cancelled after *seconds*."""
        deadline = time.monotonic() + seconds
        return self.with_token(self.token.child(deadline=deadline))


_current: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar(
    "heed_request_context", default=None
)


def current_context() -> RequestContext:
    """The active context, or a fresh default one when none is set."""
    ctx = _current.get()
    return ctx if ctx is not None else RequestContext()


def current_token() -> CancellationToken | None:
    """The active context's token, or ``None`` when no context is set."""
    ctx = _current.get()
    return None if ctx is None else ctx.token


def raise_if_cancelled() -> None:
    """A checkpoint on the active context; a no-op when there is none."""
    ctx = _current.get()
    if ctx is not None:
        ctx.token.raise_if_cancelled()


@contextmanager
def scoped_value(var: contextvars.ContextVar[_T], value: _T) -> Iterator[_T]:
    """*var* holds *value* inside the ``with`` block (which gets *value*); on the way out,
    a raise included, it holds again what it held before."""
    reset = var.set(value)
    try:
        yield value
    finally:
        var.reset(reset)


@contextmanager
def use_context(ctx: RequestContext) -> Iterator[RequestContext]:
    """Make *ctx* the active context inside the ``with`` block."""
    with scoped_value(_current, ctx):
        yield ctx


def set_context(ctx: RequestContext) -> None:
    """Make *ctx* the active context for the rest of the current context copy, with no reset.

    For a framework hook whose effect must outlast its own call: a FastAPI dependency
    runs before its route, in the same context copy, and cannot wrap it in a ``with``.
    Everywhere else, :func:`use_context` (which restores the previous context) is the rule.
    """
    _current.set(ctx)


def detached() -> RequestContext:
    """A context with the active identity and a fresh, unlinked token.

    Use it for work that must outlive the request that started it (a
    ``continue`` disconnect policy, a background run). The new token is not a
    child of the request's: the client leaving does not cancel it. The caller
    owns it and must cancel it when the work is no longer wanted.
    """
    base = current_context()
    return replace(base, token=CancellationToken(), deadline=None)
