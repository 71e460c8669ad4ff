"""``heed mcp``: heed's MCP server over stdio, for clients that launch their tools.

It serves the same tools as ``/mcp`` on ``heed serve`` (:mod:`heed.mcp`), in this process,
on the same data directory, for one tenant. Runs and banks live in the same database, so
a ``heed serve`` on that directory shows (and can cancel) the runs it starts. stdout is the
protocol: logs go to stderr.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click

from heed.cli.options import data_dir_option, settings_of

__all__ = ["mcp"]


@click.command()
@click.option(
    "--api-key",
    default=None,
    envvar="HEED_MCP_API_KEY",
    help="Serve the tenant this key maps to in HEED_API_KEYS (or HEED_MCP_API_KEY).",
)
@click.option("--tenant", default=None, help="Serve this tenant (default: 'default').")
@data_dir_option
@click.option("--log-level", default=None, help="debug, info, warning or error (to stderr).")
def mcp(
    api_key: str | None, tenant: str | None, data_dir: Path | None, log_level: str | None
) -> None:
    """Serve heed's MCP tools (recall, retain, reflect, start_turn, ...) over stdio."""
    from heed.logs import configure_logging
    from heed.mcp import serve_stdio

    overrides = {k: v for k, v in {"data_dir": data_dir, "log_level": log_level}.items() if v}
    settings = settings_of(**overrides)
    if api_key is not None and tenant is not None:
        raise click.UsageError("give --api-key or --tenant, not both")
    if api_key is not None:
        if api_key not in settings.api_keys:
            raise click.UsageError("--api-key is not one of HEED_API_KEYS")
        tenant = settings.api_keys[api_key]
    elif tenant is None and settings.api_keys:
        raise click.UsageError("HEED_API_KEYS is set: say whose tools these are with --api-key")
    configure_logging(settings.log_level, sys.stderr)
    sys.setswitchinterval(settings.switch_interval_ms / 1000)  # as for `heed serve`
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    asyncio.run(serve_stdio(settings, tenant))
