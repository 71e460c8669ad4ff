"""A bank's settings as they apply: one typed, frozen view, and the one rule that makes it.

:class:`BankSettings` has one field per setting of
:data:`heed.memory.bank_config.settings.SETTINGS` (a test keeps the two equal), holding the
value that applies to the bank: the bank's own value
(:func:`~heed.memory.bank_config.settings.overrides`), else the server's default
(:class:`~heed.memory.bank_config.settings.ServerDefaults`), else the setting's. A stored
value that is not one the setting accepts (which
:func:`~heed.memory.bank_config.settings.validate` never stores) counts as unset, so no
request fails on its bank's settings.

Everything that acts on a bank's settings reads this view, through
:meth:`heed.memory.engine.MemoryEngine.settings` (recall's switches, size and weights,
retain's extraction, consolidation's scopes and missions, reflect's mission, disposition and
recall budget, mental model refreshes, MCP tools), and ``GET .../config`` shows it: what is
shown is what applies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from heed.memory.bank_config.settings import SETTINGS, ServerDefaults, accepts, overrides
from heed.memory.models import Bank

__all__ = ["BankSettings", "settings_of", "settings_of_config"]


@dataclass(frozen=True, slots=True)
class BankSettings:
    """Every setting's value for one bank (see the module docstring; what each does:
    :data:`heed.memory.bank_config.settings.SETTINGS`). Lists are the stored JSON values:
    read them, never change them."""

    reflect_mission: str
    disposition_skepticism: int
    disposition_literalism: int
    disposition_empathy: int
    retain_mission: str | None
    retain_extraction_mode: Literal["off", "concise", "verbose"]
    enable_observations: bool
    observations_mission: str | None
    default_observation_scopes: str | list[list[str]]
    consolidation_strategies: list[dict[str, Any]]
    enable_text_search: bool
    enable_temporal_retrieval: bool
    enable_graph_retrieval: bool
    enable_reranking: bool
    recall_prefer_observations: bool
    recall_budget_function: Literal["fixed", "adaptive"]
    recall_budget_fixed_low: int
    recall_budget_fixed_mid: int
    recall_budget_fixed_high: int
    recall_budget_adaptive_low: float
    recall_budget_adaptive_mid: float
    recall_budget_adaptive_high: float
    recall_budget_min: int
    recall_budget_max: int
    recall_semantic_weight: float
    recall_speaker_weight: float
    recall_temporal_weight: float
    recall_max_tokens: int | None
    mental_model_min_refresh_interval_seconds: float
    llm_budget_tokens_per_hour: int | None
    llm_budget_tokens_per_day: int | None
    mcp_enabled_tools: list[str] | None

    def as_dict(self) -> dict[str, Any]:
        """``{setting: value}`` in :data:`SETTINGS`' order (what ``GET .../config`` shows)."""
        return {name: getattr(self, name) for name in SETTINGS}

    def disposition(self) -> dict[str, int]:
        """The disposition traits, by trait name (``skepticism``, ``literalism``, ``empathy``)."""
        return {
            "skepticism": self.disposition_skepticism,
            "literalism": self.disposition_literalism,
            "empathy": self.disposition_empathy,
        }


def settings_of(bank: Bank, defaults: ServerDefaults) -> BankSettings:
    """The settings that apply to *bank* on a server whose defaults are *defaults*."""
    values: dict[str, Any] = {}
    for name, setting in SETTINGS.items():
        default = setting.default
        if default is None and hasattr(defaults, name):
            default = getattr(defaults, name)
        values[name] = default
    for name, value in overrides(bank).items():
        if accepts(name, value):
            values[name] = value
    return BankSettings(**values)


def settings_of_config(
    config: Mapping[str, Any], defaults: ServerDefaults | None = None
) -> BankSettings:
    """The settings of a bank whose ``config`` map is *config* (its mission and disposition
    at their defaults): for rules tested on a config alone."""
    bank = Bank(tenant="", bank_id="", ref="", config=dict(config))
    return settings_of(bank, defaults or ServerDefaults())
