"""Standard training panels from ``RUN_DIR/metrics.jsonl``, several runs overlaid in one PNG (``sao plot``).

Metric names the trainer should emit (first name found per run wins; a panel with none says "no data"):

============================  =========================================================================
panel                         metric names (fallbacks after the first)
============================  =========================================================================
reward                        ``reward/mean``, ``reward``; plus ``eval/pass@1`` (held-out, see below)
critic explained variance     ``critic/explained_variance``, ``value_pretrain/explained_variance``
critic grad norm              ``critic/grad_norm`` (before clipping)
DIS masked fraction           ``dis/masked_frac``
policy lag (tokens)           ``lag/token_mean``, ``lag/trajectory_mean``
throughput                    ``throughput/trajectories_per_s``, ``throughput/tokens_per_s``
============================  =========================================================================

The reward panel also draws the held-out evaluation, ``eval/pass@1`` (and, when the run evaluates more
than one task file, each file's ``eval/<file stem>/pass@1``), as lines with markers labelled
"held-out Pass@1" on the same axes as the training reward, at the steps the evaluations measured (not
smoothed). Evaluation records may hold only ``eval/*`` keys; a run with evaluations but no reward metric
still draws them.

Each JSONL line is ``{"step": s, "time": t, name: value, ...}``; ``null`` (NaN) values and unparsable
lines (a half-written last line of a live run) are skipped. Drawing uses matplotlib's object API with the
Agg canvas (no pyplot, no display, no global backend switch).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sao.sinks import METRICS_FILE

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "PANELS",
    "Panel",
    "Series",
    "build_figure",
    "held_out_series",
    "plot_runs",
    "read_metrics",
    "resolve_metrics_file",
    "smooth",
]

Series = tuple[list[float], list[float]]  # (steps, values)
Smoothing = Literal["mean", "ema"]


@dataclass(frozen=True)
class Panel:
    title: str
    metrics: tuple[str, ...]  # candidates, first found wins
    held_out: str | None = None  # also draw ``eval/<held_out>`` and ``eval/<file>/<held_out>``, with markers
    held_out_label: str = ""


PANELS: tuple[Panel, ...] = (
    Panel("reward (mean)", ("reward/mean", "reward"), held_out="pass@1", held_out_label="held-out Pass@1"),
    Panel("critic explained variance", ("critic/explained_variance", "value_pretrain/explained_variance")),
    Panel("critic grad norm", ("critic/grad_norm",)),
    Panel("DIS masked fraction", ("dis/masked_frac",)),
    Panel("policy lag (mean, tokens)", ("lag/token_mean", "lag/trajectory_mean")),
    Panel("throughput", ("throughput/trajectories_per_s", "throughput/tokens_per_s")),
)


def resolve_metrics_file(run: str | Path) -> Path:
    """``run/metrics.jsonl`` (or ``run`` itself when it is a ``.jsonl`` file).

    Raises FileNotFoundError with a message naming what is missing.
    """
    path = Path(run)
    if path.is_file() and path.suffix == ".jsonl":
        return path
    if not path.exists():
        raise FileNotFoundError(f"run directory {str(path)!r} does not exist")
    if not path.is_dir():
        raise FileNotFoundError(f"{str(path)!r} is neither a run directory nor a .jsonl file")
    metrics = path / METRICS_FILE
    if not metrics.is_file():
        raise FileNotFoundError(f"run directory {str(path)!r} has no {METRICS_FILE}")
    return metrics


def read_metrics(path: str | Path) -> dict[str, Series]:
    """Every numeric metric of a metrics JSONL file: name -> (steps, values), in file order."""
    series: dict[str, Series] = {}
    with Path(path).open(encoding="utf-8") as lines:
        for line in lines:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            step = record.get("step") if isinstance(record, dict) else None
            if not isinstance(step, (int, float)):
                continue
            for name, value in record.items():
                if name in ("step", "time") or isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                if math.isfinite(value):
                    steps, values = series.setdefault(name, ([], []))
                    steps.append(float(step))
                    values.append(float(value))
    return series


def smooth(values: Sequence[float], window: int, kind: Smoothing = "mean") -> list[float]:
    """Trailing moving average over ``window`` points, or an EMA with span ``window``
    (alpha = 2 / (window + 1)); ``window <= 1`` returns the values unchanged. Same length as ``values``."""
    if window <= 1 or not values:
        return list(values)
    if kind == "ema":
        alpha, out, acc = 2.0 / (window + 1), [], values[0]
        for v in values:
            acc = alpha * v + (1 - alpha) * acc
            out.append(acc)
        return out
    if kind != "mean":
        raise ValueError(f"smoothing kind must be 'mean' or 'ema', got {kind!r}")
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _run_label(run: Path) -> str:
    return run.parent.name if run.suffix == ".jsonl" and run.is_file() else run.name or str(run)


def _pick_metrics(panel: Panel, data: Sequence[tuple[str, dict[str, Series]]]) -> list[str | None]:
    """Per run, the panel metric to draw: candidates that more runs share come first (then panel order),
    so that runs are compared on one metric whenever they have one in common."""
    shared = sorted(panel.metrics, key=lambda m: -sum(m in series for _, series in data))
    return [next((m for m in shared if m in series), None) for _, series in data]


_FILE_MARKERS = ("s", "^", "D", "v", "P", "X")


def held_out_series(series: dict[str, Series], metric: str) -> list[tuple[str | None, Series]]:
    """The evaluation curves of ``metric`` in one run, sorted by step: ``(None, eval/<metric>)`` first,
    then ``(stem, eval/<stem>/<metric>)`` per task file when there are two or more files."""
    per_file = re.compile(rf"^eval/([^/]+)/{re.escape(metric)}$")
    files = sorted(m.group(1) for name in series if (m := per_file.match(name)))
    names: list[tuple[str | None, str]] = [(None, f"eval/{metric}")] if f"eval/{metric}" in series else []
    if len(files) > 1:
        names += [(stem, f"eval/{stem}/{metric}") for stem in files]
    out = []
    for stem, name in names:
        points = sorted(zip(*series[name], strict=True))
        out.append((stem, ([s for s, _ in points], [v for _, v in points])))
    return out


def _draw_held_out(
    ax: Any, panel: Panel, data: Sequence[tuple[str, dict[str, Series]]]
) -> list[tuple[int, Any]]:
    """The panel's held-out curves (markers, run colours) as (run index, line) pairs."""
    if panel.held_out is None:
        return []
    label = panel.held_out_label or f"held-out {panel.held_out}"
    lines = []
    for i, (_, series) in enumerate(data):
        curves = held_out_series(series, panel.held_out)
        for j, (stem, (steps, values)) in enumerate(c for c in curves if c[0] is not None):
            marker = _FILE_MARKERS[j % len(_FILE_MARKERS)]
            (line,) = ax.plot(
                steps, values, ":", marker=marker, ms=4, color=f"C{i}", lw=1.0, label=f"{label} ({stem})"
            )
            lines.append((i, line))
        for stem, (steps, values) in curves:
            if stem is None:
                (line,) = ax.plot(steps, values, "-", marker="o", ms=4, color=f"C{i}", lw=1.2, label=label)
                lines.append((i, line))
    return lines


