"""The front ends (the HTTP routes, the MCP tools) hold no domain rule and reach the
services one way, checked on the source tree.

A rule a front end checks itself is a rule the other front end copies, then forgets or words
differently. Each rule below lives in its domain; this test fails when a front-end module
calls what checks it. The same rules are tested through both front ends in
``tests/mcp_api/test_mcp_server.py``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "heed"
FRONT_ENDS = sorted([*(SRC / "api").rglob("*.py"), *(SRC / "mcp").rglob("*.py")])
MCP_TOOLS = sorted((SRC / "mcp" / "tools").glob("*.py"))


@dataclass(frozen=True)
class Rule:
    """A domain rule, the names a front end would use to check it, and where it lives."""

    rule: str
    owner: str
    #: (front-end module relative to src/heed, function or None for the whole module)
    places: tuple[tuple[str, str | None], ...]
    #: attribute or function names a check of the rule calls or reads
    names: frozenset[str]


RULES = (
    Rule(
        "a session's bank must exist",
        "sessions/service.py (SessionService.create)",
        (("api/routes/sessions.py", None), ("mcp/tools/sessions.py", "start_turn")),
        frozenset({"get_bank", "find_bank", "memory"}),
    ),
    Rule(
        "remember_messages needs a bank",
        "sessions/service.py (SessionService.create, .update)",
        (
            ("api/routes/sessions.py", None),
            *((str(p.relative_to(SRC)), None) for p in MCP_TOOLS),
        ),
        frozenset({"remember_messages"}),
    ),
    Rule(
        "the reflect provider can be built",
        "reflect/service.py (ReflectService), reflect/runs.py (ReflectRuns.submit)",
        tuple((str(p.relative_to(SRC)), None) for p in FRONT_ENDS),
        frozenset({"agent", "check_provider", "provider"}),
    ),
)


def _scope(path: Path, function: str | None) -> ast.AST:
    tree = ast.parse(path.read_text(), str(path))
    if function is None:
        return tree
    for node in ast.walk(tree):
        if isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef) and node.name == function:
            return node
    raise AssertionError(f"{path}: no function {function}")


def _checks(scope: ast.AST, names: frozenset[str]) -> list[int]:
    """Lines where *scope* uses one of *names* (``x.get_bank(...)``, ``x.memory``; a flag
    such as ``remember_messages`` only where a condition tests it)."""
    found = set()
    for node in ast.walk(scope):
        if isinstance(node, ast.Attribute) and node.attr in names:
            if node.attr != "remember_messages" or _in_condition(scope, node):
                found.add(node.lineno)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in names:
            found.add(node.lineno)
    return sorted(found)


def _in_condition(scope: ast.AST, target: ast.AST) -> bool:
    for node in ast.walk(scope):
        if isinstance(node, ast.If | ast.IfExp | ast.Assert | ast.BoolOp):
            test = node.test if not isinstance(node, ast.BoolOp) else node
            if any(sub is target for sub in ast.walk(test)):
                return True
    return False


def test_no_front_end_checks_a_domain_rule() -> None:
    broken = []
    for rule in RULES:
        for module, function in rule.places:
            lines = _checks(_scope(SRC / module, function), rule.names)
            broken += [
                f"{module}:{line} checks {rule.rule!r} (it lives in {rule.owner})" for line in lines
            ]
    assert broken == [], "\n".join(broken)


def test_the_check_catches_a_route_that_looks_the_bank_up(tmp_path: Path) -> None:
    route = tmp_path / "sessions.py"
    route.write_text(
        "async def create_session(body, sessions, engine):\n"
        "    if body.remember_messages and not body.bank_id:\n"
        "        raise ValueError\n"
        "    await engine.get_bank(body.bank_id)\n"
    )
    scope = _scope(route, "create_session")
    assert _checks(scope, RULES[0].names) == [4]
    assert _checks(scope, RULES[1].names) == [2]


def _reads_app_state(path: Path) -> list[int]:
    """Lines of *path* that read ``<anything>.app.state`` or ``app.state``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Attribute) and node.attr == "state"):
            continue
        owner = node.value
        if (isinstance(owner, ast.Name) and owner.id == "app") or (
            isinstance(owner, ast.Attribute) and owner.attr == "app"
        ):
            found.append(node.lineno)
    return found


def test_only_the_dependencies_module_reads_app_state() -> None:
    """Routes and tools reach the services one typed way (:mod:`heed.api.deps`); the app
    itself (``api/app.py``) is the only writer."""
    allowed = {SRC / "api" / "deps.py", SRC / "api" / "app.py"}
    broken = [
        f"{path.relative_to(SRC)}:{line}"
        for path in FRONT_ENDS
        if path not in allowed
        for line in _reads_app_state(path)
    ]
    assert broken == [], "read app.state through heed.api.deps: " + ", ".join(broken)


def test_routes_do_not_probe_for_optional_services() -> None:
    """Every service exists once the composition root is built: no ``getattr(..., None)``."""
    broken = []
    for path in sorted((SRC / "api" / "routes").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr":
                broken.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert broken == []
