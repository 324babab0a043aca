"""Shared discipline of the throughput benchmarks (imported as a sibling module): interleaved arms, repeats,
median and range, the machine's load before and after.

This machine is noisy (±30-50 % run to run), so a benchmark

- runs its arms interleaved, ``A B C A B C ...`` (`interleaved`): a slow spell hits every arm, not one;
- repeats at least 5 times and reports each arm's median and range (`Spread`), and ratios as the ratio of
  medians plus the range of the per-repetition ratios (`ratio`);
- prints the load average before and after (`LoadWatch`) and warns when the machine was busy (a 1-minute
  load above ``busy`` — by default half the cores: the benchmark's own processes count too).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["LoadWatch", "Spread", "interleaved", "ratio"]

T = TypeVar("T")


@dataclass(frozen=True)
class Spread:
    """Median and range of repeated measurements."""

    values: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    def fmt(self, spec: str = ".2f", unit: str = "") -> str:
        return f"{self.median:{spec}}{unit} [{self.low:{spec}}-{self.high:{spec}}]"


def ratio(num: Sequence[float], den: Sequence[float]) -> tuple[float, Spread]:
    """``(median(num) / median(den), spread of the per-repetition ratios num[i] / den[i])``."""
    per_rep = tuple(a / b for a, b in zip(num, den, strict=True))
    return statistics.median(num) / statistics.median(den), Spread(per_rep)


def interleaved(
    arms: dict[str, Callable[[int], T]], reps: int, on_result: Callable[[str, int, T], Any] | None = None
) -> dict[str, list[T]]:
    """Run ``arms[name](rep)`` for rep 0..reps-1, one round of every arm per repetition, in the given order
    (``A B C A B C ...``); returns each arm's results in repetition order."""
    out: dict[str, list[T]] = {name: [] for name in arms}
    for rep in range(reps):
        for name, run in arms.items():
            result = run(rep)
            out[name].append(result)
            if on_result is not None:
                on_result(name, rep, result)
    return out


class LoadWatch:
    """The load average at construction and at `report` (``os.getloadavg``), with a warning when busy."""

    def __init__(self, busy: float | None = None) -> None:
        self.cores = os.cpu_count() or 1
        self.busy = busy if busy is not None else self.cores / 2
        self.before = os.getloadavg()
        self.started = time.monotonic()

    def report(self) -> str:
        after = os.getloadavg()
        minutes = (time.monotonic() - self.started) / 60
        b = "/".join(f"{x:.2f}" for x in self.before)
        a = "/".join(f"{x:.2f}" for x in after)
        line = f"load average (1/5/15 min) before {b}, after {a} over {minutes:.1f} min on {self.cores} cores"
        if self.before[0] > self.busy:
            line += f"\nWARNING: the machine was busy before the benchmark (1-min load > {self.busy:g})"
        return line
