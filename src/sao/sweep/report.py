"""A sweep's report: curves with 95 % bootstrap bands across seeds, the final-metric table, pairwise
differences, and every run the sweep launched (none left out).

`write_report(runs_by_arm, settings, out_dir, title=...)` writes into ``out_dir``:

- ``curves_<axis>.png`` for each axis (step, trajectories, wall): a panel per curve metric, each arm's
  mean over seeds with its 95 % bootstrap band;
- ``curves.csv``: ``arm, axis, metric, x, mean, low, high, n`` (n = runs with a value at x);
- ``finals.csv``: ``arm, metric, mean, low, high, n, censored, values`` (values: per seed, ``seed:value``);
- ``differences.csv``: ``metric, a, b, diff, low, high, p_value, test, n_a, n_b``;
- ``runs.csv``: ``arm, seed, status, steps, wall_s, run_dir``;
- ``report.md``: the two tables and the run list in markdown, the figures linked.

Drawing uses matplotlib's object API with the Agg canvas (no pyplot, no display).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path

from . import stats
from .aggregate import RunData, align
from .finals import FinalTable, final_table
from .spec import ReportSpec

__all__ = ["AXIS_LABELS", "unlogged_metrics", "write_report"]

AXIS_LABELS: dict[str, str] = {
    "step": "trainer step",
    "trajectories": "trained trajectories",
    "wall": "wall time (s, value pretraining included)",
}


def _fmt(value: float, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if math.isinf(value):
        return "∞"
    return (
        f"{value:.{digits}g}"
        if abs(value) >= 1000 or (value != 0 and abs(value) < 1e-3)
        else f"{value:.{digits}f}"
    )


def _g(value: float) -> str:
    """A CSV number: 6 significant digits (the curves' files stay small enough to commit)."""
    return f"{value:.6g}"


def _interval(mean: float, low: float, high: float) -> str:
    if math.isnan(mean):
        return "–"
    if math.isnan(low) or low == high:
        return _fmt(mean)
    return f"{_fmt(mean)} [{_fmt(low)}, {_fmt(high)}]"


def _curves(runs_by_arm: dict[str, list[RunData]], settings: ReportSpec, out: Path) -> list[Path]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows: list[list[object]] = []
    pngs: list[Path] = []
    metrics = list(settings.curves)
    for axis in settings.x if metrics else ():
        cols = min(3, len(metrics))
        nrows = math.ceil(len(metrics) / cols)
        fig = Figure(figsize=(5.2 * cols, 3.6 * nrows), layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(nrows, cols, squeeze=False).ravel()
        for ax, metric in zip(axes, metrics, strict=False):
            drawn = False
            for i, (arm, runs) in enumerate(runs_by_arm.items()):
                curve = align(runs, metric, axis, smooth=settings.smooth)  # type: ignore[arg-type]
                if curve is None:
                    continue
                mean, low, high, count = stats.curve_band(curve.values)
                color = f"C{i}"
                marker = "o" if metric.startswith("eval/") else None
                ax.plot(curve.x, mean, color=color, label=f"{arm} (n={len(runs)})", marker=marker, ms=3)
                ax.fill_between(curve.x, low, high, color=color, alpha=0.2, linewidth=0)
                drawn = True
                rows.extend(
                    [arm, axis, metric, _g(x), _g(m), _g(lo), _g(hi), int(n)]
                    for x, m, lo, hi, n in zip(curve.x, mean, low, high, count, strict=True)
                )
            ax.set_title(metric if settings.smooth <= 1 or metric.startswith("eval/")
                         else f"{metric} (smoothed over {settings.smooth})", fontsize=10)  # fmt: skip
            ax.set_xlabel(AXIS_LABELS[axis], fontsize=9)
            if drawn:
                ax.legend(fontsize=8)
            else:
                ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        for ax in axes[len(metrics) :]:
            ax.set_visible(False)
        fig.suptitle("mean over seeds, 95 % bootstrap band", fontsize=10)
        path = out / f"curves_{axis}.png"
        fig.savefig(path, dpi=72)
        pngs.append(path)
    _write_csv(out / "curves.csv", ["arm", "axis", "metric", "x", "mean", "low", "high", "n"], rows)
    return pngs


def _write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def _finals_rows(table: FinalTable) -> list[list[object]]:
    rows: list[list[object]] = []
    for col in table.columns:
        for arm in table.arms:
            cell = table.cells[(arm, col.label)]
            iv = cell.interval
            values = " ".join(f"{s}:{v:.6g}" for s, v in zip(cell.seeds, cell.values, strict=True))
            rows.append([arm, col.label, iv.mean, iv.low, iv.high, iv.n, cell.censored, values])
    return rows


def _difference_rows(table: FinalTable) -> list[list[object]]:
    return [
        [label, d.a, d.b, d.mean, d.low, d.high, d.p_value, d.test, d.n_a, d.n_b]
        for label, diffs in table.differences.items()
        for d in diffs
    ]


def _markdown(
    title: str,
    description: str,
    table: FinalTable,
    runs_by_arm: dict[str, list[RunData]],
    pngs: list[Path],
    not_started: Sequence[str],
    excluded: Sequence[RunData],
    unlogged: Sequence[str],
) -> str:
    """``report.md``: the summary, the final-metric table, the pairwise differences, the runs, the figures."""
    lines = [f"# {title}", ""]
    if description:
        lines += [description.strip(), ""]
    lines += _summary_lines(table, runs_by_arm, not_started, excluded, unlogged)
    lines += _finals_lines(table)
    lines += _difference_lines(table)
    lines += _run_lines(runs_by_arm, excluded)
    lines.append("")
    lines += [f"![{p.stem}]({p.name})" for p in pngs]
    return "\n".join(lines) + "\n"


def _summary_lines(
    table: FinalTable,
    runs_by_arm: dict[str, list[RunData]],
    not_started: Sequence[str],
    excluded: Sequence[RunData],
    unlogged: Sequence[str],
) -> list[str]:
    """What the numbers cover: arms × seeds, runs by status, and what is left out of them (and why)."""
    all_runs = [r for runs in runs_by_arm.values() for r in runs] + list(excluded)
    statuses: dict[str, int] = {}
    for r in all_runs:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    seeds = sorted({r.seed for r in all_runs})
    return [
        f"{len(table.arms)} arms × {len(seeds)} seeds ({', '.join(map(str, seeds))}): {len(all_runs)} runs, "
        + ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()))
        + ". Every finished run (done, or stopped by itself) is in these numbers.",
        "",
        *([f"Not started yet (not in the numbers): {', '.join(not_started)}.", ""] if not_started else []),
        *(
            [
                f"Not in the numbers, listed under Runs: {_names(excluded)} — a failed run crashed (see its "
                "train.log); a running or interrupted one has not finished.",
                "",
            ]
            if excluded
            else []
        ),
        *([f"No run logged {', '.join(unlogged)}: check the metric names.", ""] if unlogged else []),
    ]


