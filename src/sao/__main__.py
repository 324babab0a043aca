"""``python -m sao ...`` is the ``sao`` command."""

from sao.cli import app

app(prog_name="sao")
