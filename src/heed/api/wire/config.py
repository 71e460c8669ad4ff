"""Wire models of a bank's settings: ``GET / PATCH / DELETE .../banks/{bank_id}/config``
(hindsight-client's ``get_bank_config``, ``update_bank_config``, ``reset_bank_config``), and
the settings part of ``PUT / PATCH .../banks/{bank_id}`` (``create_bank``).

The settings are :data:`heed.memory.bank_config.settings.SETTINGS`, read here: each is a typed,
optional field of :class:`ConfigUpdates` and of the bank body
(:class:`heed.api.wire.memory.BankWrite`), so the OpenAPI document lists them with their
types, and a wrong type is a 422 naming it. A field that is not one of them is refused by
the domain with a 400 naming it (a Hindsight setting heed does not implement, or an unknown
one); the document says ``additionalProperties: false``. Hindsight's environment spelling
of a key (``HINDSIGHT_API_RETAIN_MISSION``) is accepted too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from heed.api.input_rules import RequestBody
from heed.memory.bank_config.settings import SETTINGS

__all__ = [
    "BankConfigResponse",
    "BankConfigUpdate",
    "ConfigUpdates",
    "SettingsBody",
    "sent_settings",
    "setting_fields",
]


class SettingsBody(RequestBody):
    """A body with the bank settings as optional fields: strict JSON types; other fields
    are kept (``model_extra``) for the domain to refuse by name."""

    model_config = ConfigDict(
        strict=True, extra="allow", json_schema_extra={"additionalProperties": False}
    )


def setting_fields() -> dict[str, Any]:
    """Every bank setting as an optional field (``None``: not sent, or back to the default
    where ``null`` means that), for :func:`pydantic.create_model`."""
    return {
        name: (setting.annotation | None, Field(default=None, description=setting.help or None))
        for name, setting in SETTINGS.items()
    }


def sent_settings(body: BaseModel) -> dict[str, Any]:
    """The settings *body* carries, as JSON values: the setting fields it sent (``null``
    included) and every field it has beyond its model, for
    :func:`heed.memory.bank_config.settings.validate` to check (and refuse by name)."""
    sent = body.model_dump(mode="json", include=set(SETTINGS) & body.model_fields_set)
    return {**sent, **(body.model_extra or {})}


if TYPE_CHECKING:
    ConfigUpdates = SettingsBody
else:
    ConfigUpdates = create_model(
        "ConfigUpdates",
        __base__=SettingsBody,
        __doc__="Bank settings to set (``null``: back to the server's default).",
        **setting_fields(),
    )


class BankConfigUpdate(RequestBody):
    """``PATCH .../config``: ``{"updates": {setting: value}}``."""

    updates: ConfigUpdates


class BankConfigResponse(BaseModel):
    bank_id: str
    config: dict[str, Any] = Field(description="Every setting's value for the bank.")
    overrides: dict[str, Any] = Field(description="The settings the bank sets itself.")
