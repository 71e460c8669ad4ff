"""Bank aliases' JSON, shaped like Hindsight's (``BankAliasesResponse`` and its requests)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from heed.api.input_rules import Identifier, RequestBody
from heed.memory.aliases import BankAlias
from heed.memory.models import Bank

__all__ = [
    "BankAliasEntry",
    "BankAliasesResponse",
    "CreateBankAliasRequest",
    "SetBankAliasPrimaryRequest",
    "aliases_response",
]


class BankAliasEntry(BaseModel):
    alias: str
    primary: bool = False


class BankAliasesResponse(BaseModel):
    bank_id: str = Field(description="The bank's own id, which an alias never replaces")
    aliases: list[BankAliasEntry]


class CreateBankAliasRequest(RequestBody):
    alias: Identifier = Field(description="The extra id: the rules of a bank id")
    primary: bool = Field(default=False, description="Also show the bank under this alias")


class SetBankAliasPrimaryRequest(RequestBody):
    primary: bool


def aliases_response(found: tuple[Bank, list[BankAlias]]) -> BankAliasesResponse:
    bank, aliases = found
    return BankAliasesResponse(
        bank_id=bank.bank_id,
        aliases=[BankAliasEntry(alias=a.alias, primary=a.primary) for a in aliases],
    )
