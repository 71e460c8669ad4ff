"""docs/bank-archive.md's section table is the registry's (:mod:`heed.transfer.sections`):
the same sections in the same order, each with the format version that added it."""

from __future__ import annotations

import re
from pathlib import Path

from heed.transfer.archive import VERSION
from heed.transfer.sections import REGISTRY

DOC = Path(__file__).resolve().parents[2] / "docs" / "bank-archive.md"

_ROW = re.compile(r"^\| `([a-z_]+)` \|(.*)\|$")
_SINCE = re.compile(r"since version (\d+)")


def documented(text: str) -> list[tuple[str, int]]:
    """The sections of the page's "Sections" table, in order, each with its version (the
    ``since version N`` of its notes, else 1)."""
    body = text.split("\n## Sections\n", 1)[1].split("\n## ", 1)[0]
    found = []
    for line in body.splitlines():
        match = _ROW.match(line.strip())
        if match:
            since = _SINCE.search(match[2])
            found.append((match[1], int(since[1]) if since else 1))
    return found


def documented_versions(text: str) -> dict[int, set[str]]:
    """The sections each version after the first added, by the page's versions table."""
    added: dict[int, set[str]] = {}
    for line in text.splitlines():
        match = re.match(r"^\| (\d+) \| [^|]+ \| (.+) \|$", line.strip())
        if match and int(match[1]) > 1:
            added[int(match[1])] = set(re.findall(r"`([a-z_]+)`", match[2]))
    return added


def problems(text: str) -> list[str]:
    """How the page and the registry differ (nothing when they agree)."""
    registry = [(section.name, section.since) for section in REGISTRY]
    found: list[str] = []
    if documented(text) != registry:
        found.append(f"sections table {documented(text)} != registry {registry}")
    wanted = {
        version: {s.name for s in REGISTRY if s.since == version}
        for version in range(2, VERSION + 1)
    }
    if documented_versions(text) != wanted:
        found.append(f"versions table {documented_versions(text)} != registry {wanted}")
    return found


def test_the_page_lists_the_registry_sections_in_order_with_their_versions() -> None:
    assert problems(DOC.read_text()) == []


def test_the_newest_section_is_of_the_format_version_heed_writes() -> None:
    assert max(section.since for section in REGISTRY) == VERSION


def test_the_check_sees_a_section_missing_renamed_or_of_another_version() -> None:
    text = DOC.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `links` |"))
    assert problems(text.replace(row + "\n", "")), "a section left out of the table"
    assert problems(text.replace("| `links` |", "| `graph_links` |")), "a section renamed"
    webhooks = next(line for line in text.splitlines() if line.startswith("| `webhooks` |"))
    assert problems(text.replace(webhooks, webhooks.replace("since version 2", "since 2"))), (
        "a section's version"
    )
    assert problems(text.replace("| `webhooks`, `knowledge_folders`", "| `knowledge_folders`")), (
        "the versions table"
    )
