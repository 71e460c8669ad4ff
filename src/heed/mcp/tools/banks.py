"""The bank tools: ``list_banks``, ``create_bank``; and the resource
``heed://banks/{bank_id}``, a bank's profile and counts."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from pydantic import BaseModel

from heed.errors import HeedError
from heed.mcp.calls import identity_of
from heed.mcp.tools.base import BankId, Limit, Name, Offset, Text, ToolGroup
from heed.runtime import use_context

__all__ = ["BankInfo", "BankList", "BankTools"]


class BankInfo(BaseModel):
    bank_id: str
    name: str
    mission: str
    units: int | None = None


class BankList(BaseModel):
    banks: list[BankInfo]
    total: int


class BankTools(ToolGroup):
    """The caller's tenant's banks."""

    tool_names = ("list_banks", "create_bank")

    def register(self, server: MCPServer) -> None:
        super().register(server)
        server.resource(
            "heed://banks/{bank_id}",
            name="bank",
            description="A memory bank's profile and counts, as JSON.",
            mime_type="application/json",
        )(self.bank_resource)

    async def list_banks(
        self,
        ctx: Context[Any],
        limit: Limit = 100,
        offset: Offset = 0,
    ) -> BankList:
        """List your memory banks with how many memories each holds."""
        async with self._call(ctx):
            rows, total = await self.services.memory.list_banks(limit, offset)
        return BankList(
            banks=[
                BankInfo(bank_id=b.bank_id, name=b.name, mission=b.mission, units=n)
                for b, n in rows
            ],
            total=total,
        )

    async def create_bank(
        self,
        bank_id: BankId,
        ctx: Context[Any],
        name: Name | None = None,
        mission: Text | None = None,
    ) -> BankInfo:
        """Create a memory bank (or update the name and mission of an existing one)."""
        async with self._call(ctx):
            await self._allowed(bank_id, "create_bank")
            bank = await self.services.memory.put_bank(bank_id, {"name": name, "mission": mission})
        return BankInfo(bank_id=bank.bank_id, name=bank.name, mission=bank.mission)

    async def bank_resource(self, bank_id: str, ctx: Context[Any]) -> str:
        """A bank's profile and counts."""
        try:
            with use_context(identity_of(ctx, self.stdio_context)):
                bank, stats = await self.services.memory.bank_stats(bank_id)
        except (HeedError, ToolError) as exc:
            raise ResourceError(str(exc)) from exc
        profile = {"bank_id": bank.bank_id, "name": bank.name, "mission": bank.mission}
        return json.dumps({**profile, "stats": asdict(stats)})
