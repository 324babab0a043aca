"""`sao sweep`, `sao report`, `sao compare`: seeded grids of arms × seeds and their reports."""

from __future__ import annotations

import math
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from sao.cli.common import _fail, _quiet_transformers, _stdout, app
from sao.config import ConfigError

if TYPE_CHECKING:
    from sao.sweep.spec import PlannedRun, SweepSpec

_Overrides = Annotated[
    list[str] | None,
    typer.Argument(metavar="[KEY=VALUE]...", help="Dotted overrides for every arm (after the spec's own)."),
]


def _load(spec_path: str, overrides: list[str] | None, smoke: bool) -> tuple[SweepSpec, list[PlannedRun]]:
    from sao.sweep.spec import load_spec, plan_runs

    bad = [o for o in overrides or [] if "=" not in o]
    if bad:
        raise _fail(f"error: {bad[0]!r} is not a KEY=VALUE override")
    try:
        spec = load_spec(spec_path)
        if overrides:
            spec = spec.model_copy(update={"overrides": [*spec.overrides, *overrides]})
        return spec, plan_runs(spec, smoke=smoke)
    except ConfigError as err:
        raise _fail(f"error: {err}") from None


def _report_dir(spec: SweepSpec, smoke: bool, out: str | None) -> Path:
    if out:
        return Path(out)
    return Path(spec.runs_root).parent / "smoke" / spec.name if smoke else spec.out_dir


def _write_spec_report(spec: SweepSpec, runs: list[PlannedRun], out_dir: Path) -> list[Path]:
    from sao.sweep.aggregate import load_run
    from sao.sweep.execute import run_state
    from sao.sweep.report import write_report

    by_arm: dict[str, list] = {arm.name: [] for arm in spec.arms}
    missing, excluded = [], []
    for run in runs:
        if run_state(run.run_dir) == "new" or not (run.run_dir / "config.yaml").is_file():
            missing.append(f"{run.arm} seed {run.seed}")
            continue
        try:
            data = load_run(run.run_dir, arm=run.arm, seed=run.seed)
        except (OSError, ValueError) as err:
            raise _fail(f"error: {err}", code=1) from None
        # Finished runs are the results; a crashed or unfinished one is listed, not averaged in.
        (by_arm[run.arm] if data.status in ("done", "stopped") else excluded).append(data)
    by_arm = {arm: rs for arm, rs in by_arm.items() if rs}
    if not by_arm:
        raise _fail(f"error: no run of sweep {spec.name!r} has finished; run `sao sweep` first", code=1)
    return write_report(by_arm, spec.report, out_dir, title=spec.name, description=spec.description,
                        not_started=missing, excluded=excluded)  # fmt: skip


