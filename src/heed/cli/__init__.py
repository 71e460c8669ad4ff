"""The ``heed`` command: one click group; each subcommand lives in its own module.

- :mod:`heed.cli.serve`: ``serve`` (the server) and ``version``;
- :mod:`heed.cli.memory`: ``retain``, ``recall``, ``import-locomo`` (clients of a running server);
- :mod:`heed.cli.mcp`: ``mcp`` (the MCP server over stdio);
- :mod:`heed.cli.migrate`: ``migrate`` (copy a SQLite database into PostgreSQL; works on
  the databases, not through a server).

Every command reads its defaults from :class:`heed.settings.Settings` (the ``HEED_*``
environment variables); options override them.
"""

from __future__ import annotations

import click

from heed.cli.mcp import mcp
from heed.cli.memory import import_locomo, recall, retain
from heed.cli.migrate import migrate
from heed.cli.serve import serve, version

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """heed: an agent backend with memory banks and streaming chat sessions.

    Settings come from HEED_* environment variables (see the README); the
    options below override them.
    """


for _command in (serve, version, retain, recall, import_locomo, mcp, migrate):
    main.add_command(_command)
