"""Keeping the garbage collector's pauses off the request path.

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

import gc

__all__ = ["freeze_long_lived_objects"]


def freeze_long_lived_objects() -> int:
    """Collect what start-up left behind, then freeze the rest; returns how many were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