@app.command("sweep")
def sweep_command(
    spec_path: Annotated[str, typer.Argument(metavar="SPEC.yaml", help="Sweep spec (see docs/sweeps.md).")],
    overrides: _Overrides = None,
    smoke: Annotated[
        bool, typer.Option("--smoke", help="First seed only, a few steps at toy sizes: does the spec work?")
    ] = False,
    jobs: Annotated[int | None, typer.Option(min=1, help="Runs at once (default: the spec's jobs).")] = None,
    retry_failed: Annotated[
        bool, typer.Option("--retry-failed", help="Run again the runs that failed (not the stopped ones).")
    ] = False,
    in_process: Annotated[
        bool, typer.Option("--in-process", help="Train the runs one by one in this process (no child).")
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan, run nothing.")] = False,
    report: Annotated[bool, typer.Option(help="Write the report when the sweep ends.")] = True,
    out: Annotated[str | None, typer.Option("--out", help="Report folder (default: the spec's).")] = None,
) -> None:
    """Run a grid of arms × seeds (each arm a preset plus overrides), each in its own run dir: finished
    runs are skipped, interrupted ones resumed; then `sao report`."""
    spec, runs = _load(spec_path, overrides, smoke)
    if in_process:
        _quiet_transformers()  # no load/save progress bars between the runs' own lines
        if (jobs or spec.jobs) > 1:
            _stdout().print("--in-process: the runs train one after another (jobs ignored)", highlight=False)
    console = _stdout()
    console.print(_plan_table(spec, runs, smoke))
    if dry_run:
        return
    result = _run_stoppable(spec, runs, jobs, retry_failed, in_process, console)
    summary = ", ".join(f"{len(v)} {k}" for k, v in result.items() if v)
    console.print(f"sweep {spec.name}: {summary or 'nothing to do'}", highlight=False)
    if report:
        paths = _write_spec_report(spec, runs, _report_dir(spec, smoke, out))
        console.print(f"report: {paths[-1]}", highlight=False)
    if result["failed"]:
        raise typer.Exit(1)


def _plan_table(spec: SweepSpec, runs: list[PlannedRun], smoke: bool) -> Table:
    """The planned runs: arm, seed, state (`run_state`), run dir."""
    from sao.sweep.execute import run_state

    table = Table(title=f"sweep {spec.name}{' (smoke)' if smoke else ''}: {len(runs)} runs")
    for column in ("arm", "seed", "state", "run dir"):
        table.add_column(column, no_wrap=True)
    for run in runs:
        table.add_row(run.arm, str(run.seed), run_state(run.run_dir), str(run.run_dir))
    return table


def _run_stoppable(
    spec: SweepSpec,
    runs: list[PlannedRun],
    jobs: int | None,
    retry_failed: bool,
    in_process: bool,
    console: Console,
) -> dict[str, list[PlannedRun]]:
    """`run_sweep`, printing each start and end; SIGTERM stops it as Ctrl-C does (exit 130, resumable)."""
    from sao.sweep.execute import run_sweep

    def event(kind: str, run: PlannedRun, outcome: object) -> None:
        if kind == "start":
            console.print(f"start {run.arm} seed {run.seed} -> {run.run_dir}", highlight=False)
        elif kind == "end":
            wall = getattr(outcome, "wall_s", math.nan)
            status = getattr(outcome, "status", "?")
            extra = f": {outcome.error}" if getattr(outcome, "error", "") else ""  # type: ignore[attr-defined]
            console.print(
                f"{status} {run.arm} seed {run.seed} in {wall / 60:.1f} min{extra}", highlight=False
            )

    def stop(signum: int, frame: object) -> None:  # `kill PID` stops the children as Ctrl-C does
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        return run_sweep(
            spec, runs, jobs=jobs, retry_failed=retry_failed, in_process=in_process, on_event=event
        )
    except KeyboardInterrupt:
        raise _fail(
            "interrupted: running runs were stopped; `sao sweep` again resumes them", code=130
        ) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


@app.command("report")
def report_command(
    spec_path: Annotated[str, typer.Argument(metavar="SPEC.yaml", help="The sweep spec that ran.")],
    overrides: _Overrides = None,
    smoke: Annotated[bool, typer.Option("--smoke", help="Report the spec's smoke runs.")] = False,
    out: Annotated[str | None, typer.Option("--out", help="Report folder (default: the spec's).")] = None,
) -> None:
    """Aggregate a sweep per arm: curves with 95 % bootstrap bands over seeds (by step, trajectories and wall
    time), the final-metric table, pairwise differences with permutation-test p-values; PNG, CSV, markdown."""
    spec, runs = _load(spec_path, overrides, smoke)
    paths = _write_spec_report(spec, runs, _report_dir(spec, smoke, out))
    for path in paths:
        typer.echo(f"wrote {path}")


@app.command("compare")
def compare_command(
    runs: Annotated[list[str], typer.Argument(metavar="RUN_DIR...", help="Run directories.")],
    out: Annotated[str, typer.Option("--out", help="Report folder.")] = "runs/compare",
    group_by: Annotated[
        str, typer.Option("--group-by", help="Arms from each run's config 'name', or its parent 'dir'.")
    ] = "name",
    curves: Annotated[
        str | None, typer.Option(help="Comma-separated curve metrics (default: the standard six).")
    ] = None,
    final: Annotated[
        list[str] | None,
        typer.Option("--final", help="METRIC[:HOW[:FRAC]], repeatable (HOW: last, tail, head, mean, ...)."),
    ] = None,
    smooth: Annotated[int, typer.Option(min=1, help="Trailing mean of each curve, in points.")] = 5,
) -> None:
    """The report of `sao report` for any runs: grouped into arms by config name (or parent dir)."""
    from pydantic import ValidationError

    from sao.sweep.aggregate import load_run
    from sao.sweep.report import write_report
    from sao.sweep.spec import ReportSpec

    if group_by not in ("name", "dir"):
        raise _fail(f"error: --group-by: must be 'name' or 'dir', got {group_by!r}")
    by_arm: dict[str, list] = {}
    for run_dir in runs:
        try:
            data = load_run(run_dir)
        except (FileNotFoundError, ValueError) as err:
            raise _fail(f"error: RUN_DIR: {err}") from None
        arm = data.arm if group_by == "name" else Path(run_dir).resolve().parent.name
        data.arm = arm
        by_arm.setdefault(arm, []).append(data)
    try:
        settings = ReportSpec(
            **({"curves": [c.strip() for c in curves.split(",") if c.strip()]} if curves else {}),
            **({"finals": [_parse_final(f) for f in final]} if final else {}),
            smooth=smooth,
        )
    except (ValidationError, ValueError) as err:
        raise _fail(f"error: --final: {err}") from None
    paths = write_report(by_arm, settings, out, title="compare", description=", ".join(runs))
    for path in paths:
        typer.echo(f"wrote {path}")


def _parse_final(text: str) -> dict[str, object]:
    parts = text.split(":")
    if len(parts) > 3 or not parts[0]:
        raise ValueError(f"{text!r}: expected METRIC[:HOW[:FRAC]]")
    item: dict[str, object] = {"metric": parts[0]}
    if len(parts) > 1:
        item["how"] = parts[1]
    if len(parts) > 2:
        item["frac"] = float(parts[2])
    return item
