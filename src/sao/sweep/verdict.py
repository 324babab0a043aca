"""A claim's verdict from a sweep's pairwise differences, by a rule fixed before the runs
(experiments/README.md, "Verdict rule").

A claim has one or more *parts*, each "arm ``high`` has a larger ``metric`` than arm ``low``" (the paper's
direction; for "lower is better" name the arms the other way round), with ``delta``, the smallest effect
that matters, in the metric's units. A part's `Difference` (``high − low``: its mean, 95 % bootstrap
interval and exact two-sided permutation p-value, as `sao report` writes them to ``differences.csv``) is

- ``reproduced``: mean > 0, interval above 0, and p ≤ max(0.05, the smallest p the seeds allow) — with 3
  vs 3 seeds that floor is 0.1 (every seed of one arm above every seed of the other), with 5 vs 5 0.008;
- ``not reproduced``: the interval lies below 0 (it excludes the paper's direction), or inside
  ``(−delta, delta)`` (no effect that matters);
- ``inconclusive``: anything else.

The claim is ``reproduced`` when every part is, ``partly`` when some are, ``not reproduced`` when every
part is not, else ``inconclusive``; ``not run`` when a part has no difference yet.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .stats import Difference

__all__ = [
    "Part",
    "claim_verdict",
    "min_p_value",
    "part_verdict",
    "read_differences",
]

REPRODUCED, PARTLY, NOT, INCONCLUSIVE, NOT_RUN = (
    "reproduced",
    "partly",
    "not reproduced",
    "inconclusive",
    "not run",
)
ALPHA = 0.05


@dataclass(frozen=True)
class Part:
    """``metric`` (a report column label, e.g. ``reward/mean (tail 0.2)``) is larger for arm ``high`` than
    for arm ``low``; ``delta``: the smallest effect that matters (the metric's units)."""

    metric: str
    high: str
    low: str
    delta: float


def min_p_value(n_a: int, n_b: int) -> float:
    """The smallest two-sided p-value an exact permutation test of ``n_a`` vs ``n_b`` values can give:
    2 / C(n_a + n_b, n_a) (1.0 when either group is empty)."""
    if n_a < 1 or n_b < 1:
        return 1.0
    return min(1.0, 2.0 / math.comb(n_a + n_b, n_a))


def part_verdict(diff: Difference | None, delta: float) -> str:
    """The verdict of one part from its ``high − low`` difference (see the module docstring)."""
    if diff is None or not math.isfinite(diff.mean):
        return NOT_RUN
    if diff.mean > 0 and diff.low > 0 and diff.p_value <= max(ALPHA, min_p_value(diff.n_a, diff.n_b)) + 1e-12:
        return REPRODUCED
    if diff.high < 0 or (diff.low > -delta and diff.high < delta):
        return NOT
    return INCONCLUSIVE


def claim_verdict(parts: Sequence[str]) -> str:
    """The claim's verdict from its parts' (see the module docstring)."""
    if not parts or NOT_RUN in parts:
        return NOT_RUN
    if all(p == REPRODUCED for p in parts):
        return REPRODUCED
    if REPRODUCED in parts:
        return PARTLY
    if all(p == NOT for p in parts):
        return NOT
    return INCONCLUSIVE


def read_differences(path: Path) -> dict[tuple[str, str, str], Difference]:
    """``differences.csv`` of `sao report`, keyed ``(metric, a, b)``; each pair is also under ``(metric, b,
    a)`` with the sign of the difference and its interval flipped (the p-value is symmetric)."""
    out: dict[tuple[str, str, str], Difference] = {}
    with Path(path).open(newline="") as handle:
        for row in csv.DictReader(handle):
            d = Difference(row["a"], row["b"], float(row["diff"]), float(row["low"]), float(row["high"]),
                           float(row["p_value"]), int(row["n_a"]), int(row["n_b"]), row["test"])  # fmt: skip
            out[(row["metric"], d.a, d.b)] = d
            flipped = Difference(d.b, d.a, -d.mean, -d.high, -d.low, d.p_value, d.n_b, d.n_a, d.test)
            out[(row["metric"], d.b, d.a)] = flipped
    return out
