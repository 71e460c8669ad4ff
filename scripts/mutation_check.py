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

Only the relevant test files run, with ``-x``, so the check stays fast. The same
selection first runs unmutated and must pass (otherwise "red" would prove
nothing). Exit status 0 when every mutation is killed; 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
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
)


def run_pytest(tests: tuple[str, ...], pythonpath: str | None) -> tuple[int, str, float]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    summary = (proc.stdout.strip().splitlines() or [""])[-1]
    return proc.returncode, summary, time.monotonic() - started


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
    args = parser.parse_args()
    failures = 0
    if not args.skip_baseline:
        tests = tuple(t for m in MUTATIONS for t in m.tests)
        code, summary, seconds = run_pytest(tests, None)
        print(f"baseline (unmutated): exit {code} in {seconds:.1f} s: {summary}")
        if code != 0:
            print("baseline is red: mutation results would prove nothing")
            return 1
    with tempfile.TemporaryDirectory(prefix="heed-mutation-") as tmp:
        for mutation in MUTATIONS:
            root = mutated_copy(mutation, Path(tmp))
            code, summary, seconds = run_pytest(mutation.tests, str(root))
            killed = code != 0
            verdict = "killed (suite red)" if killed else "SURVIVED (suite green)"
            print(f"mutation {mutation.name}: {verdict} in {seconds:.1f} s: {summary}")
            failures += 0 if killed else 1
    if failures:
        print(f"{failures} mutation(s) survived: the tests do not guard the contract")
        return 1
    print("every mutation turned the suite red")
    return 0


if __name__ == "__main__":
    sys.exit(main())
