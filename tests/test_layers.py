"""The import rule of docs/architecture.md, checked on the source tree."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "heed"

#: What each top-level part of heed may import (besides itself). Leaves: errors, version,
#: settings. No domain imports ``storage``: only the composition root (``services``) chooses
#: the stores, and the API never does.
ALLOWED: dict[str, set[str]] = {
    "runtime": set(),
    "errors": set(),
    "version": set(),
    "settings": set(),
    "redact": set(),
    "logs": set(),
    "runs": {"runtime", "errors"},
    "llm": {"runtime", "errors", "settings"},
    # Storage mirrors the capabilities: it implements their store protocols.
    "storage": {
        *("runtime", "errors", "memory", "runs", "sessions", "redact", "webhooks"),
        *("mental_models", "transfer"),
    },
    "memory": {"runtime", "errors", "settings", "runs", "llm"},
    # Neither of the two agents imports the other: what both need (the grounded answer,
    # the recall tool's spec) is in ``llm.grounding``.
    "reflect": {"runtime", "errors", "settings", "llm", "memory", "runs"},
    "sessions": {"runtime", "errors", "settings", "llm", "memory", "runs"},
    # Webhooks: told when a bank's runs end (runs), about banks (memory).
    "webhooks": {"runtime", "errors", "settings", "memory", "runs"},
    # Mental models and the knowledge base: a refresh is a reflect, so above it. Reflect
    # consults them through its port (``reflect/ports.py``), which they implement.
    "mental_models": {"runtime", "errors", "settings", "llm", "memory", "reflect", "runs"},
    # Bank transfer: export, import and clone of a whole bank, above what a bank holds
    # (memory, webhooks, mental models), so it carries each through its own package.
    "transfer": {
        *("runtime", "errors", "settings", "memory", "runs", "webhooks", "mental_models"),
        "llm",
    },
    # Bank templates: a bank's setup (settings, mental models, directives) as a manifest.
    "templates": {"runtime", "errors", "memory", "mental_models"},
    "services": {
        *("runtime", "settings", "storage", "memory", "reflect", "runs", "sessions", "llm"),
        "webhooks",
        "mental_models",
        "transfer",
        "templates",
    },
    # ``heed migrate``: works on two databases (storage) and checks them through memory
    # engines, not through a server.
    "migrate": {"runtime", "errors", "redact", "settings", "storage", "memory", "runs"},
    "web": set(),
    # The MCP server: a second protocol front end over the same services as the API.
    "mcp": {
        "runtime",
        "errors",
        "settings",
        "version",
        "memory",
        "reflect",
        "runs",
        "sessions",
        "services",
        "mental_models",
    },
    "api": {
        "runtime",
        "errors",
        "settings",
        "version",
        "memory",
        "reflect",
        "runs",
        "sessions",
        "services",
        "web",
        "llm",
        "mcp",
        "webhooks",
        "mental_models",
        "transfer",
        "templates",
    },
    # ``migrate``: the migrate command works on databases, not through a server.
    "cli": {"api", "mcp", "settings", "version", "migrate", "logs", "redact"},
}

#: Inside the front ends, the only modules that import the composition root (``services``):
#: the app and the MCP server are built over it, the routes reach it through the typed
#: dependencies of ``api/deps.py``, the MCP tools through the ``Services`` their ``ToolGroup``
#: (``mcp/tools/base.py``) is given.
COMPOSITION_ROOT_IMPORTERS = {"api/app.py", "api/deps.py", "mcp/server.py", "mcp/tools/base.py"}


def _part(path: Path) -> str:
    return path.relative_to(SRC).parts[0].removesuffix(".py")


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "heed" and len(parts) > 1:
                found.add(parts[1])
    return found


def test_every_import_follows_the_layer_rule() -> None:
    broken = []
    for path in sorted(SRC.rglob("*.py")):
        part = _part(path)
        if part in ("__init__", "py"):
            continue
        assert part in ALLOWED, f"{part}: a new top-level part; add it to the rule"
        allowed = ALLOWED[part]
        for target in _imports(path) - {part} - allowed:
            broken.append(f"{path.relative_to(SRC)} imports heed.{target}")
    assert broken == [], "; ".join(broken)


def test_the_rule_catches_a_domain_importing_the_api(tmp_path: Path) -> None:
    module = tmp_path / "x.py"
    module.write_text("from heed.api.app import create_app\nimport heed.runtime.slots\n")
    assert _imports(module) == {"api", "runtime"}


def test_front_ends_reach_the_composition_root_through_one_module_each() -> None:
    found = {
        str(path.relative_to(SRC))
        for path in sorted(SRC.rglob("*.py"))
        if _part(path) in ("api", "mcp", "cli") and "services" in _imports(path)
    }
    assert found <= COMPOSITION_ROOT_IMPORTERS, sorted(found - COMPOSITION_ROOT_IMPORTERS)