def build_figure(
    runs: Sequence[str | Path],
    *,
    window: int = 1,
    kind: Smoothing = "mean",
    panels: Sequence[Panel] = PANELS,
) -> Figure:
    """The panels of ``runs`` (legend: run directory name) as a matplotlib Figure (Agg canvas).

    A panel whose runs use different fallback metrics draws the second one dashed on a right-hand axis.
    A panel with ``held_out`` also draws the evaluation curves (see the module docstring) on its left axis,
    with a legend telling them from the training curve. Raises FileNotFoundError (see
    :func:`resolve_metrics_file`) before drawing anything.
    """
    from matplotlib.figure import Figure

    data = [(_run_label(Path(run)), read_metrics(resolve_metrics_file(run))) for run in runs]
    ncols = 3
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(5.5 * ncols, 3.8 * nrows + 0.6), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    handles: dict[str, Any] = {}
    for ax, panel in zip(axes, panels, strict=False):
        used = _draw_training(ax, panel, data, window, kind, handles)
        held_out = _draw_held_out(ax, panel, data)
        for i, line in held_out:
            handles.setdefault(data[i][0], line)  # a run with evaluations only
        if held_out:
            _held_out_legend(ax, panel, used, held_out)
        _finish_axes(ax, panel, has_data=bool(used or held_out))
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    if handles:
        title = f"smoothing: {kind}, window {window}" if window > 1 else None
        fig.legend(
            list(handles.values()),
            list(handles),
            loc="outside upper center",
            ncols=min(len(handles), 6),
            title=title,
            title_fontsize=8,
        )
    return fig


def _draw_training(
    ax: Any,
    panel: Panel,
    data: Sequence[tuple[str, dict[str, Series]]],
    window: int,
    kind: Smoothing,
    handles: dict[str, Any],
) -> list[str]:
    """The panel's training curves (smoothed, run colours; a second metric dashed on a right-hand axis);
    adds each run's first line to ``handles``; returns the metrics drawn, left axis first."""
    names = _pick_metrics(panel, data)
    used = list(dict.fromkeys(n for n in names if n is not None))
    targets = {name: ax if j == 0 else ax.twinx() for j, name in enumerate(used)}
    for i, ((label, series), name) in enumerate(zip(data, names, strict=True)):
        if name is None:
            continue
        steps, values = series[name]
        style = "-" if targets[name] is ax else "--"
        (line,) = targets[name].plot(steps, smooth(values, window, kind), style, color=f"C{i}", lw=1.4)
        handles.setdefault(label, line)
    for name, target in targets.items():
        target.set_ylabel(name if target is ax else f"{name} (dashed)", fontsize=8)
    return used


def _held_out_legend(ax: Any, panel: Panel, used: list[str], held_out: list[tuple[int, Any]]) -> None:
    """A legend telling the training metrics (solid gray) from each held-out curve style."""
    from matplotlib.lines import Line2D

    if not used:
        ax.set_ylabel(f"eval/{panel.held_out}", fontsize=8)
    kinds = [Line2D([], [], color="gray", lw=1.4, label=name) for name in used]
    by_label = {line.get_label(): line for _, line in held_out}
    kinds += [
        Line2D([], [], color="gray", ls=line.get_linestyle(), marker=line.get_marker(), label=text)
        for text, line in sorted(by_label.items())
    ]
    ax.legend(handles=kinds, fontsize=7, loc="best")


def _finish_axes(ax: Any, panel: Panel, *, has_data: bool) -> None:
    """Title and step axis; a panel without data says so, with the metric names it looked for."""
    from matplotlib.ticker import MaxNLocator

    ax.set_title(panel.title)
    ax.set_xlabel("step")
    if has_data:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    else:
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="gray")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_ylabel(" / ".join(panel.metrics), fontsize=7, color="gray")


def plot_runs(
    runs: Sequence[str | Path],
    out: str | Path,
    *,
    window: int = 1,
    kind: Smoothing = "mean",
    panels: Sequence[Panel] = PANELS,
) -> Path:
    """:func:`build_figure` saved as the PNG ``out`` (parent directories created); returns its path."""
    fig = build_figure(runs, window=window, kind=kind, panels=panels)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100, format="png")
    return out
