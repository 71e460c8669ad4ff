"""Bank templates: a bank's setup (its settings, mental models and directives) as a
manifest, exported from one bank and imported into another (Hindsight's
``/export``, ``/import`` and ``/v1/bank-template-schema``).

A template carries how a bank works, never what it remembers: no memories, no mental
model content (a bank archive, :mod:`heed.transfer`, carries those). ``manifest`` holds
the manifest's shape and its checks, ``service`` exports and imports.
"""

from heed.templates.manifest import (
    CURRENT_VERSION,
    ImportSummary,
    Template,
    TemplateDirective,
    TemplateModel,
)
from heed.templates.service import BankTemplates

__all__ = [
    "CURRENT_VERSION",
    "BankTemplates",
    "ImportSummary",
    "Template",
    "TemplateDirective",
    "TemplateModel",
]
