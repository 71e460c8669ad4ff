"""``scripts/mutation_check.py`` counts a kill only when pytest exits 1 with a named test
among the failures: real pytest runs on small test files, one outcome each.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "mutation_check.py"

CASES = """
import os
import pytest


def test_named():
    assert os.environ.get("BREAK") != "named"


def test_other():
    assert os.environ.get("BREAK") != "other"


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
def test_param(db):
    assert os.environ.get("BREAK") != db


def test_crash():
    if os.environ.get("BREAK") == "crash":
        os._exit(139)  # a crash, as a segfault ends a process
"""


@pytest.fixture(scope="module")
def check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutation_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def tests_dir(tmp_path: Path) -> Path:
    (tmp_path / "test_cases.py").write_text(CASES)
    return tmp_path


def outcome(
    check: ModuleType, tests_dir: Path, monkeypatch: pytest.MonkeyPatch, broken: str, *tests: str
) -> object:
    monkeypatch.setenv("BREAK", broken)
    return check.run_pytest(tests, None, cwd=tests_dir)


def test_the_named_test_failing_is_a_kill(
    check: ModuleType, tests_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    named = ("test_cases.py::test_named",)
    result = outcome(check, tests_dir, monkeypatch, "named", *named, "test_cases.py")
    assert result.code == 1 and result.failed == named
    assert check.is_kill(result, named)


def test_a_parametrized_case_of_the_named_test_is_a_kill(
    check: ModuleType, tests_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    named = ("test_cases.py::test_param",)
    result = outcome(check, tests_dir, monkeypatch, "postgresql", *named)
    assert result.failed == ("test_cases.py::test_param[postgresql]",)
    assert check.is_kill(result, named)


def test_another_test_failing_is_no_kill(
    check: ModuleType, tests_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    named = ("test_cases.py::test_named",)
    result = outcome(check, tests_dir, monkeypatch, "other", *named, "test_cases.py")
    assert result.code == 1 and result.failed == ("test_cases.py::test_other",)
    assert not check.is_kill(result, named)


def test_a_collection_error_is_no_kill(
    check: ModuleType, tests_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A mutation that breaks an import: the test module cannot be collected.
    (tests_dir / "code_under_test.py").write_text("def broken(:\n")
    (tests_dir / "test_cases.py").write_text("import code_under_test\n" + CASES)
    for tests in (("test_cases.py::test_named",), ("test_cases.py",)):
        result = outcome(check, tests_dir, monkeypatch, "named", *tests)
        assert result.code in (2, 4) and result.failed == (), result  # nothing ran
        assert not check.is_kill(result, tests)


def test_a_crash_is_no_kill_even_of_the_named_test(
    check: ModuleType, tests_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    named = ("test_cases.py::test_crash",)
    result = outcome(check, tests_dir, monkeypatch, "crash", *named)
    assert result.code == 139
    assert not check.is_kill(result, named)


def test_a_green_run_is_no_kill(
    check: ModuleType, tests_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    named = ("test_cases.py::test_named",)
    result = outcome(check, tests_dir, monkeypatch, "nothing", *named)
    assert result.code == 0 and not check.is_kill(result, named)


def test_every_mutation_names_a_test_and_runs_it_first(check: ModuleType) -> None:
    for mutation in check.MUTATIONS:
        assert mutation.named, mutation.name
        assert mutation.ordered[: len(mutation.named)] == mutation.named
        assert set(mutation.ordered) == set(mutation.tests)
