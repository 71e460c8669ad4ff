#!/usr/bin/env python3
"""Mutation check for the run-state contract: each mutation must turn the suite red.

Mutations (applied to a temporary copy of ``src/heed``, never to the working
tree, and put first on ``PYTHONPATH`` so every test -- including servers
started as subprocesses -- imports the mutated code):

1. ``attachable-always-true``: :func:`heed.runs.state.is_attachable` returns True
   for every run (a cancelling run would be replayed to clients: the attach loop).
2. ``reaper-never-reclaims``: :func:`heed.runs.reaper.reclaim` never finalizes
   anything (a stale cancelling run would keep its session busy forever).
3. ``run-end-skips-on-terminal``: :func:`heed.runs.ending.end_run` never calls the
   kind's ``on_terminal`` hook (a task interrupted by shutdown would lose its wakeup).

One more per predicate of :mod:`heed.runs.state` that a rule depends on, each run against
a behaviour test of the rule (the predicate's own tests in ``tests/runs/test_state.py``
fail too, but a mutation a unit test alone catches would prove little):

4. ``queued-never-matches``: ``is_queued`` is always False (a queued run would never be
   started after the busy one, nor cancelled without starting).
5. ``running-never-matches``: ``is_running`` is always False (a cancel would not reach a
   running worker).
6. ``interrupted-never-matches``: ``is_interrupted`` is always False (a turn killed with
   its process would lose its partial output: ``on_interrupted`` never runs).
7. ``worker-ignores-remote-cancel``: ``worker_should_stop`` is always False (a cancel
   written by another process would never stop this process's worker).
8. ``lost-running-becomes-cancelled``: ``ending_for_lost_worker`` ends a running run
   ``cancelled`` (a dead worker's run must be ``interrupted``).
9. ``reaper-ignores-expired-leases``: ``reaper_may_end`` never ends a running run (a run
   whose worker's lease expired would stay running forever).
10. ``dead-pid-looks-alive``: ``worker_is_dead`` trusts every lease of this host (a
    restarted process would leave its predecessor's runs running).

And one for the rule a streamed reflect adds:

11. ``streamed-reflect-ignores-disconnect``: a reflect stream whose client left does not
    cancel its run (the work would go on for nobody).

And two for heed as several processes (PostgreSQL and Redis):

12. ``admission-without-session-lock``: the run store admits without holding the session's
    lock (on PostgreSQL, two instances could then both start a turn of one session).
13. ``cancel-not-announced``: a cancel is not announced on ``runs:cancel`` (a worker in
    another process would run on until its next lease renewal).

And four for background operations that survive dead workers (issue 30):

14. ``quarantine-never-happens``: ``ending_for_lost_worker`` requeues a run of a kind with
    ``max_attempts`` however often its worker died (an operation that kills its worker
    would be claimed forever); killed by the kill -9 test with real processes.
15. ``max-attempts-ignored``: ``ending_for_lost_worker`` ignores ``max_attempts`` (a
    background operation whose worker died would be interrupted, never re-run).
16. ``requeue-unguarded``: a requeue is not guarded by the worker that died (a reaper that
    read the row before another process requeued and claimed it again would requeue a live
    worker's run).
17. ``requeued-worker-keeps-running``: ``worker_should_stop`` ignores who holds the row (a
    stalled worker whose run was requeued elsewhere would run on beside the new one).

Only the relevant test files run, with ``-x``, so the check stays fast. The same
selection first runs unmutated and must pass (otherwise "red" would prove
nothing). A mutation is killed only when pytest exits 1 (tests ran and some failed) with
one of its named tests (the node ids in its list, else its files) among the failures: a
collection error, a crash, an interrupted run or another test failing is not a kill. The
named tests run first, so ``-x`` stops at theirs. Exit status 0 when every mutation is
killed; 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "heed"


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # relative to src/heed
    old: str
    new: str
    tests: tuple[str, ...]

    @property
    def named(self) -> tuple[str, ...]:
        """The tests whose failure kills the mutation: its node ids, else its files."""
        return tuple(t for t in self.tests if "::" in t) or self.tests

    @property
    def ordered(self) -> tuple[str, ...]:
        """Its tests, the named ones first (so ``-x`` stops at one of theirs)."""
        return (*self.named, *(t for t in self.tests if t not in self.named))


MUTATIONS = (
    Mutation(
        "attachable-always-true",
        "runs/state.py",
        "    return parse_phase(run.phase) in _ATTACHABLE\n",
        "    return True  # MUTATION\n",
        (
            "tests/runs/test_state.py",
            "tests/runs/test_http_sessions.py::test_idle_session_with_wedged_cancelling_run_never_loops",
        ),
    ),
    Mutation(
        "reaper-never-reclaims",
        "runs/reaper.py",
        '    """Finalize *run* if the rules above say so; returns the new row or ``None``."""\n',
        '    """Finalize *run* if the rules above say so; returns the new row or ``None``."""\n'
        "    return None  # MUTATION\n",
        (
            "tests/runs/test_manager.py",
            "tests/runs/test_http_sessions.py::test_wakeup_delivered_when_stale_cancelling_run_is_reclaimed",
        ),
    ),
    Mutation(
        "run-end-skips-on-terminal",
        "runs/ending.py",
        "                if spec is not None and spec.on_terminal is not None:\n",
        "                if False:  # MUTATION\n",
        (
            "tests/runs/test_restart_recovery.py::"
            "test_graceful_shutdown_records_the_wakeup_of_an_interrupted_task",
        ),
    ),
    Mutation(
        "queued-never-matches",
        "runs/state.py",
        "    return parse_phase(run.phase) is Phase.QUEUED\n",
        "    return False  # MUTATION\n",
        ("tests/runs/test_manager.py::test_enqueue_starts_after_the_busy_run",),
    ),
    Mutation(
        "running-never-matches",
        "runs/state.py",
        "    return parse_phase(run.phase) is Phase.RUNNING\n",
        "    return False  # MUTATION\n",
        (
            "tests/runs/test_manager.py::test_cancel_running_is_immediate_for_clients_and_idempotent",
        ),
    ),
    Mutation(
        "interrupted-never-matches",
        "runs/state.py",
        "    return parse_phase(run.phase) is Phase.INTERRUPTED\n",
        "    return False  # MUTATION\n",
        ("tests/runs/test_restart_recovery.py::test_sigkill_mid_turn_then_restart",),
    ),
    Mutation(
        "worker-ignores-remote-cancel",
        "runs/state.py",
        "    return phase is Phase.CANCELLING or phase in TERMINAL_PHASES\n",
        "    return False  # MUTATION\n",
        (
            "tests/runs/test_manager.py::"
            "test_a_cancel_written_by_another_process_stops_the_local_worker",
        ),
    ),
    Mutation(
        "lost-running-becomes-cancelled",
        "runs/state.py",
        "    if phase is Phase.RUNNING:\n        return Phase.INTERRUPTED\n",
        "    if phase is Phase.RUNNING:\n        return Phase.CANCELLED  # MUTATION\n",
        ("tests/runs/test_manager.py::test_restart_recovery_interrupts_runs_of_a_dead_process",),
    ),
    Mutation(
        "reaper-ignores-expired-leases",
        "runs/state.py",
        "        return not worker_is_live(run, now)\n",
        "        return False  # MUTATION\n",
        ("tests/runs/test_manager.py::test_expired_lease_running_run_becomes_interrupted",),
    ),
    Mutation(
        "dead-pid-looks-alive",
        "runs/state.py",
        "    return pid == os.getpid() or not pid_alive(pid)\n",
        "    return False  # MUTATION\n",
        ("tests/runs/test_manager.py::test_restart_recovery_interrupts_runs_of_a_dead_process",),
    ),
    Mutation(
        "streamed-reflect-ignores-disconnect",
        "api/routes/reflect.py",
        '    if on_disconnect == "cancel":\n',
        "    if False:  # MUTATION\n",
        (
            "tests/reflect/test_reflect_runs.py::"
            "test_a_client_that_leaves_cancels_the_run_by_default",
        ),
    ),
    Mutation(
        "admission-without-session-lock",
        "storage/run_store.py",
        "            if run.session_id is not None:\n"
        '                self.db.lock(conn, f"session:{run.session_id}")\n'
        "            siblings = (\n",
        "            siblings = (  # MUTATION\n",
        (
            "tests/runs/test_store.py::test_admission_is_atomic_across_threads",
            "tests/runs/test_cluster.py::test_admission_is_atomic_across_instances",
        ),
    ),
    Mutation(
        "cancel-not-announced",
        "runs/manager.py",
        "                    self.broker.publish(CANCEL_TOPIC, "
        '{"run_id": run_id, "reason": reason})\n',
        "                    pass  # MUTATION\n",
        ("tests/runs/test_cluster.py::test_a_turn_on_a_streams_resumes_and_cancels_from_b",),
    ),
    Mutation(
        "quarantine-never-happens",
        "runs/state.py",
        "        return Phase.QUEUED if run.attempts + 1 < max_attempts else Phase.FAILED\n",
        "        return Phase.QUEUED  # MUTATION\n",
        ("tests/runs/test_requeue.py::test_three_worker_deaths_quarantine_an_operation[sqlite]",),
    ),
    Mutation(
        "max-attempts-ignored",
        "runs/state.py",
        "    if phase is Phase.RUNNING and max_attempts is not None:\n",
        "    if False:  # MUTATION\n",
        ("tests/runs/test_requeue.py::test_three_lost_leases_requeue_twice_then_quarantine",),
    ),
    Mutation(
        "requeue-unguarded",
        "runs/ending.py",
        "    return [Step(Phase.QUEUED, (Phase.RUNNING,), fields, event, run.worker_id)]\n",
        "    return [Step(Phase.QUEUED, (Phase.RUNNING,), fields, event, None)]  # MUTATION\n",
        (
            "tests/runs/test_requeue.py::"
            "test_a_reaper_that_read_the_row_before_the_requeue_writes_nothing",
        ),
    ),
    Mutation(
        "requeued-worker-keeps-running",
        "runs/state.py",
        "    if worker_id is not None and run.worker_id != worker_id:\n        return True\n",
        "    if worker_id is not None and run.worker_id != worker_id:\n"
        "        return False  # MUTATION\n",
        (
            "tests/runs/test_requeue.py::"
            "test_a_slow_worker_whose_run_was_requeued_stops_and_writes_nothing",
        ),
    ),
)


#: pytest's exit status when tests ran and some failed (``pytest.ExitCode.TESTS_FAILED``).
TESTS_FAILED = 1
_FAILED_LINE = re.compile(r"^FAILED (\S+)")


@dataclass(frozen=True)
class Outcome:
    """One pytest run: its exit status, the node ids that failed, its last line."""

    code: int
    failed: tuple[str, ...]
    summary: str
    seconds: float


def run_pytest(
    tests: tuple[str, ...], pythonpath: str | None, *, cwd: Path = ROOT, stop_first: bool = True
) -> Outcome:
    """Run pytest on *tests* in *cwd* (*pythonpath* first on the path); its outcome."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    started = time.monotonic()
    options = ["-x"] if stop_first else []
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *options, "-q", "-rf", "-p", "no:cacheprovider", *tests],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
    )
    lines = proc.stdout.strip().splitlines()
    failed = tuple(m.group(1) for line in lines if (m := _FAILED_LINE.match(line)))
    return Outcome(proc.returncode, failed, (lines or [""])[-1], time.monotonic() - started)


