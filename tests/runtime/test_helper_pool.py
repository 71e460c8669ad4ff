"""The shared helper pools of :mod:`heed.runtime.offload` and the jobs run on them."""

from __future__ import annotations

import threading

import pytest

from heed.runtime import (
    CancellationToken,
    RequestContext,
    current_token,
    helper_pool,
    run_concurrently,
    use_context,
)


def test_one_pool_per_name_shared_by_every_caller() -> None:
    first = helper_pool("heed-test-helpers", 2)
    assert helper_pool("heed-test-helpers", 5) is first
    assert helper_pool("heed-test-other-helpers", 2) is not first


def test_jobs_run_at_once_on_the_calling_thread_and_helpers() -> None:
    both = threading.Barrier(2, timeout=5)  # one thread alone would break it
    threads: set[str] = set()

    def job() -> None:
        threads.add(threading.current_thread().name)
        both.wait()

    run_concurrently([job, job], 2, pool="heed-test-helpers", threads=2)
    assert threading.current_thread().name in threads
    assert len(threads) == 2


def test_helpers_see_the_callers_token() -> None:
    token = CancellationToken()
    seen: list[CancellationToken | None] = []

    def job() -> None:
        seen.append(current_token())

    with use_context(RequestContext(token=token)):
        run_concurrently([job] * 4, 2, pool="heed-test-helpers", threads=2)
    assert seen == [token] * 4


def test_the_first_error_is_raised_and_no_job_starts_after_it() -> None:
    ran: list[int] = []

    def job(n: int) -> None:
        ran.append(n)
        if n == 0:
            raise ValueError("part 0 failed")

    jobs = [lambda n=n: job(n) for n in range(6)]
    with pytest.raises(ValueError, match="part 0 failed"):
        run_concurrently(jobs, 1, pool="heed-test-helpers", threads=2)
    assert ran == [0]
