"""Statistics of a sweep: bootstrap intervals of means and of curves, permutation tests of differences
between arms, recovery after an online shift, and small curve summaries (`sao report`, `sao compare`).

Everything here is pure and deterministic given ``seed``: each bootstrap / permutation test gets a fresh
``numpy.random.default_rng(seed)``. Non-finite values (NaN, and also ±inf) are dropped before any statistic.
Intervals are percentile bootstrap intervals of the mean (``scipy.stats.bootstrap``, ``method="percentile"``);
p-values come from ``scipy.stats.permutation_test`` on the difference of means, exact whenever the number of
distinct arrangements is at most ``N_RESAMPLES`` (e.g. 5 vs 5 seeds: 252 arrangements).

Point estimates (means) are ``math.fsum(x) / n``, so `curve_band` and `mean_interval` give bit-identical
means for the same values. Every interval is widened, if need be, to contain its point estimate (a guard
against floating-point rounding of the resampled means; for the mean it changes nothing otherwise).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

LEVEL = 0.95
N_RESAMPLES = 10_000

# scipy >= 1.15 names the generator argument ``rng``; older releases call it ``random_state``.
_RNG_KW = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"
# Most resampled values one `curve_band` bootstrap call holds (points x resamples x runs), to bound memory.
_CHUNK_ELEMENTS = 4_000_000

ArrayLike1D = Sequence[float] | np.ndarray


@dataclass(frozen=True)
class Interval:
    """Mean of ``n`` values and the ``level`` percentile bootstrap interval ``[low, high]`` of the mean
    (same units as the values). ``n == 1``: ``low == high == mean``; ``n == 0``: all NaN."""

    mean: float
    low: float
    high: float
    n: int


@dataclass(frozen=True)
class Difference:
    """``mean(a) - mean(b)`` (units of the values), its bootstrap interval ``[low, high]``, the two-sided
    permutation-test p-value, the group sizes and ``test``, the human name of the test that was run."""

    a: str
    b: str
    mean: float
    low: float
    high: float
    p_value: float
    n_a: int
    n_b: int
    test: str


# ---------------------------------------------------------------------------------------------- validation


def _check_level(level: float) -> None:
    """Raise unless ``0 < level < 1``."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")


def _check_resamples(n_resamples: int) -> None:
    """Raise unless ``n_resamples >= 1``."""
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples!r}")


def _check_frac(frac: float) -> None:
    """Raise unless ``0 < frac <= 1``."""
    if not 0.0 < frac <= 1.0:
        raise ValueError(f"frac must be in (0, 1], got {frac!r}")


def _finite_1d(values: ArrayLike1D, name: str = "values") -> np.ndarray:
    """``values`` as a float array of shape (n,), non-finite entries dropped; raise unless 1-D."""
    x = np.asarray(values, dtype=float)
    if x.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {x.shape}")
    return x[np.isfinite(x)]


def _mean(x: np.ndarray) -> float:
    """Correctly rounded mean of a non-empty 1-D array (order-independent, so bit-identical everywhere)."""
    return math.fsum(x.tolist()) / x.size


def _rng(seed: int) -> dict[str, np.random.Generator]:
    """Keyword argument giving scipy's resampling functions a fresh generator seeded with ``seed``."""
    return {_RNG_KW: np.random.default_rng(seed)}


# ------------------------------------------------------------------------------------------------ intervals


def _contain(mean: float, low: float, high: float) -> tuple[float, float]:
    """``(low, high)`` widened to contain ``mean``."""
    return min(low, mean), max(high, mean)


