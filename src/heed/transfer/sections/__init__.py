"""The archive's sections, in the order they are written, read and checked: the registry.

Each is one module exporting its :class:`~heed.transfer.sections.base.Section` (name,
the format version that added it, its record's encoding and decoding, and its part of an
export, an import and a check). A new section is one module and one line here (and a row
in docs/bank-archive.md's table, which ``tests/memory/test_archive_sections.py`` checks
against this registry); a record that names another names one of an earlier section.
"""

from __future__ import annotations

from typing import Final

from heed.transfer.sections import (
    bank,
    directives,
    documents,
    entities,
    knowledge_folders,
    links,
    mental_models,
    observations,
    unit_entities,
    units,
    webhooks,
)
from heed.transfer.sections.base import Section

__all__ = ["BY_NAME", "REGISTRY", "Section"]

REGISTRY: Final[tuple[Section, ...]] = (
    bank.SECTION,
    directives.SECTION,
    webhooks.SECTION,
    knowledge_folders.SECTION,
    mental_models.SECTION,
    documents.SECTION,
    units.SECTION,
    observations.SECTION,
    entities.SECTION,
    unit_entities.SECTION,
    links.SECTION,
)
#: The sections by name.
BY_NAME: Final[dict[str, Section]] = {section.name: section for section in REGISTRY}
