"""A process-wide, thread-safe list of hooks: what :mod:`heed.llm.observe` (global
observers) and :mod:`heed.llm.usage` (call sinks, call admissions) register.

A hook is added at the end; removing one that is not there does nothing; a reader takes a
snapshot (a tuple, in the order they were added) and calls it outside the lock, so a hook
may add or remove hooks while it runs.
"""

from __future__ import annotations

import threading
from typing import Generic, TypeVar

__all__ = ["Hooks"]

T = TypeVar("T")


class Hooks(Generic[T]):
    """Hooks of one kind (module docstring)."""

    def __init__(self) -> None:
        self._items: list[T] = []
        self._lock = threading.Lock()

    def add(self, hook: T) -> None:
        """Add *hook* after the others (added twice, it is there twice)."""
        with self._lock:
            self._items.append(hook)

    def remove(self, hook: T) -> None:
        """Remove *hook* (its first occurrence); a no-op if it was not added."""
        with self._lock:
            if hook in self._items:
                self._items.remove(hook)

    def snapshot(self) -> tuple[T, ...]:
        """The hooks now, in the order they were added."""
        with self._lock:
            return tuple(self._items)