def mean_interval(
    values: ArrayLike1D, *, level: float = LEVEL, n_resamples: int = N_RESAMPLES, seed: int = 0
) -> Interval:
    """Mean of ``values`` (shape (n,), any units; non-finite dropped) and its ``level`` percentile bootstrap
    interval. One value: ``low == high == mean``; none: all NaN; all equal: ``low == high == mean``."""
    _check_level(level)
    _check_resamples(n_resamples)
    x = _finite_1d(values)
    if x.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = _mean(x)
    if x.size == 1 or np.all(x == x[0]):
        return Interval(mean, mean, mean, int(x.size))
    res = stats.bootstrap(
        (x,),
        np.mean,
        n_resamples=n_resamples,
        vectorized=True,
        confidence_level=level,
        method="percentile",
        **_rng(seed),
    )
    low, high = _contain(mean, float(res.confidence_interval.low), float(res.confidence_interval.high))
    return Interval(mean, low, high, int(x.size))


def _band_group(
    values: np.ndarray, level: float, n_resamples: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Means and bootstrap bounds of ``values`` (shape (points, k), k >= 1 finite runs per point), each of
    shape (points,). Each point's numbers equal `mean_interval` of its row with the same ``seed``."""
    mean = np.array([_mean(row) for row in values])
    low, high = mean.copy(), mean.copy()
    varied = np.flatnonzero(np.any(values != values[:, :1], axis=1))
    if varied.size == 0:
        return mean, low, high
    k = values.shape[1]
    chunk = max(1, _CHUNK_ELEMENTS // (n_resamples * k))
    for start in range(0, varied.size, chunk):
        rows = varied[start : start + chunk]
        res = stats.bootstrap(
            (values[rows],),
            np.mean,
            n_resamples=n_resamples,
            vectorized=True,
            axis=-1,
            confidence_level=level,
            method="percentile",
            **_rng(seed),
        )
        low[rows] = np.minimum(res.confidence_interval.low, mean[rows])
        high[rows] = np.maximum(res.confidence_interval.high, mean[rows])
    return mean, low, high


def curve_band(
    matrix: np.ndarray,
    *,
    level: float = LEVEL,
    n_resamples: int = 2000,
    seed: int = 0,
    min_runs: int = 1,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-point mean across runs and its ``level`` percentile bootstrap band.

    ``matrix``: shape (runs, points), NaN where a run has no value at a point. Returns ``(mean, low, high,
    count)``, each shape (points,): ``count`` is the number of finite values at each point (int); a point
    with fewer than ``min_runs`` of them (or none) gets NaN mean/low/high. Points are grouped by their count
    and each group is one vectorised bootstrap, so a point's numbers equal `mean_interval` of its finite
    values (in run order) with the same ``seed`` and ``n_resamples``.
    """
    _check_level(level)
    _check_resamples(n_resamples)
    if min_runs < 1:
        raise ValueError(f"min_runs must be >= 1, got {min_runs!r}")
    m = np.asarray(matrix, dtype=float)
    if m.ndim != 2:
        raise ValueError(f"matrix must be 2-D (runs, points), got shape {m.shape}")
    finite = np.isfinite(m)
    count = finite.sum(axis=0)
    mean, low, high = (np.full(m.shape[1], math.nan) for _ in range(3))
    for k in np.unique(count[count >= min_runs]):
        if k == 0:
            continue
        cols = np.flatnonzero(count == k)
        # Row-major boolean indexing keeps each point's finite values together, in run order.
        values = m[:, cols].T[finite[:, cols].T].reshape(cols.size, int(k))
        mean[cols], low[cols], high[cols] = _band_group(values, level, n_resamples, seed)
    return mean, low, high, count


# ---------------------------------------------------------------------------------------------- differences


def _mean_diff(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """Vectorised statistic ``mean(x) - mean(y)`` along ``axis``."""
    return np.mean(x, axis=axis) - np.mean(y, axis=axis)


def _test_name(n_a: int, n_b: int, n_resamples: int) -> str:
    """Human name of the permutation test scipy runs for these group sizes (exact or Monte Carlo)."""
    if math.comb(n_a + n_b, n_a) <= n_resamples:
        return "permutation test (difference of means, two-sided, exact)"
    return f"permutation test (difference of means, two-sided, Monte Carlo, {n_resamples} resamples)"


def min_p_value(n_a: int, n_b: int) -> float:
    """Smallest two-sided p-value the exact permutation test can give for groups of ``n_a`` and ``n_b``
    values: ``2 / C(n_a + n_b, n_a)``, capped at 1 (5 vs 5 seeds: 2/252 ≈ 0.0079)."""
    if n_a < 0 or n_b < 0:
        raise ValueError(f"group sizes must be >= 0, got {n_a!r} and {n_b!r}")
    return min(1.0, 2.0 / math.comb(n_a + n_b, n_a))


def _diff_interval(x: np.ndarray, y: np.ndarray, mean: float, seed: int) -> tuple[float, float]:
    """Percentile bootstrap interval of ``mean(x) - mean(y)``, resampling within each group."""
    if np.all(x == x[0]) and np.all(y == y[0]):
        return mean, mean
    res = stats.bootstrap(
        (x, y),
        _mean_diff,
        n_resamples=N_RESAMPLES,
        vectorized=True,
        axis=-1,
        confidence_level=LEVEL,
        method="percentile",
        **_rng(seed),
    )
    return _contain(mean, float(res.confidence_interval.low), float(res.confidence_interval.high))


def _sorted_sum(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """Vectorised statistic ``sum(x)`` along ``axis``, summed in sorted order (``y`` is unused)."""
    return np.sort(x, axis=axis).sum(axis=axis)


def _p_value(x: np.ndarray, y: np.ndarray, seed: int) -> float:
    """Two-sided permutation-test p-value of ``mean(x) - mean(y)`` (exact when scipy can enumerate).

    Given the pooled values, ``mean(x) - mean(y)`` is a strictly increasing affine function of ``sum(x)``,
    so both statistics give the same p-value; the sum (of the values shifted to be >= 0, in sorted order)
    is the one computed, because tied arrangements then compare equal in floating point. The difference
    of two means cancels, and scipy's relative tie tolerance misses ties that rounded apart (e.g. with
    repeated values), which made the p-value depend on the order of the groups.
    """
    shift = min(x.min(), y.min())
    res = stats.permutation_test(
        (x - shift, y - shift),
        _sorted_sum,
        permutation_type="independent",
        vectorized=True,
        n_resamples=N_RESAMPLES,
        alternative="two-sided",
        axis=-1,
        **_rng(seed),
    )
    return float(res.pvalue)


def difference(
    a_values: ArrayLike1D, b_values: ArrayLike1D, *, a: str = "a", b: str = "b", seed: int = 0
) -> Difference:
    """``mean(a_values) - mean(b_values)`` (shapes (n_a,), (n_b,), same units; non-finite dropped), its
    95 % percentile bootstrap interval (independent resampling within each group) and the two-sided
    permutation-test p-value. Either group with < 2 values: interval and p-value NaN (the mean is still
    given when both are non-empty) and ``test`` says no test was run."""
    x, y = _finite_1d(a_values, "a_values"), _finite_1d(b_values, "b_values")
    n_a, n_b = int(x.size), int(y.size)
    mean = _mean(x) - _mean(y) if n_a and n_b else math.nan
    if n_a < 2 or n_b < 2:
        test = "none (fewer than 2 values in a group)"
        return Difference(a, b, mean, math.nan, math.nan, math.nan, n_a, n_b, test)
    low, high = _diff_interval(x, y, mean, seed)
    p_value = _p_value(x, y, seed)
    return Difference(a, b, mean, low, high, p_value, n_a, n_b, _test_name(n_a, n_b, N_RESAMPLES))


# ------------------------------------------------------------------------------------------ curve summaries


def trailing_mean(x: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average of ``x`` (shape (n,)) over ``window`` points; the first ``window - 1``
    points average what is there so far. Shape (n,)."""
    csum = np.concatenate(([0.0], np.cumsum(x)))
    idx = np.arange(1, x.size + 1)
    start = np.maximum(idx - window, 0)
    return (csum[idx] - csum[start]) / (idx - start)


def recovery_steps(
    steps: np.ndarray,
    values: np.ndarray,
    shift_at: float,
    *,
    pre_window: int = 10,
    fraction: float = 0.9,
    smooth: int = 5,
) -> float:
    """Steps a curve takes to recover after an online shift at ``shift_at`` (units of ``steps``).

    ``steps``, ``values``: shape (n,), steps ascending; points with a non-finite step or value are dropped.
    Pre-shift level = mean of the last ``pre_window`` values with ``step < shift_at`` (strictly before).
    The recovery starts at the drop: the first post-shift value (``step >= shift_at``) below ``fraction`` ×
    pre-level. (In an asynchronous run the steps right after a shift still train on episodes generated
    before it, so the curve falls a few steps late; counting from the shift alone would call those steps a
    recovery.) From the drop on, the values are smoothed with a *trailing* moving average of ``smooth``
    points over those values only (fewer at the start), so the answer never looks ahead.
    Returns (first step from the drop whose smoothed value is >= ``fraction`` × pre-level) − ``shift_at``;
    (first post-shift step) − ``shift_at`` when the curve never drops; NaN when there are no pre-shift
    values or the pre-level is <= 0 (nothing to recover); ``math.inf`` when it never recovers within the
    data (censored: the caller reports it).
    """
    if pre_window < 1 or smooth < 1:
        raise ValueError(f"pre_window and smooth must be >= 1, got {pre_window!r} and {smooth!r}")
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    s, v = np.asarray(steps, dtype=float), np.asarray(values, dtype=float)
    if s.ndim != 1 or s.shape != v.shape:
        raise ValueError(f"steps and values must be 1-D of equal length, got {s.shape} and {v.shape}")
    keep = np.isfinite(s) & np.isfinite(v)
    s, v = s[keep], v[keep]
    if np.any(np.diff(s) < 0):
        raise ValueError("steps must be ascending")
    pre = v[s < shift_at]
    if pre.size == 0:
        return math.nan
    level = _mean(pre[-pre_window:])
    if level <= 0:
        return math.nan
    post = s >= shift_at
    post_s, post_v = s[post], v[post]
    if post_s.size == 0:
        return math.inf
    threshold = fraction * level
    below = np.flatnonzero(post_v < threshold)
    if below.size == 0:  # never dropped: back at the first post-shift step
        return float(post_s[0] - shift_at)
    start = below[0]
    hit = np.flatnonzero(trailing_mean(post_v[start:], smooth) >= threshold)
    return float(post_s[start:][hit[0]] - shift_at) if hit.size else math.inf


def _head_count(n: int, frac: float) -> int:
    """``ceil(frac * n)``, at least 1, robust to rounding (0.07 * 100 gives 7, not 8)."""
    return max(1, math.ceil(round(frac * n, 9)))


def tail_mean(values: ArrayLike1D, frac: float) -> float:
    """Mean of the last ``ceil(frac * n)`` finite values of ``values`` (shape (n,)), ``frac`` in (0, 1];
    NaN when there are none."""
    _check_frac(frac)
    x = _finite_1d(values)
    return _mean(x[-_head_count(x.size, frac) :]) if x.size else math.nan


def head_mean(values: ArrayLike1D, frac: float) -> float:
    """Mean of the first ``ceil(frac * n)`` finite values of ``values`` (shape (n,)), ``frac`` in (0, 1];
    NaN when there are none."""
    _check_frac(frac)
    x = _finite_1d(values)
    return _mean(x[: _head_count(x.size, frac)]) if x.size else math.nan


def roughness(values: ArrayLike1D) -> float:
    """Mean absolute difference of consecutive finite values of ``values`` (shape (n,); same units), a
    smoothness measure for e.g. grad-norm curves (lower = smoother); NaN for fewer than 2 values."""
    x = _finite_1d(values)
    return float(np.mean(np.abs(np.diff(x)))) if x.size >= 2 else math.nan
