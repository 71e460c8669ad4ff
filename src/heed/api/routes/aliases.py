"""Bank aliases: ``/v1/default/banks/{bank_id}/aliases[/{alias}]`` (tenant-scoped).

hindsight-client's ``list_bank_aliases``, ``create_bank_alias`` (201),
``set_bank_alias_primary`` and ``delete_bank_alias``; what an alias is:
:mod:`heed.memory.aliases`. The bank in the path may be named by one of its aliases.
"""

from __future__ import annotations

from fastapi import APIRouter

from heed.api.deps import AliasesDep
from heed.api.input_rules import IdPath
from heed.api.routing import HeedRoute
from heed.api.wire import aliases as wire

__all__ = ["router"]

router = APIRouter(
    prefix="/v1/default/banks/{bank_id}/aliases", tags=["banks"], route_class=HeedRoute
)


@router.get("")
async def list_bank_aliases(bank_id: IdPath, aliases: AliasesDep) -> wire.BankAliasesResponse:
    """The extra ids that reach this bank, the primary one first, then oldest first."""
    return wire.aliases_response(await aliases.of_bank(bank_id))


@router.post("", status_code=201)
async def create_bank_alias(
    bank_id: IdPath, body: wire.CreateBankAliasRequest, aliases: AliasesDep
) -> wire.BankAliasesResponse:
    """Give the bank another id to answer to (409 when the name is a bank's or an alias)."""
    return wire.aliases_response(await aliases.add(bank_id, body.alias, body.primary))


@router.patch("/{alias}")
async def set_bank_alias_primary(
    bank_id: IdPath, alias: IdPath, body: wire.SetBankAliasPrimaryRequest, aliases: AliasesDep
) -> wire.BankAliasesResponse:
    """Show the bank under this alias (demoting the one shown before), or no longer."""
    return wire.aliases_response(await aliases.set_primary(bank_id, alias, body.primary))


@router.delete("/{alias}")
async def delete_bank_alias(
    bank_id: IdPath, alias: IdPath, aliases: AliasesDep
) -> wire.BankAliasesResponse:
    """Stop this id reaching the bank; the bank and its memories are untouched."""
    return wire.aliases_response(await aliases.delete(bank_id, alias))
