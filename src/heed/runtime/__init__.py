"""heed's runtime: cancellation tokens, the request context, work slots and offload.

Nothing here imports a web framework; the HTTP layer, the engine and the
workers all build on these pieces. See docs/architecture.md for how a token
travels from a socket to a worker thread.
"""

from heed.runtime.cancellation import (
    DEADLINE_EXCEEDED,
    CancellationToken,
    OperationCancelled,
    reraise_cancellation,
)
from heed.runtime.context import (
    DEFAULT_TENANT,
    RequestContext,
    current_context,
    current_token,
    detached,
    raise_if_cancelled,
    scoped_value,
    set_context,
    use_context,
)
from heed.runtime.offload import (
    ChildFd,
    ProcessLimits,
    WorkerLimitExceeded,
    WorkerProcessDied,
    helper_pool,
    run_blocking,
    run_concurrently,
    run_in_process,
    run_in_thread,
)
from heed.runtime.retry import retry_async
from heed.runtime.slots import CpuBudget, Lane, LaneFull, Lanes, LaneStats
from heed.runtime.tally import TokenTally, current_tally, tallying
from heed.runtime.tasks import run_all, settle, sleep_unless_cancelled, wait_for_event

__all__ = [
    "DEADLINE_EXCEEDED",
    "DEFAULT_TENANT",
    "CancellationToken",
    "ChildFd",
    "CpuBudget",
    "Lane",
    "LaneFull",
    "LaneStats",
    "Lanes",
    "OperationCancelled",
    "ProcessLimits",
    "RequestContext",
    "TokenTally",
    "WorkerLimitExceeded",
    "WorkerProcessDied",
    "current_context",
    "current_tally",
    "current_token",
    "detached",
    "helper_pool",
    "raise_if_cancelled",
    "reraise_cancellation",
    "retry_async",
    "run_all",
    "run_blocking",
    "run_concurrently",
    "run_in_process",
    "run_in_thread",
    "scoped_value",
    "set_context",
    "settle",
    "sleep_unless_cancelled",
    "tallying",
    "use_context",
    "wait_for_event",
]