def _finals_lines(table: FinalTable) -> list[str]:
    """The final-metric table: an arm per row, each metric's mean [interval], censored columns marked."""
    lines = [
        "## Final metrics",
        "",
        "Mean over seeds [95 % percentile bootstrap interval of the mean]; ≥ marks columns where some runs "
        "never recovered (censored at the steps they had left).",
        "",
        "| arm | " + " | ".join(c.label for c in table.columns) + " |",
        "|---|" + "---|" * len(table.columns),
    ]
    for arm in table.arms:
        cells = []
        for col in table.columns:
            cell = table.cells[(arm, col.label)]
            text = _interval(cell.interval.mean, cell.interval.low, cell.interval.high)
            if cell.censored:
                text = f"≥ {text} ({cell.censored} censored)"
            cells.append(text)
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return lines


def _difference_lines(table: FinalTable) -> list[str]:
    """The pairwise-differences table (nothing when there is no pair)."""
    pairs = [d for diffs in table.differences.values() for d in diffs]
    if not pairs:
        return []
    tests = sorted({d.test for d in pairs})
    lines = [
        "",
        "## Pairwise differences",
        "",
        "a − b of the per-seed final values: mean [95 % bootstrap interval]; p: "
        + "; ".join(tests)
        + ". n: seeds in each arm, and the smallest p the test can give with them. A censored recovery "
        "enters the test as the steps it had (a lower bound).",
        "",
        "| metric | a − b | difference | p | n (p floor) | interval excludes 0 |",
        "|---|---|---|---|---|---|",
    ]
    for label, diffs in table.differences.items():
        for d in diffs:
            excl = "–" if math.isnan(d.low) else ("yes" if d.low > 0 or d.high < 0 else "no")
            floor = _fmt(stats.min_p_value(d.n_a, d.n_b)) if d.n_a and d.n_b else "–"
            lines.append(
                f"| {label} | {d.a} − {d.b} | {_interval(d.mean, d.low, d.high)} "
                f"| {_fmt(d.p_value)} | {d.n_a} vs {d.n_b} ({floor}) | {excl} |"
            )
    return lines


