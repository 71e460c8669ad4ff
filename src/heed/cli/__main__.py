"""``python -m heed.cli``: the same as the ``heed`` command."""

from heed.cli import main

main()
