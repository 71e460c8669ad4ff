"""The shared run-state predicates: both directions of every rule."""

from __future__ import annotations

import dataclasses

import pytest

from heed.runs.model import TERMINAL_PHASES, TRANSITIONS, Phase, Run, allowed_sources
from heed.runs.state import (
    cancel_is_stale,
    ending_for_lost_worker,
    is_attachable,
    is_interrupted,
    is_lifecycle_busy,
    is_quarantined,
    is_queued,
    is_running,
    is_wedged,
    reaper_may_end,
    worker_is_dead,
    worker_is_live,
    worker_should_stop,
)

NOW = 1_000_000.0
WINDOW = 180.0


def make_run(phase: str, **fields: object) -> Run:
    base = Run(id="run_x", kind="turn", tenant="default", phase=phase, created_at=NOW - 1000)
    return dataclasses.replace(base, **fields)  # type: ignore[arg-type]


def live(**fields: object) -> dict[str, object]:
    return {"worker_id": "w1", "lease_expires_at": NOW + 30, **fields}


def dead(**fields: object) -> dict[str, object]:
    return {"worker_id": "w1", "lease_expires_at": NOW - 1, **fields}


def test_running_run_is_attachable_and_busy() -> None:
    run = make_run("running", started_at=NOW - 5, **live())
    assert is_attachable(run)
    assert is_lifecycle_busy(run, NOW, WINDOW)


def test_queued_run_is_attachable_and_busy() -> None:
    run = make_run("queued")
    assert is_attachable(run)
    assert is_lifecycle_busy(run, NOW, WINDOW)


def test_fresh_cancelling_run_is_busy_but_not_attachable() -> None:
    run = make_run("cancelling", started_at=NOW - 5, cancelled_at=NOW - 1, **live())
    assert not is_attachable(run)
    assert is_lifecycle_busy(run, NOW, WINDOW)
    assert not cancel_is_stale(run, NOW, WINDOW)


def test_fresh_cancelling_run_without_live_worker_is_still_busy() -> None:
    run = make_run("cancelling", started_at=NOW - 500, cancelled_at=NOW - 1, **dead())
    assert is_lifecycle_busy(run, NOW, WINDOW)
    assert not cancel_is_stale(run, NOW, WINDOW)


def test_stale_cancelling_run_without_live_worker_is_reclaimable() -> None:
    run = make_run("cancelling", started_at=NOW - 500, cancelled_at=NOW - 200, **dead())
    assert cancel_is_stale(run, NOW, WINDOW)
    assert not is_lifecycle_busy(run, NOW, WINDOW)
    assert not is_attachable(run)
    assert not is_wedged(run, NOW, WINDOW)


def test_old_cancelling_run_with_live_worker_is_never_stale_but_wedged() -> None:
    run = make_run("cancelling", started_at=NOW - 5000, cancelled_at=NOW - 4000, **live())
    assert not cancel_is_stale(run, NOW, WINDOW)
    assert is_lifecycle_busy(run, NOW, WINDOW)
    assert is_wedged(run, NOW, WINDOW)


def test_age_comes_from_cancelled_at_not_started_at() -> None:
    # A long turn cancelled a moment ago is not an orphan.
    run = make_run("cancelling", started_at=NOW - 10_000, cancelled_at=NOW - 2, **dead())
    assert not cancel_is_stale(run, NOW, WINDOW)
    # ... and the same turn cancelled long ago is.
    old = dataclasses.replace(run, cancelled_at=NOW - 181)
    assert cancel_is_stale(old, NOW, WINDOW)


def test_age_falls_back_to_started_at_when_no_cancelled_at() -> None:
    young = make_run("cancelling", started_at=NOW - 10, created_at=NOW - 9999, **dead())
    assert not cancel_is_stale(young, NOW, WINDOW)
    old = make_run("cancelling", started_at=NOW - 200, **dead())
    assert cancel_is_stale(old, NOW, WINDOW)


def test_window_is_configurable() -> None:
    run = make_run("cancelling", cancelled_at=NOW - 2, **dead())
    assert cancel_is_stale(run, NOW, 1.0)
    assert not cancel_is_stale(run, NOW, 3.0)


