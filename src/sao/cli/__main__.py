"""``python -m sao.cli ...`` runs the ``sao`` command (as ``python -m sao`` does)."""

from sao.cli import app

app()
