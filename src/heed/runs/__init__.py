"""Runs: every long piece of work (turn, background task, async retain, reflect).

- :mod:`heed.runs.model`: :class:`Run`, :class:`Phase`, allowed transitions.
- :mod:`heed.runs.state`: the shared predicates every reader uses
  (``is_attachable``, ``is_lifecycle_busy``, ``cancel_is_stale``).
- :mod:`heed.runs.store`: the :class:`RunStore` interface (SQLite implementation
  in :mod:`heed.storage.run_store`).
- :mod:`heed.runs.journal`: durable append then fan-out; replay-then-tail reads.
- :mod:`heed.runs.broker`: the fan-out interface (in-process now, Redis later).

See docs/run-state-contract.md for the invariants.
"""

from heed.runs.model import (
    TERMINAL_EVENT_TYPES,
    TERMINAL_PHASES,
    Phase,
    Run,
    RunEvent,
    Source,
    new_run_id,
    parse_phase,
)
from heed.runs.state import (
    DEFAULT_UNWIND_WINDOW,
    cancel_is_stale,
    is_attachable,
    is_lifecycle_busy,
    is_wedged,
    worker_is_live,
)

__all__ = [
    "DEFAULT_UNWIND_WINDOW",
    "TERMINAL_EVENT_TYPES",
    "TERMINAL_PHASES",
    "Phase",
    "Run",
    "RunEvent",
    "Source",
    "cancel_is_stale",
    "is_attachable",
    "is_lifecycle_busy",
    "is_wedged",
    "new_run_id",
    "parse_phase",
    "worker_is_live",
]