@pytest.mark.parametrize("phase", ["cancelled", "completed", "failed", "interrupted"])
def test_terminal_runs_are_neither_attachable_nor_busy(phase: str) -> None:
    run = make_run(phase, cancelled_at=NOW - 1, **live())
    assert not is_attachable(run)
    assert not is_lifecycle_busy(run, NOW, WINDOW)
    assert not cancel_is_stale(run, NOW, WINDOW)


@pytest.mark.parametrize("phase", ["", "   ", "starting", "finalizing", "RUNNING!"])
def test_unknown_or_blank_phase_is_never_attachable(phase: str) -> None:
    with_live = make_run(phase, **live())
    with_dead = make_run(phase, **dead())
    assert not is_attachable(with_live)
    assert not is_attachable(with_dead)
    # busy only while a live worker holds it; never stale, never blocks forever
    assert is_lifecycle_busy(with_live, NOW, WINDOW)
    assert not is_lifecycle_busy(with_dead, NOW, WINDOW)
    assert not cancel_is_stale(with_dead, NOW, WINDOW)


def test_phase_parsing_tolerates_case_and_whitespace() -> None:
    assert is_attachable(make_run(" Running "))
    assert not is_attachable(make_run(" Cancelling"))
    assert is_lifecycle_busy(make_run("CANCELLING", cancelled_at=NOW - 1), NOW, WINDOW)


def test_lease_liveness() -> None:
    assert worker_is_live(make_run("running", **live()), NOW)
    assert not worker_is_live(make_run("running", **dead()), NOW)
    assert not worker_is_live(make_run("running", lease_expires_at=NOW + 10), NOW)


def test_terminal_phases_are_absorbing_in_the_transition_table() -> None:
    for phase in TERMINAL_PHASES:
        assert TRANSITIONS[phase] == frozenset()
        assert phase not in allowed_sources(Phase.COMPLETED)
        assert phase not in allowed_sources(Phase.CANCELLED)
    assert allowed_sources(Phase.CANCELLING) == {Phase.RUNNING}
    # the one way back to the queue: a requeue after the worker died
    assert allowed_sources(Phase.QUEUED) == {Phase.RUNNING}


# -- the smaller questions: each in both directions ---------------------------------------

ALL_PHASES = [p.value for p in Phase] + ["", "paused"]


@pytest.mark.parametrize("phase", ALL_PHASES)
def test_queued_running_interrupted_name_exactly_one_phase(phase: str) -> None:
    run = make_run(phase)
    assert is_queued(run) is (phase == "queued")
    assert is_running(run) is (phase == "running")
    assert is_interrupted(run) is (phase == "interrupted")


@pytest.mark.parametrize("phase", ALL_PHASES)
def test_a_local_worker_stops_once_cancelling_or_terminal(phase: str) -> None:
    expected = phase == "cancelling" or phase in {p.value for p in TERMINAL_PHASES}
    assert worker_should_stop(make_run(phase)) is expected


@pytest.mark.parametrize(
    ("phase", "ending"),
    [("running", Phase.INTERRUPTED), ("cancelling", Phase.CANCELLED), ("queued", None)]
    + [(p.value, None) for p in TERMINAL_PHASES]
    + [("", None), ("paused", None)],
)
def test_ending_for_a_lost_worker(phase: str, ending: Phase | None) -> None:
    assert ending_for_lost_worker(make_run(phase)) is ending
    assert ending_for_lost_worker(make_run(phase), None) is ending


@pytest.mark.parametrize(
    ("attempts", "max_attempts", "outcome"),
    [
        (0, 3, Phase.QUEUED),  # first death: requeued (attempt 1)
        (1, 3, Phase.QUEUED),  # second death: requeued (attempt 2)
        (2, 3, Phase.FAILED),  # third death reaches max_attempts: quarantined
        (5, 3, Phase.FAILED),  # past it (a lowered limit): quarantined, never requeued
        (0, 1, Phase.FAILED),  # one attempt only: the first death quarantines
        (0, 2, Phase.QUEUED),
        (1, 2, Phase.FAILED),
    ],
)
def test_a_lost_worker_of_a_kind_with_max_attempts_is_requeued_then_quarantined(
    attempts: int, max_attempts: int, outcome: Phase
) -> None:
    run = make_run("running", attempts=attempts, **dead())
    assert ending_for_lost_worker(run, max_attempts) is outcome


