"""The serving process's heap: the garbage collector's pauses and malloc's arenas.

CPython's cyclic collector walks every tracked object of the generations it collects, and a
full (oldest-generation) collection walks them all: after start-up that is the imported
modules, the settings, the loaded models' Python wrappers and every cache, several hundred
thousand objects that live as long as the process. Under a steady load of large recalls a
full collection then stopped every thread for about 100 ms, which showed up as single
requests taking 100 ms longer in stages that do almost nothing (measured with
``benchmarks/disconnect_storm.py --scenario retry``: canary p99 257 ms, 7.3x unloaded; with
the collector disabled, 78 ms).

:func:`freeze_long_lived_objects` moves everything alive once the server has started into
the collector's permanent generation (:func:`gc.freeze`), so later collections walk only what
was allocated since. Frozen objects are still freed by reference counting; only cyclic
garbage among them would never be collected, which is why this runs once, after start-up,
in the serving process alone (not in tests that build many apps in one process).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from typing import Final

__all__ = ["freeze_long_lived_objects", "limit_malloc_arenas"]


def freeze_long_lived_objects() -> int:
    """Collect what start-up left behind, then freeze the rest; returns how many were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


#: glibc's ``mallopt`` parameter for the most arenas malloc may create.
_M_ARENA_MAX: Final = -8


def limit_malloc_arenas(arenas: int) -> bool:
    """Cap glibc malloc's arenas at *arenas* (0: leave glibc's default); False where not glibc.

    glibc gives threads that contend for the heap arenas of their own, up to eight per core,
    each reserving memory in 64 MB mappings that are rarely returned. heed's worker threads
    allocate briefly and in turn, so the arenas mostly grew the process: under the retry loop
    of ``benchmarks/disconnect_storm.py`` RSS grew 20 MB in a minute, 22 MB of it in arena
    mappings; with two arenas it grew 7 MB and recall latency did not change. Call it before
    the serving threads start (arenas already made stay).
    """
    if arenas <= 0:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (AttributeError, OSError):  # not glibc (musl, macOS): nothing to tune
        return False
    return bool(mallopt(_M_ARENA_MAX, arenas))