def _run_lines(runs_by_arm: dict[str, list[RunData]], excluded: Sequence[RunData]) -> list[str]:
    """Every run the sweep launched, the excluded ones included: arm, seed, status, steps, wall, run dir."""
    lines = [
        "",
        "## Runs",
        "",
        "| arm | seed | status | steps | wall (min) | run dir |",
        "|---|---|---|---|---|---|",
    ]
    for arm, runs in [*runs_by_arm.items(), *((r.arm, [r]) for r in excluded)]:
        for r in runs:
            wall = "–" if math.isnan(r.wall_s) else f"{r.wall_s / 60:.1f}"
            lines.append(
                f"| {arm} | {r.seed} | {r.status} | {r.steps_done}/{r.total_steps} | {wall} | `{r.run_dir}` |"
            )
    return lines


def write_report(
    runs_by_arm: dict[str, list[RunData]],
    settings: ReportSpec,
    out_dir: str | Path,
    *,
    title: str,
    description: str = "",
    not_started: Sequence[str] = (),
    excluded: Sequence[RunData] = (),
) -> list[Path]:
    """Write the report files (module docstring) into ``out_dir``; returns their paths. ``excluded``: runs
    listed (runs.csv, report.md) but not in the numbers (failed, unfinished)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not any(runs_by_arm.values()):
        raise ValueError("nothing to report: no run has finished yet")
    pngs = _curves(runs_by_arm, settings, out)
    table = final_table(runs_by_arm, settings.finals)
    _write_csv(out / "finals.csv", ["arm", "metric", "mean", "low", "high", "n", "censored", "values"],
               _finals_rows(table))  # fmt: skip
    _write_csv(out / "differences.csv",
               ["metric", "a", "b", "diff", "low", "high", "p_value", "test", "n_a", "n_b"],
               _difference_rows(table))  # fmt: skip
    _write_csv(out / "runs.csv", ["arm", "seed", "status", "steps", "wall_s", "run_dir"],
               [[a, r.seed, r.status, r.steps_done, r.wall_s, str(r.run_dir)]
                for a, runs in [*runs_by_arm.items(), *((r.arm, [r]) for r in excluded)]
                for r in runs])  # fmt: skip
    md = out / "report.md"
    unlogged = unlogged_metrics(runs_by_arm, settings)
    text = _markdown(title, description, table, runs_by_arm, pngs, not_started, excluded, unlogged)
    md.write_text(text, encoding="utf-8")
    return [*pngs, out / "curves.csv", out / "finals.csv", out / "differences.csv", out / "runs.csv", md]


def _names(runs: Sequence[RunData]) -> str:
    return ", ".join(f"{r.arm} seed {r.seed} ({r.status})" for r in runs)


def unlogged_metrics(runs_by_arm: dict[str, list[RunData]], settings: ReportSpec) -> list[str]:
    """The curve and final metrics no run logged (a misspelt name, or a metric of other presets)."""
    names = dict.fromkeys([*settings.curves, *(f.metric for f in settings.finals)])
    logged = {m for runs in runs_by_arm.values() for r in runs for m in r.series}
    return [m for m in names if m not in logged]
