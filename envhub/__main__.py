"""``python -m envhub``: the ``envhub`` command."""

from envhub.cli import cli

cli(prog_name="envhub")
