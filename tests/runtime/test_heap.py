"""heed.runtime.heap: start-up objects frozen out of the garbage collector's walks."""

from __future__ import annotations

import gc
import weakref

from heed.runtime.heap import freeze_long_lived_objects, limit_malloc_arenas


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector can free it


def test_freezes_what_lives_and_collects_what_does_not() -> None:
    garbage = _Node()
    gone = weakref.ref(garbage)
    del garbage
    kept = _Node()
    try:
        frozen = freeze_long_lived_objects()
        assert gone() is None  # start-up's cyclic garbage was collected first
        assert frozen > 0 and gc.get_freeze_count() == frozen
        # the live object is no longer in any generation the collector walks
        assert not any(o is kept for o in gc.get_objects())
    finally:
        gc.unfreeze()
    assert any(o is kept for o in gc.get_objects())


def test_malloc_arenas_are_capped_only_when_asked() -> None:
    assert limit_malloc_arenas(0) is False  # 0 keeps glibc's default
    # glibc accepts the cap (these machines run glibc); elsewhere the call says it did nothing
    assert limit_malloc_arenas(8) is True
