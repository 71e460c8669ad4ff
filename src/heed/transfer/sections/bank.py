"""Section ``bank``: the bank's profile and settings, one record in ``bank.json``.

Without ``include_bank_config`` an export writes the profile bare (no config, an empty
mission, the default disposition). An import names the new bank by the record's name (unless
it is empty or the source's id) and, with ``include_bank_config``, gives it the record's
mission, disposition and settings, checked as a ``PATCH .../config`` is
(:func:`bank_settings`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Annotated, Any

from pydantic import Field

from heed.memory.bank_config import settings as bank_config
from heed.memory.models import Bank, InvalidInput, default_disposition
from heed.transfer.records import Id, InvalidArchive, Record, fields_of, utc_time, validate
from heed.transfer.sections.base import Checker, ExportContext, ImportContext, Section

__all__ = ["SECTION", "BankRecord", "bank_settings"]


class Disposition(Record):
    skepticism: Annotated[int, Field(ge=1, le=5)] = 3
    literalism: Annotated[int, Field(ge=1, le=5)] = 3
    empathy: Annotated[int, Field(ge=1, le=5)] = 3


class BankRecord(Record):
    """The bank's profile and configuration (section ``bank``, one record)."""

    bank_id: Id
    name: Annotated[str, Field(max_length=500)]
    mission: str
    background: str | None
    disposition: Disposition
    config: dict[str, Any]
    created_at: str


def bank_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The bank settings of an archive's ``config``, checked by the rule every setting
    meets (:func:`heed.memory.bank_config.settings.validate`: a name heed does not
    honour, or a value of the wrong type, is refused by name)."""
    try:
        checked = bank_config.validate(config, where="bank.json: config")
    except InvalidInput as exc:
        raise InvalidArchive(exc.message) from exc
    return {name: value for name, value in checked.items() if value is not None}


def encode(bank: Bank) -> dict[str, Any]:
    return fields_of(bank, BankRecord)


def decode(value: dict[str, Any], dim: int, where: str) -> BankRecord:
    record = validate(BankRecord, value, where)
    utc_time(record.created_at, "created_at", where)
    return record


def read(ctx: ExportContext) -> Iterator[list[Bank]]:
    bank = ctx.bank
    profile = replace(bank, config=dict(bank.config), disposition=dict(bank.disposition))
    if not ctx.flags.include_bank_config:
        profile.config, profile.mission = {}, ""
        profile.disposition = default_disposition()
    yield [profile]


def write(ctx: ImportContext) -> dict[str, int]:
    target, record = ctx.target, ctx.record
    target.name = target.bank_id
    if record is not None:
        if record.name not in ("", record.bank_id):  # else named by its new id
            target.name = record.name
        target.background = record.background
        if ctx.flags.include_bank_config:
            target.mission = record.mission
            target.disposition = record.disposition.model_dump()
            target.config = bank_settings(record.config)
    return {}


def check(checker: Checker) -> None:
    """Nothing spans records: the record is checked as it is read."""


SECTION = Section("bank", 1, "bank", encode, decode, read, write, check, single=True)
