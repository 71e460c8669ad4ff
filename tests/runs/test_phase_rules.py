"""Every phase rule lives in heed.runs.state: no other module compares a run's phase."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "heed"
OWNERS = {SRC / "runs" / "state.py", SRC / "runs" / "model.py"}
PHASE_ATTRIBUTES = {"phase", "phase_enum"}


def _phase_comparisons(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for operand in [node.left, *node.comparators]:
            if isinstance(operand, ast.Attribute) and operand.attr in PHASE_ATTRIBUTES:
                lines.append(node.lineno)
    return lines


def test_no_module_outside_runs_state_compares_phases() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        if path in OWNERS:
            continue
        for line in _phase_comparisons(ast.parse(path.read_text(), str(path))):
            offenders.append(f"{path.relative_to(SRC)}:{line}")
    assert offenders == [], "use a predicate from heed.runs.state instead: " + ", ".join(offenders)


def test_the_check_finds_a_phase_comparison() -> None:
    tree = ast.parse("if run.phase == 'running':\n    pass\nok = run.phase_enum in PHASES\n")
    assert _phase_comparisons(tree) == [1, 3]
