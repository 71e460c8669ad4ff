"""One vocabulary of journal events: the Python enum, every writer, and the web UI agree."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from heed.runs.events import TERMINAL_EVENT_TYPES, EventType

SRC = Path(__file__).resolve().parents[2] / "src" / "heed"
EVENTS_JS = SRC / "web" / "static" / "events.js"
#: Calls whose first argument is a journal event type (``append`` only on a journal).
WRITERS = {"emit", "_emit", "listener"}


def _js_events() -> dict[str, str]:
    body = EVENTS_JS.read_text()
    block = body[body.index("Object.freeze({") : body.index("});")]
    return dict(re.findall(r"(\w+): \"(\w+)\"", block))


def test_the_web_ui_knows_exactly_the_python_event_types() -> None:
    assert _js_events() == {member.name: member.value for member in EventType}
    terminal = re.search(r"TERMINAL_EVENTS = new Set\(\[(.*)\]\)", EVENTS_JS.read_text())
    assert terminal is not None
    names = {_js_events()[n.strip().removeprefix("EVENT.")] for n in terminal.group(1).split(",")}
    assert names == set(TERMINAL_EVENT_TYPES)


def _string_event_writes(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if isinstance(func, ast.Attribute) and name == "append":
            name = "emit" if "journal" in ast.unparse(func.value) else name
        first = node.args[0]
        if name in WRITERS and isinstance(first, ast.Constant) and isinstance(first.value, str):
            lines.append(node.lineno)
    return lines


def test_every_writer_names_its_event_with_the_enum() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for line in _string_event_writes(ast.parse(path.read_text(), str(path))):
            found.append(f"{path.relative_to(SRC)}:{line}")
    assert found == [], "journal events named by a string literal: " + ", ".join(found)


def test_the_check_catches_a_string_literal() -> None:
    tree = ast.parse(
        'async def f(rc):\n    await rc.emit("token", {})\n    await rc.emit(E.X, {})\n'
    )
    assert _string_event_writes(tree) == [2]
