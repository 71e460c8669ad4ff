"""The documentation stays true to the code: its links land, the modules it names exist, and
the layer tree of docs/architecture.md is the one tests/test_layers.py enforces."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from tests.test_layers import ALLOWED, SRC

ROOT = SRC.parents[1]
DOCS = sorted([*(ROOT / "docs").glob("*.md"), ROOT / "README.md"])

_LINK = re.compile(r"\]\(([^)\s]+)\)")
_DOTTED = re.compile(r"`(heed(?:\.[a-z_][a-z0-9_]*)+)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    in_code = False
    found: set[str] = set()
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            found.add(_slug(line.lstrip("#")))
    return found


def test_every_relative_link_lands() -> None:
    broken = []
    for doc in DOCS:
        for target in _LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            dest = (doc.parent / file_part).resolve() if file_part else doc
            if not dest.exists():
                broken.append(f"{doc.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{doc.name}: {target} (no such heading)")
    assert broken == [], "\n".join(broken)


def _resolves(dotted: str) -> bool:
    """A module, or a name in a module (a class, a function, an attribute of a class)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 1, -1):
        module = ".".join(parts[:cut])
        try:
            if importlib.util.find_spec(module) is None:
                continue
        except ModuleNotFoundError:  # a name under a module that is not a package
            continue
        obj: object = importlib.import_module(module)
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def test_every_module_the_docs_name_exists() -> None:
    missing = sorted(
        {
            f"{doc.name}: {name}"
            for doc in DOCS
            for name in _DOTTED.findall(doc.read_text())
            if name.split(".")[1] in ALLOWED and not _resolves(name)
        }
    )
    assert missing == [], "\n".join(missing)


def _tree_parts(text: str) -> set[str]:
    """The top-level parts the code block under "## Layers" lists."""
    layers = text.split("## Layers", 1)[1]
    tree = layers.split("```", 2)[1]
    return {
        match.group(1).removesuffix("/").removesuffix(".py")
        for match in re.finditer(r"^  ([a-z_]+(?:/|\.py))", tree, flags=re.M)
    }


def test_the_layer_tree_is_the_enforced_one() -> None:
    on_disk = {
        path.name.removesuffix(".py")
        for path in SRC.iterdir()
        if (path.is_dir() and any(path.rglob("*.py")))
        or (path.suffix == ".py" and path.name != "__init__.py")
    }
    assert _tree_parts((ROOT / "docs" / "architecture.md").read_text()) == set(ALLOWED) == on_disk


def test_the_checks_see_what_they_check() -> None:
    tree = (
        "## Layers\n\n```\nsrc/heed/\n  runtime/    tokens\n              more\n"
        "  cli/  x\n  settings.py\n```\n"
    )
    assert _tree_parts(tree) == {"runtime", "cli", "settings"}
    assert _resolves("heed.runtime.slots") and not _resolves("heed.runtime.no_such_module")
    assert _resolves("heed.errors.HeedError") and not _resolves("heed.errors.NoSuchName")
    assert _slug("Overload: what is bounded where, and what a client sees") == (
        "overload-what-is-bounded-where-and-what-a-client-sees"
    )
