"""``heed serve`` and ``heed version``: run the server on these settings."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from heed.cli.options import data_dir_option, settings_of
from heed.version import __version__

__all__ = ["serve", "version"]


@click.command()
@click.option("--host", default=None, help="Address to bind (default 127.0.0.1, HEED_HOST).")
@click.option("--port", type=int, default=None, help="Port to bind (default 8700, HEED_PORT).")
@data_dir_option
@click.option("--log-level", default=None, help="debug, info, warning or error.")
def serve(host: str | None, port: int | None, data_dir: Path | None, log_level: str | None) -> None:
    """Run the heed server."""
    from heed.api.app import create_app
    from heed.api.server import HeedServer, server_config
    from heed.logs import configure_logging

    given: dict[str, Any] = {
        "host": host,
        "port": port,
        "data_dir": data_dir,
        "log_level": log_level,
    }
    settings = settings_of(**{k: v for k, v in given.items() if v is not None})
    configure_logging(settings.log_level)
    if not settings.api_keys and settings.host not in {"127.0.0.1", "::1", "localhost"}:
        click.echo(
            f"warning: binding {settings.host} without HEED_API_KEYS; only loopback clients "
            "will be served",
            err=True,
        )
    # The event loop notices a disconnect only when it gets the GIL back from a
    # CPU-bound worker thread; a shorter switch interval shortens that wait.
    sys.setswitchinterval(settings.switch_interval_ms / 1000)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    try:
        app = create_app(settings)
    except ConnectionError as exc:  # a configured database that cannot be reached
        raise click.ClickException(str(exc)) from exc
    config = server_config(app, settings)
    HeedServer(config, app).run()


@click.command()
def version() -> None:
    """Print heed's version."""
    click.echo(__version__)