@pytest.mark.parametrize("phase", [p.value for p in Phase if p is not Phase.RUNNING] + ["", "x"])
def test_only_a_running_run_is_ever_requeued_or_quarantined(phase: str) -> None:
    # a cancelling run is cancelled (the user asked), whatever attempts it has left
    expected = Phase.CANCELLED if phase == "cancelling" else None
    for attempts in (0, 1, 2, 9):
        run = make_run(phase, attempts=attempts, **dead())
        assert ending_for_lost_worker(run, 3) is expected


def test_is_quarantined_needs_failed_attempts_and_the_marker() -> None:
    error = "quarantined: its worker died 3 times"
    assert is_quarantined(make_run("failed", attempts=3, error=error))
    assert not is_quarantined(make_run("failed", attempts=0, error=error))
    assert not is_quarantined(make_run("failed", attempts=2, error="ValueError: boom"))
    assert not is_quarantined(make_run("failed", attempts=2, error=None))
    for phase in ALL_PHASES:
        if phase != "failed":
            assert not is_quarantined(make_run(phase, attempts=3, error=error))


def test_a_local_worker_stops_once_its_row_is_held_by_another() -> None:
    mine = make_run("running", **live())
    assert not worker_should_stop(mine, "w1")
    assert worker_should_stop(mine, "w2")  # claimed again by another worker
    requeued = make_run("queued", attempts=1)
    assert worker_should_stop(requeued, "w1")  # requeued after w1's lease expired
    assert not worker_should_stop(requeued)  # without a worker id: the phase rule alone


def test_reaper_may_end_a_running_run_only_once_its_lease_expired() -> None:
    assert reaper_may_end(make_run("running", **dead()), NOW, WINDOW)
    assert not reaper_may_end(make_run("running", **live()), NOW, WINDOW)


def test_reaper_may_end_a_cancelling_run_only_when_stale() -> None:
    stale = make_run("cancelling", cancelled_at=NOW - WINDOW - 1, **dead())
    fresh = make_run("cancelling", cancelled_at=NOW - 1, **dead())
    wedged = make_run("cancelling", cancelled_at=NOW - WINDOW - 1, **live())
    assert reaper_may_end(stale, NOW, WINDOW)
    assert not reaper_may_end(fresh, NOW, WINDOW)
    assert not reaper_may_end(wedged, NOW, WINDOW)


@pytest.mark.parametrize("phase", ["queued", "completed", "cancelled", "failed", "interrupted"])
def test_reaper_never_ends_queued_or_terminal_runs(phase: str) -> None:
    assert not reaper_may_end(make_run(phase, **dead()), NOW, WINDOW)


def test_worker_is_dead_follows_the_lease_and_the_pid() -> None:
    me = "host-a:4242:n0"
    same_host_alive = make_run("running", worker_id="host-a:77:n1", lease_expires_at=NOW + 30)
    assert not worker_is_dead(
        same_host_alive, NOW, me, pid_alive=lambda pid: True, hostname="host-a"
    )
    assert worker_is_dead(same_host_alive, NOW, me, pid_alive=lambda pid: False, hostname="host-a")
    other_host = make_run("running", worker_id="host-b:77:n1", lease_expires_at=NOW + 30)
    assert not worker_is_dead(other_host, NOW, me, pid_alive=lambda pid: False, hostname="host-a")
    mine = make_run("running", worker_id=me, lease_expires_at=NOW + 30)
    assert not worker_is_dead(mine, NOW, me, pid_alive=lambda pid: False, hostname="host-a")
    expired = make_run("running", worker_id="host-b:77:n1", lease_expires_at=NOW - 1)
    assert worker_is_dead(expired, NOW, me, pid_alive=lambda pid: True, hostname="host-a")
    no_worker = make_run("running")
    assert worker_is_dead(no_worker, NOW, me, hostname="host-a")
