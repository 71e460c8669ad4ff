"""A run's LLM token tally: what the model calls made under one piece of work cost.

The run manager opens a :func:`tallying` block around each run's worker; the LLM layer
adds every call made in that context (:meth:`TokenTally.add`), and the manager puts
:meth:`TokenTally.as_dict` into the run's result as ``llm_usage``. A task started inside
the block inherits the tally with the context, so its calls count too. Without a block,
:func:`current_tally` is ``None`` and nothing is counted.

This module knows nothing of providers or banks: a *kind* is any short word naming the
work (``reflect``, ``extraction``...).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from typing import Any

from heed.runtime.context import scoped_value

__all__ = ["TokenTally", "current_tally", "tallying"]


class TokenTally:
    """Prompt and completion tokens and calls, by kind of work; thread-safe."""

    def __init__(
        self,
        run_id: str | None = None,
        on_wait: Callable[[dict[str, Any]], Awaitable[object]] | None = None,
    ) -> None:
        #: The run whose calls these are (a trace id for the calls' records), if any.
        self.run_id = run_id
        self._on_wait = on_wait
        self._lock = threading.Lock()
        self._by_kind: dict[str, list[int]] = {}

    def add(self, kind: str, prompt_tokens: int, completion_tokens: int) -> None:
        """Count one call of *kind*."""
        with self._lock:
            counts = self._by_kind.setdefault(kind, [0, 0, 0])
            counts[0] += prompt_tokens
            counts[1] += completion_tokens
            counts[2] += 1

    async def waiting(self, why: dict[str, Any]) -> None:
        """Tell the work's owner its calls wait (*why*: a budget's reason, as JSON); the run
        manager journals it as a ``progress`` event. Without an owner: nothing."""
        if self._on_wait is not None:
            await self._on_wait(why)

    @property
    def calls(self) -> int:
        """How many calls were counted."""
        with self._lock:
            return sum(c[2] for c in self._by_kind.values())

    def as_dict(self) -> dict[str, Any]:
        """``{prompt_tokens, completion_tokens, total_tokens, calls, by_kind: {kind: {...}}}``."""
        with self._lock:
            by_kind = {
                kind: {
                    "prompt_tokens": c[0],
                    "completion_tokens": c[1],
                    "total_tokens": c[0] + c[1],
                    "calls": c[2],
                }
                for kind, c in sorted(self._by_kind.items())
            }
        prompt = sum(v["prompt_tokens"] for v in by_kind.values())
        completion = sum(v["completion_tokens"] for v in by_kind.values())
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "calls": sum(v["calls"] for v in by_kind.values()),
            "by_kind": by_kind,
        }


_current: ContextVar[TokenTally | None] = ContextVar("heed_token_tally", default=None)


@contextlib.contextmanager
def tallying(
    run_id: str | None = None,
    on_wait: Callable[[dict[str, Any]], Awaitable[object]] | None = None,
) -> Iterator[TokenTally]:
    """Count the LLM calls made in this context, until the block ends, in a fresh tally
    (told with *on_wait* when they wait: :meth:`TokenTally.waiting`)."""
    tally = TokenTally(run_id, on_wait)
    with scoped_value(_current, tally):
        yield tally


def current_tally() -> TokenTally | None:
    """The tally of the work running in this context, or ``None``."""
    return _current.get()
