"""`sao inspect`: kept trajectories, sessions or evaluation samples as one self-contained HTML report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from sao.cli.common import _fail, _quiet_transformers, _stdout, app


@app.command("inspect")
def inspect_command(
    path: Annotated[
        str,
        typer.Argument(
            metavar="PATH",
            help="A run directory (logging.inspect_every), a JSONL of trajectories (sao serve --out), or an "
            "evaluation report (sao eval --transcripts --out).",
        ),
    ],
    step: Annotated[int | None, typer.Option(help="Only this kept step of a run.")] = None,
    out: Annotated[
        str | None, typer.Option("--out", help="The HTML file (default: PATH's inspect.html).")
    ] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(help="Tokenizer (model) directory that decodes a JSONL's or report's token ids."),
    ] = None,
) -> None:
    """Write one static HTML file (no server, no external assets) showing every token of every trajectory:
    the list (sortable, filterable by step and reward) and, for one trajectory, its tokens coloured by
    advantage, DIS ratio, value, version or entropy, with every number on hover."""
    from sao.inspector import InspectSourceError, load_source, write_html

    _quiet_transformers()
    try:
        doc = load_source(path, step=step, tokenizer=tokenizer)
    except InspectSourceError as err:
        raise _fail(f"error: {err}") from None
    p = Path(path)
    target = Path(out) if out else (p / "inspect.html" if p.is_dir() else p.with_suffix(".inspect.html"))
    written = write_html(doc, target)
    size = written.stat().st_size / 2**20
    console = _stdout()
    console.print(f"{len(doc['trajectories'])} trajectories -> {written} ({size:.1f} MiB)", markup=False,
                  highlight=False)  # fmt: skip
    for reason in doc.get("skipped", [])[:5]:
        console.print(f"skipped: {reason}", markup=False, highlight=False)
