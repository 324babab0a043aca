"""Final metrics: one number per run (a `Final` of the spec), then per arm a mean with a 95 % bootstrap
interval over seeds, and every pair of arms' difference with its interval and permutation-test p-value.

A ``recovery`` final gives one column per shift; a run that never recovers within its steps is *censored*:
its value is the steps it had left after the shift (a lower bound), and the table counts such runs.

Owns: reducing runs to final numbers. Does not own: the statistics themselves (`stats`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import stats
from .aggregate import RunData
from .spec import Final

__all__ = ["ArmFinal", "Column", "FinalTable", "columns", "final_table", "run_value"]


@dataclass(frozen=True)
class Column:
    """A column of the final table: a `Final`, and for ``recovery`` the index of its shift."""

    final: Final
    shift: int | None = None

    @property
    def label(self) -> str:
        if self.shift is None:
            return self.final.label
        return f"{self.final.metric} (steps to recover after shift {self.shift + 1})"


def columns(finals: Sequence[Final]) -> list[Column]:
    out: list[Column] = []
    for final in finals:
        if final.how == "recovery":
            out.extend(Column(final, i) for i in range(len(final.shifts)))
        else:
            out.append(Column(final))
    return out


def run_value(run: RunData, column: Column) -> tuple[float, bool]:
    """(value, censored) of one run; NaN when the run did not log the metric."""
    series = run.series.get(column.final.metric)
    if series is None or not len(series[0]):
        return math.nan, False
    steps, values = series
    f = column.final
    if f.how == "last":
        return float(values[-1]), False
    if f.how == "tail":
        return stats.tail_mean(values, f.frac), False
    if f.how == "head":
        return stats.head_mean(values, f.frac), False
    if f.how == "mean":
        return float(np.mean(values)), False
    if f.how == "roughness":
        return stats.roughness(values), False
    if f.how == "max":
        return float(np.max(values)), False
    if f.how == "min":
        return float(np.min(values)), False
    if f.how == "drop":  # the best full window of the trailing mean (not the first points alone)
        smoothed = stats.trailing_mean(values, f.smooth)[min(f.smooth, len(values)) - 1 :]
        return max(0.0, float(np.max(smoothed)) - stats.tail_mean(values, f.frac)), False
    assert column.shift is not None
    # The shift comes after `shifts[i]` trained trajectories: the last step before it is shift_at, the
    # steps after it are counted from there (recovered at the first step after it: 1 step). Only the steps
    # up to the next shift count: a run still not back by then is censored there.
    shift_at = f.shifts[column.shift] / run.batch_size
    nxt = f.shifts[column.shift + 1] / run.batch_size if column.shift + 1 < len(f.shifts) else math.inf
    keep = steps <= nxt
    steps, values = steps[keep], values[keep]
    if not len(steps) or steps[-1] <= shift_at:
        return math.nan, False  # the run never got past this shift
    value = stats.recovery_steps(
        steps, values, shift_at + 1, pre_window=f.pre_window, fraction=f.fraction, smooth=f.smooth
    )
    if math.isinf(value):
        return float(steps[-1] - shift_at), True
    return value + 1, False


@dataclass(frozen=True)
class ArmFinal:
    """One arm × column: the runs' values (seed order), the interval and how many were censored."""

    arm: str
    column: Column
    seeds: tuple[int, ...]
    values: tuple[float, ...]
    interval: stats.Interval
    censored: int


@dataclass(frozen=True)
class FinalTable:
    arms: tuple[str, ...]
    columns: tuple[Column, ...]
    cells: dict[tuple[str, str], ArmFinal]  # (arm, column label)
    differences: dict[str, list[stats.Difference]]  # column label -> every pair of arms


def final_table(
    runs_by_arm: dict[str, list[RunData]], finals: Sequence[Final], *, seed: int = 0
) -> FinalTable:
    """Every column for every arm, and every pair's difference (in the arms' order: first − second)."""
    cols = columns(finals)
    cells: dict[tuple[str, str], ArmFinal] = {}
    diffs: dict[str, list[stats.Difference]] = {}
    for col in cols:
        for arm, runs in runs_by_arm.items():
            pairs = [run_value(r, col) for r in runs]
            values = tuple(v for v, _ in pairs)
            interval = stats.mean_interval(np.array(values), seed=seed)
            cells[(arm, col.label)] = ArmFinal(
                arm, col, tuple(r.seed for r in runs), values, interval, sum(c for _, c in pairs)
            )
        diffs[col.label] = [
            stats.difference(
                np.array(cells[(a, col.label)].values),
                np.array(cells[(b, col.label)].values),
                a=a,
                b=b,
                seed=seed,
            )
            for a, b in itertools.combinations(runs_by_arm, 2)
        ]
    return FinalTable(tuple(runs_by_arm), tuple(cols), cells, diffs)
