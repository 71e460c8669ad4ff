"""A bank's settings as they apply (:mod:`heed.memory.bank_config.view`): one typed field per
setting, the bank's own value else the default, and nothing a bank stores makes it fail."""

from __future__ import annotations

import dataclasses
import typing

from heed.memory.bank_config.settings import SETTINGS, ServerDefaults, accepts, apply, validate
from heed.memory.bank_config.view import BankSettings, settings_of, settings_of_config
from heed.memory.models import Bank


def test_every_setting_has_a_typed_field_and_every_field_is_a_setting() -> None:
    fields = dataclasses.fields(BankSettings)
    assert [f.name for f in fields] == list(SETTINGS), "a setting added without its field?"
    hints = typing.get_type_hints(BankSettings)
    for f in fields:
        assert hints[f.name] is not typing.Any, f"{f.name} has no type"


def test_the_defaults_are_values_each_setting_accepts() -> None:
    view = settings_of_config({})
    for name, value in view.as_dict().items():
        assert accepts(name, value), (name, value)


def test_the_banks_value_else_the_servers_default_else_the_settings() -> None:
    bank = Bank(tenant="t", bank_id="b", ref="r")
    server = ServerDefaults(
        retain_extraction_mode="verbose",
        enable_observations=True,
        mental_model_min_refresh_interval_seconds=30.0,
    )
    view = settings_of(bank, server)
    assert (view.retain_extraction_mode, view.enable_observations) == ("verbose", True)
    assert view.mental_model_min_refresh_interval_seconds == 30.0
    assert view.recall_budget_fixed_mid == SETTINGS["recall_budget_fixed_mid"].default
    changes = validate(
        {
            "retain_extraction_mode": "off",
            "reflect_mission": "Answer as a nurse.",
            "disposition_empathy": 5,
            "recall_budget_fixed_mid": 7,
        }
    )
    apply(bank, changes)
    view = settings_of(bank, server)
    assert view.retain_extraction_mode == "off" and view.enable_observations is True
    assert (view.reflect_mission, view.recall_budget_fixed_mid) == ("Answer as a nurse.", 7)
    assert view.disposition() == {"skepticism": 3, "literalism": 3, "empathy": 5}


def test_a_stored_value_no_setting_accepts_counts_as_unset() -> None:
    odd = {
        "enable_reranking": "yes",
        "recall_semantic_weight": 1.5,
        "recall_budget_fixed_low": 10**9,
        "retain_extraction_mode": "custom",
        "mcp_enabled_tools": ["no such tool"],
    }
    assert settings_of_config(odd) == settings_of_config({})
