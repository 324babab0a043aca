"""Shared pieces of the `sao` command line: the typer `app`, the version callback and small helpers.

Command modules import `app` from here and register their commands on it.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from sao import __version__
from sao.config import ConfigError, RunConfig, load_config

app = typer.Typer(
    name="sao",
    help="Single-Rollout Asynchronous Optimization: asynchronous, agentic RL for LLMs.",
    epilog="Config keys: sao config --explain [KEY]. Algorithm presets: sao presets. Guides and the key "
    "reference: docs/ (docs/reference/config.md).",
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


def _quiet_transformers() -> None:
    """No shard/load progress bars or load reports (a critic built from a policy checkpoint has an
    'unexpected' LM head and a 'missing' value head by design); sao prints its own progress."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _split_config_args(args: list[str]) -> tuple[str | None, list[str]]:
    """`[CONFIG.yaml] [key=value ...]`: the first argument is the config file unless it is an override."""
    if args and "=" not in args[0]:
        return args[0], args[1:]
    return None, args


ConfigArgs = Annotated[
    list[str] | None,
    typer.Argument(metavar="[CONFIG.yaml] [KEY=VALUE]...", help="Config file, then dotted overrides."),
]


def _config_from_args(args: list[str] | None) -> RunConfig:
    """The run config named by a command's ``[CONFIG.yaml] [KEY=VALUE]...`` arguments; exits 2 on errors."""
    path, overrides = _split_config_args(args or [])
    try:
        return load_config(path, overrides)
    except ConfigError as err:
        raise _fail(f"error: {err}") from None
