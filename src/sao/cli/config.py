"""`sao config` and `sao presets`: inspect configs and algorithm presets."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.syntax import Syntax
from rich.table import Table

from sao.cli.common import ConfigArgs, _config_from_args, _fail, _stdout, app
from sao.config import AlgoConfig, CriticConfig, RunConfig, dump_config
from sao.presets import PRESET_DESCRIPTIONS, PRESETS


@app.command("config")
def config_command(
    args: ConfigArgs = None,
    explain: Annotated[
        bool,
        typer.Option(
            "--explain",
            help="Explain every key (or those under one KEY, a word without '='): type, default, description "
            "and the value this config gives it, e.g. `sao config --explain algo algo=grpo`.",
        ),
    ] = False,
    reference: Annotated[
        bool, typer.Option("--reference", help="Print the Markdown reference of every key (docs/reference).")
    ] = False,
    migrate: Annotated[
        bool,
        typer.Option(
            "--migrate",
            help="Print CONFIG.yaml with a flat algo section of earlier versions (algo.eps_low, "
            "algo.advantage: grpo, ...) rewritten in the typed shape (comments are not kept).",
        ),
    ] = False,
) -> None:
    """Load and validate a config, then print it fully resolved (defaults, preset, file, overrides)."""
    if migrate:
        _migrate(args or [])
        return
    if explain or reference:
        _explain_or_reference(args or [], explain, reference)
        return
    cfg = _config_from_args(args)
    text = dump_config(cfg)
    if sys.stdout.isatty():
        _stdout().print(Syntax(text, "yaml", background_color="default"))
    else:
        typer.echo(text, nl=False)


def _migrate(args: list[str]) -> None:
    import yaml

    from sao.config.migrate import migrate_config

    if len(args) != 1:
        raise _fail("error: --migrate takes one argument, the YAML file to rewrite")
    try:
        data = yaml.safe_load(Path(args[0]).read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise _fail(f"error: cannot read {args[0]}: {err}") from None
    migrated, notes = migrate_config(data)
    typer.echo(yaml.safe_dump(migrated, sort_keys=False), nl=False)
    for note in notes:
        typer.echo(f"note: {note}", err=True)


def _explain_or_reference(args: list[str], explain: bool, reference: bool) -> None:
    from sao.cli.config_docs import describe
    from sao.cli.explain import explain as explain_tree
    from sao.cli.explain import print_explain, reference_markdown

    if explain and reference:
        raise _fail("error: --explain and --reference: choose one")
    if reference:
        if args:
            raise _fail(f"error: --reference takes no arguments (it prints the schema), got {args[0]!r}")
        typer.echo(reference_markdown(describe(RunConfig)), nl=False)
        return
    try:
        root, origin = explain_tree(args)
    except ValueError as err:  # ConfigError, an unknown KEY, two files
        raise _fail(f"error: {err}") from None
    print_explain(root, _stdout(), origin)


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
            algo.advantage.type,
            algo.loss.type,
            f"{getattr(algo.loss, 'eps_low', '-')}/{getattr(algo.loss, 'eps_high', '-')}",
            str(algo.k_critic) if algo.uses_critic else "-",
            str(freeze) if algo.uses_critic else "-",
            str(algo.group_size),
            PRESET_DESCRIPTIONS[name],
        )
    _stdout().print(table)
