"""A bank's settings: ``GET / PATCH / DELETE /v1/default/banks/{bank_id}/config``.

hindsight-client's ``get_bank_config``, ``update_bank_config`` and ``reset_bank_config``:
each answers ``{bank_id, config, overrides}`` (every setting's value, and the bank's own).
Which settings exist and what refuses a key: :mod:`heed.memory.bank_config.settings`; the calls:
:mod:`heed.memory.bank_config.service`.
"""

from __future__ import annotations

from fastapi import APIRouter

from heed.api.deps import BankConfigDep
from heed.api.input_rules import IdPath
from heed.api.openapi import CONFLICT
from heed.api.routing import HeedRoute
from heed.api.wire import config as wire
from heed.memory.bank_config.service import BankConfigView

__all__ = ["router"]

router = APIRouter(
    prefix="/v1/default/banks/{bank_id}/config", tags=["banks"], route_class=HeedRoute
)


def _response(view: BankConfigView) -> wire.BankConfigResponse:
    return wire.BankConfigResponse(
        bank_id=view.bank_id, config=view.config, overrides=view.overrides
    )


@router.get("")
async def get_bank_config(bank_id: IdPath, configs: BankConfigDep) -> wire.BankConfigResponse:
    """The bank's settings: each one's value, and those the bank sets itself."""
    return _response(await configs.read(bank_id))


@router.patch("", responses=CONFLICT)
async def update_bank_config(
    bank_id: IdPath, body: wire.BankConfigUpdate, configs: BankConfigDep
) -> wire.BankConfigResponse:
    """Set some settings (``null``: back to the default). A key heed does not honour is a
    400 naming it, and nothing changes."""
    return _response(await configs.update(bank_id, wire.sent_settings(body.updates)))


@router.delete("", responses=CONFLICT)
async def reset_bank_config(bank_id: IdPath, configs: BankConfigDep) -> wire.BankConfigResponse:
    """Remove every setting the bank sets itself: the server's defaults apply again."""
    return _response(await configs.reset(bank_id))
