"""The `sao` command line.

Module import stays light (no torch/transformers): commands import heavy modules inside their bodies.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table

from sao import __version__
from sao.config import AlgoConfig, ConfigError, CriticConfig, dump_config, load_config
from sao.presets import PRESET_DESCRIPTIONS, PRESETS

app = typer.Typer(
    name="sao",
    help="Single-Rollout Asynchronous Optimization: asynchronous, agentic RL for LLMs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Width used when stdout is not a terminal (pipes, CI, tests), so tables are not squeezed to 80 columns.
_PIPE_WIDTH = 200


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"sao {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """Single-Rollout Asynchronous Optimization: asynchronous, agentic RL for LLMs."""


def _stdout() -> Console:
    console = Console()
    return console if console.is_terminal else Console(width=_PIPE_WIDTH)


def _fail(message: str, code: int = 2) -> typer.Exit:
    Console(stderr=True, soft_wrap=True).print(message, style="red", markup=False, highlight=False)
    return typer.Exit(code)


def _split_config_args(args: list[str]) -> tuple[str | None, list[str]]:
    """`[CONFIG.yaml] [key=value ...]`: the first argument is the config file unless it is an override."""
    if args and "=" not in args[0]:
        return args[0], args[1:]
    return None, args


@app.command("config")
def config_command(
    args: Annotated[
        list[str] | None,
        typer.Argument(metavar="[CONFIG.yaml] [KEY=VALUE]...", help="Config file, then dotted overrides."),
    ] = None,
) -> None:
    """Load and validate a config, then print it fully resolved (defaults, preset, file, overrides)."""
    path, overrides = _split_config_args(args or [])
    try:
        cfg = load_config(path, overrides)
    except ConfigError as err:
        raise _fail(f"error: {err}") from None
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


if __name__ == "__main__":
    app()