def _is_named(node_id: str, named: tuple[str, ...]) -> bool:
    """Whether the failed *node_id* is one of *named* (a node id, a parametrized case of
    one, or a test in a named file)."""
    return any(node_id == name or node_id.startswith((f"{name}[", f"{name}::")) for name in named)


def is_kill(outcome: Outcome, named: tuple[str, ...]) -> bool:
    """A kill: pytest exited 1 (tests ran, some failed) with a *named* test among the
    failures. Any other exit (a collection error, a crash, an interruption) or only other
    tests failing is not."""
    return outcome.code == TESTS_FAILED and any(_is_named(f, named) for f in outcome.failed)


def mutated_copy(mutation: Mutation, workdir: Path) -> Path:
    target_root = workdir / mutation.name
    shutil.copytree(SRC, target_root / "heed", ignore=shutil.ignore_patterns("__pycache__"))
    target = target_root / "heed" / mutation.path
    text = target.read_text()
    if text.count(mutation.old) != 1:
        raise SystemExit(f"mutation {mutation.name}: anchor not found once in {mutation.path}")
    target.write_text(text.replace(mutation.old, mutation.new))
    return target_root


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skip-baseline", action="store_true", help="do not run unmutated first")
    parser.add_argument(
        "--only", action="append", metavar="NAME", help="run only this mutation (repeatable)"
    )
    args = parser.parse_args()
    selected = [m for m in MUTATIONS if not args.only or m.name in args.only]
    unknown = set(args.only or ()) - {m.name for m in MUTATIONS}
    if unknown:
        parser.error(f"unknown mutation(s): {', '.join(sorted(unknown))}")
    failures = 0
    if not args.skip_baseline:
        tests = tuple(dict.fromkeys(t for m in selected for t in m.tests))
        baseline = run_pytest(tests, None)
        print(f"baseline (unmutated): exit {baseline.code} in {baseline.seconds:.1f} s")
        print(f"  {baseline.summary}")
        if baseline.code != 0:
            print("baseline is red: mutation results would prove nothing")
            return 1
    with tempfile.TemporaryDirectory(prefix="heed-mutation-") as tmp:
        for mutation in selected:
            root = mutated_copy(mutation, Path(tmp))
            outcome = run_pytest(mutation.ordered, str(root))
            killed = is_kill(outcome, mutation.named)
            if killed:
                verdict = "killed (a named test failed)"
            elif outcome.code == 0:
                verdict = "SURVIVED (suite green)"
            else:
                verdict = f"SURVIVED (exit {outcome.code}, failed: {list(outcome.failed)})"
            print(f"mutation {mutation.name}: {verdict} in {outcome.seconds:.1f} s")
            print(f"  {outcome.summary}")
            failures += 0 if killed else 1
    if failures:
        print(f"{failures} mutation(s) survived: the tests do not guard the contract")
        return 1
    print("every mutation turned the suite red")
    return 0


if __name__ == "__main__":
    sys.exit(main())
