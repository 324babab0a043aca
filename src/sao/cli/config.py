"""`sao config` and `sao presets`: inspect configs and algorithm presets."""

from __future__ import annotations

import sys

import typer
from rich.syntax import Syntax
from rich.table import Table

from sao.cli.common import ConfigArgs, _config_from_args, _stdout, app
from sao.config import AlgoConfig, CriticConfig, dump_config
from sao.presets import PRESET_DESCRIPTIONS, PRESETS


@app.command("config")
def config_command(
    args: ConfigArgs = None,
) -> None:
    """Load and validate a config, then print it fully resolved (defaults, preset, file, overrides)."""
    cfg = _config_from_args(args)
    text = dump_config(cfg)
    if sys.stdout.isatty():
        _stdout().print(Syntax(text, "yaml", background_color="default"))
    else:
        typer.echo(text, nl=False)


@app.command("presets")
def presets_command() -> None:
    """List the algorithm presets (`algo=NAME` on the command line selects one)."""
    table = Table()
    for column in ("name", "advantage", "loss", "eps band", "K", "critic freeze", "group"):
        table.add_column(column, no_wrap=True)
    table.add_column("description")
    for name, preset in PRESETS.items():
        algo = AlgoConfig(**preset["algo"])
        freeze = CriticConfig(**preset.get("critic", {})).freeze
        table.add_row(
            name,
            algo.advantage,
            algo.policy_loss,
            f"{algo.eps_low}/{algo.eps_high}",
            str(algo.k_critic) if algo.uses_critic else "-",
            str(freeze) if algo.uses_critic else "-",
            str(algo.group_size),
            PRESET_DESCRIPTIONS[name],
        )
    _stdout().print(table)
