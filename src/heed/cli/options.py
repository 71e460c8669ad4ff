"""What the ``heed`` commands share: the ``--data-dir`` option and reading the settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from heed.settings import InvalidSettings, Settings, load_settings

__all__ = ["data_dir_option", "settings_of"]

#: ``--data-dir``: where the database and files live.
data_dir_option = click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the database and files live (default: per-user data dir, HEED_DATA_DIR).",
)


def settings_of(**overrides: Any) -> Settings:
    """The settings (the ``HEED_*`` environment variables) with *overrides* over them; a
    setting that is not valid is the command's error (``click.ClickException``) naming it."""
    try:
        return load_settings(**overrides)
    except InvalidSettings as exc:
        raise click.ClickException(str(exc)) from None
