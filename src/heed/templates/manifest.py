"""A bank template's values and the checks that need no bank (see the package docstring).

Version ``"1"`` is the only one: a manifest of a later version is refused by name, so a
template written by a newer server is never half-understood.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Final

from heed.memory.models import InvalidInput

__all__ = ["CURRENT_VERSION", "ImportSummary", "Template", "TemplateDirective", "TemplateModel"]

#: The manifest version this server writes and the newest it reads.
CURRENT_VERSION: Final = "1"


@dataclass(frozen=True, slots=True)
class TemplateModel:
    """A mental model as a template carries it: how it is built, not what it says."""

    id: str
    name: str
    source_query: str
    tags: list[str] = field(default_factory=list)
    max_tokens: int | None = None
    trigger: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class TemplateDirective:
    """A directive as a template carries it; matched by name on import."""

    name: str
    content: str
    priority: int = 0
    is_active: bool = True
    tags: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Template:
    """A manifest. ``None`` for a part: leave that part of the bank as it is."""

    version: str
    bank: dict[str, Any] | None = None
    mental_models: list[TemplateModel] | None = None
    directives: list[TemplateDirective] | None = None

    def __post_init__(self) -> None:
        if not self.version.isdigit() or int(self.version) < 1:
            raise InvalidInput(f"version {self.version!r}: a template's version is '1'")
        if int(self.version) > int(CURRENT_VERSION):
            raise InvalidInput(
                f"version {self.version!r} is newer than this server reads (at most "
                f"{CURRENT_VERSION!r})"
            )
        _unique("mental_models", [m.id for m in self.mental_models or ()], "id")
        _unique("directives", [d.name for d in self.directives or ()], "name")


@dataclass(slots=True)
class ImportSummary:
    """What an import did (or, dry, would do)."""

    bank_id: str
    config_applied: bool
    mental_models_created: list[str] = field(default_factory=list)
    mental_models_updated: list[str] = field(default_factory=list)
    directives_created: list[str] = field(default_factory=list)
    directives_updated: list[str] = field(default_factory=list)
    operation_ids: list[str] = field(default_factory=list)
    dry_run: bool = False


def _unique(part: str, keys: list[str], key: str) -> None:
    twice = sorted(k for k, n in Counter(keys).items() if n > 1)
    if twice:
        raise InvalidInput(f"{part}: each {key} may appear once; repeated: {', '.join(twice)}")
