"""Reading a sweep's runs and putting them on common axes: per arm, one row per run (seed).

A run's ``metrics.jsonl`` gives each metric as (step, value) points. Three x-axes:

- ``step``: the trainer step (evaluation records: the step whose weights were evaluated);
- ``trajectories``: step × the run's ``trainer.batch_size`` (trained trajectories);
- ``wall``: ``runtime/elapsed_s`` of the step, seconds since the run started (value pretraining included,
  summed over resumes); curves over wall time hold each run's last value (step function) on a common grid.

Owns: reading runs and aligning them. Does not own: the statistics (`stats`) or drawing (`report`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import yaml

from sao.runtime.plots import read_metrics
from sao.sinks import METRICS_FILE

from .execute import read_outcome, run_state
from .stats import trailing_mean

__all__ = ["Axis", "Curve", "RunData", "align", "load_run"]

Axis = Literal["step", "trajectories", "wall"]
ELAPSED = "runtime/elapsed_s"


@dataclass
class RunData:
    """One run's metrics: name -> (steps, values), each a float array in step order."""

    arm: str
    seed: int
    run_dir: Path
    status: str
    batch_size: int
    total_steps: int
    series: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    wall_s: float = math.nan  # the outcome's wall time (all attempts), NaN when unknown

    @property
    def steps_done(self) -> int:
        steps = self.series.get("trainer/step")
        return int(steps[0][-1]) if steps is not None and len(steps[0]) else 0

    def x(self, axis: Axis, steps: np.ndarray) -> np.ndarray:
        """``steps`` on ``axis``."""
        if axis == "step":
            return steps
        if axis == "trajectories":
            return steps * self.batch_size
        elapsed = self.series.get(ELAPSED)
        if elapsed is None or not len(elapsed[0]):
            return np.full_like(steps, np.nan)
        return np.interp(steps, elapsed[0], elapsed[1])  # eval steps are training steps: exact hits


def _read_series(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """name -> (steps, values) in step order, from `read_metrics` (non-finite values and unparsable lines
    skipped); the last record wins for a repeated (name, step)."""
    out = {}
    for name, (steps, values) in read_metrics(path).items():
        by_step = dict(zip(steps, values, strict=True))
        xs = np.array(sorted(by_step), dtype=float)
        out[name] = (xs, np.array([by_step[x] for x in xs], dtype=float))
    return out


def load_run(run_dir: str | Path, arm: str | None = None, seed: int | None = None) -> RunData:
    """A run's metrics and settings. ``arm``/``seed`` default to the run's config (``name``,
    ``trainer.seed``). Raises FileNotFoundError naming what is missing, ValueError for an unreadable
    config."""
    run_dir = Path(run_dir)
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise FileNotFoundError(
            f"{str(run_dir)!r} has no config.yaml (not a run directory, or never started)"
        )
    try:
        cfg = yaml.safe_load(config_path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"{str(config_path)!r} is not valid YAML: {err}") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{str(config_path)!r} is not a run config (a mapping)")
    trainer = cfg.get("trainer", {})
    metrics = run_dir / METRICS_FILE
    series = _read_series(metrics) if metrics.is_file() else {}
    outcome = read_outcome(run_dir)
    return RunData(
        arm=arm if arm is not None else str(cfg.get("name", run_dir.name)),
        seed=seed if seed is not None else int(trainer.get("seed", 0)),
        run_dir=run_dir,
        status=run_state(run_dir),
        batch_size=int(trainer.get("batch_size", 1)),
        total_steps=int(trainer.get("total_steps", 0)),
        series=series,
        wall_s=outcome.wall_s if outcome else math.nan,
    )


@dataclass(frozen=True)
class Curve:
    """One metric of one arm on one axis: ``values`` (runs, points) on the common ``x`` (NaN: no value)."""

    x: np.ndarray
    values: np.ndarray
    seeds: tuple[int, ...]


def align(
    runs: Sequence[RunData], metric: str, axis: Axis, *, smooth: int = 1, grid_points: int = 100
) -> Curve | None:
    """The runs' ``metric`` on a common x (None when no run logged it).

    ``step``/``trajectories``: the union of the runs' x values (a run missing a point has NaN there).
    ``wall``: ``grid_points`` evenly spaced seconds up to the longest run; each run holds its latest value
    (NaN before its first and after its last point). Curves are smoothed per run (trailing mean of
    ``smooth`` points) before aligning; evaluation metrics (``eval/*``, a few points) are not smoothed.
    """
    per_run: list[tuple[np.ndarray, np.ndarray]] = []
    for run in runs:
        s = run.series.get(metric)
        if s is None or not len(s[0]):
            per_run.append((np.empty(0), np.empty(0)))
            continue
        steps, values = s
        if smooth > 1 and not metric.startswith("eval/"):
            values = trailing_mean(values, smooth)
        per_run.append((run.x(axis, steps), values))
    if not any(len(x) for x, _ in per_run):
        return None
    if axis == "wall":
        finite = [x[np.isfinite(x)] for x, _ in per_run]
        top = max((float(x.max()) for x in finite if len(x)), default=0.0)
        grid = np.linspace(0.0, top, grid_points)
        matrix = np.full((len(runs), grid_points), np.nan)
        for i, (x, v) in enumerate(per_run):
            ok = np.isfinite(x)
            x, v = x[ok], v[ok]
            if not len(x):
                continue
            pos = np.searchsorted(x, grid, side="right") - 1  # the latest point at or before each grid time
            inside = (pos >= 0) & (grid <= x[-1])
            matrix[i, inside] = v[pos[inside]]
        return Curve(grid, matrix, tuple(r.seed for r in runs))
    xs = np.unique(np.concatenate([x for x, _ in per_run if len(x)]))
    matrix = np.full((len(runs), len(xs)), np.nan)
    for i, (x, v) in enumerate(per_run):
        if len(x):
            matrix[i, np.searchsorted(xs, x)] = v
    return Curve(xs, matrix, tuple(r.seed for r in runs))
