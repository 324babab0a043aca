"""Tests of `sao.sweep.stats`: hand-computed cases, NaN handling, validation and hypothesis properties."""

from __future__ import annotations

import itertools
import math
import warnings
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sao.sweep import stats as S

finite = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False)
samples = st.lists(finite, min_size=2, max_size=12)
small_groups = st.lists(finite, min_size=2, max_size=6)
quarters = st.integers(-20, 20).map(lambda k: k / 4)
cents = st.integers(-(10**5), 10**5).map(lambda k: k / 100)
FAST = 200  # bootstrap resamples in property tests


@pytest.fixture(autouse=True)
def _no_warnings():
    """Every test runs with warnings as errors: degenerate inputs must be handled quietly."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


# ------------------------------------------------------------------------------------------- mean_interval


def test_mean_interval_hand_computed():
    iv = S.mean_interval([1.0, 2.0, 3.0, 4.0, 5.0], seed=3)
    assert iv.mean == 3.0 and iv.n == 5
    assert 1.0 <= iv.low < 3.0 < iv.high <= 5.0
    # The percentile bootstrap of the mean of 1..5 has sd sqrt(2/5) ≈ 0.63: the 95 % interval is about ±1.2.
    assert iv.low == pytest.approx(3.0 - 1.96 * math.sqrt(0.4), abs=0.2)
    assert iv.high == pytest.approx(3.0 + 1.96 * math.sqrt(0.4), abs=0.2)


def test_mean_interval_degenerate_cases():
    assert S.mean_interval([2.5]) == S.Interval(2.5, 2.5, 2.5, 1)
    assert S.mean_interval([7.0] * 6) == S.Interval(7.0, 7.0, 7.0, 6)
    empty = S.mean_interval([])
    assert empty.n == 0 and all(math.isnan(v) for v in (empty.mean, empty.low, empty.high))
    only_nan = S.mean_interval([math.nan, math.nan])
    assert only_nan.n == 0 and math.isnan(only_nan.mean)


def test_mean_interval_drops_nan():
    with_nan = S.mean_interval([1.0, math.nan, 2.0, 4.0, math.nan], n_resamples=500, seed=1)
    without = S.mean_interval([1.0, 2.0, 4.0], n_resamples=500, seed=1)
    assert with_nan == without and with_nan.n == 3


def test_mean_interval_deterministic_and_seeded():
    x = np.random.default_rng(0).normal(size=8)
    assert S.mean_interval(x, seed=5) == S.mean_interval(x, seed=5)
    assert S.mean_interval(x, seed=5) != S.mean_interval(x, seed=6)


def test_mean_interval_wider_at_higher_level():
    x = np.random.default_rng(0).normal(size=10)
    narrow, wide = S.mean_interval(x, level=0.5), S.mean_interval(x, level=0.99)
    assert wide.low < narrow.low < narrow.high < wide.high


@pytest.mark.parametrize("level", [0.0, 1.0, -0.5, 95])
def test_mean_interval_rejects_bad_level(level):
    with pytest.raises(ValueError, match="level"):
        S.mean_interval([1.0, 2.0], level=level)


def test_mean_interval_rejects_bad_input():
    with pytest.raises(ValueError, match="1-D"):
        S.mean_interval(np.ones((2, 2)))
    with pytest.raises(ValueError, match="n_resamples"):
        S.mean_interval([1.0, 2.0], n_resamples=0)


@settings(deadline=None, max_examples=30)
@given(samples, st.integers(0, 2**16))
def test_mean_interval_contains_mean(xs, seed):
    iv = S.mean_interval(xs, n_resamples=FAST, seed=seed)
    assert iv.n == len(xs)
    assert iv.mean == pytest.approx(float(np.mean(xs)), abs=1e-9)
    assert iv.low <= iv.mean <= iv.high
    assert min(xs) - 1e-9 <= iv.low and iv.high <= max(xs) + 1e-9


@settings(deadline=None, max_examples=30)
@given(samples, st.floats(min_value=-100, max_value=100), st.integers(0, 2**16))
def test_mean_interval_shift_equivariant(xs, c, seed):
    iv = S.mean_interval(xs, n_resamples=FAST, seed=seed)
    shifted = S.mean_interval([x + c for x in xs], n_resamples=FAST, seed=seed)
    assert shifted.mean == pytest.approx(iv.mean + c, abs=1e-9)
    assert shifted.low == pytest.approx(iv.low + c, abs=1e-9)
    assert shifted.high == pytest.approx(iv.high + c, abs=1e-9)


# ---------------------------------------------------------------------------------------------- curve_band


def test_curve_band_hand_computed():
    m = np.array(
        [
            [1.0, 5.0, math.nan, math.nan, 2.0],
            [3.0, 5.0, 4.0, math.nan, math.nan],
            [2.0, 5.0, math.nan, math.nan, 4.0],
        ]
    )
    mean, low, high, count = S.curve_band(m)
    assert count.tolist() == [3, 3, 1, 0, 2]
    np.testing.assert_array_equal(mean[[0, 1, 2, 4]], [2.0, 5.0, 4.0, 3.0])
    assert math.isnan(mean[3]) and math.isnan(low[3]) and math.isnan(high[3])
    assert low[1] == high[1] == 5.0  # all equal
    assert low[2] == high[2] == 4.0  # one run
    assert 1.0 <= low[0] < 2.0 < high[0] <= 3.0
    assert 2.0 <= low[4] < 3.0 < high[4] <= 4.0


def test_curve_band_min_runs():
    m = np.array([[1.0, 1.0, math.nan], [2.0, math.nan, math.nan], [3.0, 2.0, 5.0]])
    mean, low, high, count = S.curve_band(m, min_runs=2)
    assert count.tolist() == [3, 2, 1]
    assert mean[0] == 2.0 and mean[1] == 1.5
    assert all(math.isnan(v) for v in (mean[2], low[2], high[2]))


def test_curve_band_matches_mean_interval_pointwise():
    rng = np.random.default_rng(1)
    m = rng.normal(size=(6, 40))
    m[rng.random(m.shape) < 0.3] = math.nan
    mean, low, high, count = S.curve_band(m, n_resamples=300, seed=4)
    for j in range(m.shape[1]):
        iv = S.mean_interval(m[:, j], n_resamples=300, seed=4)
        assert count[j] == iv.n
        if iv.n == 0:
            assert math.isnan(mean[j])
            continue
        assert mean[j] == iv.mean  # the same correctly rounded mean
        assert low[j] == pytest.approx(iv.low, abs=1e-12)
        assert high[j] == pytest.approx(iv.high, abs=1e-12)


@settings(deadline=None, max_examples=30)
@given(
    st.integers(1, 6).flatmap(
        lambda runs: st.lists(
            st.lists(st.one_of(finite, st.just(math.nan)), min_size=runs, max_size=runs),
            min_size=1,
            max_size=8,
        )
    ),
    st.integers(0, 2**16),
)
def test_curve_band_properties(columns, seed):
    m = np.array(columns, dtype=float).T  # (runs, points)
    mean, low, high, count = S.curve_band(m, n_resamples=FAST, seed=seed)
    for arr in (mean, low, high, count):
        assert arr.shape == (m.shape[1],)
    np.testing.assert_array_equal(count, np.isfinite(m).sum(axis=0))
    for j in range(m.shape[1]):
        col = m[:, j][np.isfinite(m[:, j])]
        if col.size == 0:
            assert math.isnan(mean[j]) and math.isnan(low[j]) and math.isnan(high[j])
        else:
            assert mean[j] == S.mean_interval(col, n_resamples=FAST, seed=seed).mean
            assert low[j] <= mean[j] <= high[j]
            assert col.min() - 1e-9 <= low[j] and high[j] <= col.max() + 1e-9


def test_curve_band_large_runs():
    rng = np.random.default_rng(0)
    m = np.cumsum(rng.normal(size=(10, 500)), axis=1)
    m[rng.random(m.shape) < 0.1] = math.nan
    m[:, :5] = 1.0
    mean, low, high, count = S.curve_band(m)
    assert mean.shape == low.shape == high.shape == count.shape == (500,)
    assert np.all(np.isfinite(mean)) and np.all(low <= mean) and np.all(mean <= high)
    assert np.all(low[:5] == 1.0) and np.all(high[:5] == 1.0)


def test_curve_band_rejects_bad_input():
    with pytest.raises(ValueError, match="2-D"):
        S.curve_band(np.ones(5))
    with pytest.raises(ValueError, match="min_runs"):
        S.curve_band(np.ones((2, 2)), min_runs=0)
    with pytest.raises(ValueError, match="level"):
        S.curve_band(np.ones((2, 2)), level=1.5)


# ---------------------------------------------------------------------------------------------- difference


def test_difference_exact_five_vs_five():
    d = S.difference([1, 2, 3, 4, 5], [6, 7, 8, 9, 10], a="sao", b="grpo")
    assert (d.a, d.b, d.n_a, d.n_b) == ("sao", "grpo", 5, 5)
    assert d.mean == -5.0
    assert d.p_value == pytest.approx(2 / 252, rel=1e-12)
    assert d.p_value == pytest.approx(S.min_p_value(5, 5), rel=1e-12)
    assert d.test == "permutation test (difference of means, two-sided, exact)"
    # Each group's resampled mean lies in [1, 5] resp. [6, 10], so the difference lies in [-9, -1].
    assert -9.0 <= d.low < -5.0 < d.high <= -1.0


def test_difference_identical_groups():
    d = S.difference([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    assert d.mean == 0.0 and d.p_value == 1.0
    assert d.low < 0.0 < d.high


def test_difference_all_equal_values():
    d = S.difference([4.0, 4.0, 4.0], [4.0, 4.0])
    assert (d.mean, d.low, d.high, d.p_value) == (0.0, 0.0, 0.0, 1.0)
    shifted = S.difference([5.0, 5.0, 5.0], [4.0, 4.0, 4.0])
    assert (shifted.mean, shifted.low, shifted.high) == (1.0, 1.0, 1.0)
    assert shifted.p_value == pytest.approx(S.min_p_value(3, 3), rel=1e-12)


def test_difference_monte_carlo_for_large_groups():
    rng = np.random.default_rng(0)
    d = S.difference(rng.normal(size=10), rng.normal(size=10) + 5.0)
    assert d.test == "permutation test (difference of means, two-sided, Monte Carlo, 10000 resamples)"
    # Monte Carlo p-values count the observed arrangement: never below 2 / (N + 1).
    assert d.p_value == pytest.approx(2 / 10_001, rel=1e-9)
    assert d.high < 0.0


def test_difference_small_groups_and_nan():
    one = S.difference([1.0, math.nan], [2.0, 3.0])
    assert one.mean == -1.5 and (one.n_a, one.n_b) == (1, 2)
    assert math.isnan(one.low) and math.isnan(one.high) and math.isnan(one.p_value)
    empty = S.difference([], [2.0, 3.0])
    assert math.isnan(empty.mean) and empty.n_a == 0
    dropped = S.difference([1.0, math.nan, 2.0, 3.0], [math.nan, 6.0, 7.0])
    assert dropped == S.difference([1.0, 2.0, 3.0], [6.0, 7.0])
    with pytest.raises(ValueError, match="1-D"):
        S.difference(np.ones((2, 2)), [1.0, 2.0])


@settings(deadline=None, max_examples=30)
@given(small_groups, small_groups, st.integers(0, 2**16))
def test_difference_properties(xs, ys, seed):
    d = S.difference(xs, ys, a="x", b="y", seed=seed)
    swapped = S.difference(ys, xs, a="y", b="x", seed=seed)
    assert d.mean == pytest.approx(float(np.mean(xs) - np.mean(ys)), abs=1e-9)
    assert d.low <= d.mean <= d.high
    assert 0.0 < d.p_value <= 1.0
    assert d.p_value >= S.min_p_value(len(xs), len(ys)) * (1 - 1e-12)
    assert swapped.mean == -d.mean
    assert "exact" in d.test


@settings(deadline=None, max_examples=30)
@given(st.lists(cents, min_size=2, max_size=6), st.lists(cents, min_size=2, max_size=6))
def test_difference_swap_keeps_p_value(xs, ys):
    # Values at a metric's resolution (1/100); values far below float resolution of their neighbours
    # (1 + 1e-235) are indistinguishable from ties and may be counted either way.
    d, swapped = S.difference(xs, ys), S.difference(ys, xs)
    assert swapped.mean == -d.mean
    assert swapped.p_value == d.p_value


def _brute_force_p(xs: list[float], ys: list[float]) -> float:
    """Exact two-sided permutation p-value of the difference of means, by enumeration in exact arithmetic."""
    pooled = [Fraction(v) for v in xs + ys]
    total, n_a, n_b = sum(pooled), len(xs), len(ys)

    def stat(group: tuple[Fraction, ...]) -> Fraction:
        return sum(group) / n_a - (total - sum(group)) / n_b

    observed = stat(tuple(pooled[:n_a]))
    null = [stat(c) for c in itertools.combinations(pooled, n_a)]
    less, greater = sum(v <= observed for v in null), sum(v >= observed for v in null)
    return min(1.0, 2 * min(less, greater) / len(null))


@settings(deadline=None, max_examples=30)
@given(st.lists(quarters, min_size=2, max_size=5), st.lists(quarters, min_size=2, max_size=5))
def test_difference_p_value_matches_enumeration(xs, ys):
    # Multiples of 1/4 add up exactly and tie often: the p-value must equal the exact enumeration.
    assert S.difference(xs, ys).p_value == pytest.approx(_brute_force_p(xs, ys), rel=1e-12)


def test_difference_p_value_ties_do_not_depend_on_order():
    # The difference of means rounds tied arrangements apart here (found by hypothesis).
    xs, ys = [0.0, 0.0, 0.0, 0.0, 0.0, 511.0], [0.0, 0.0, 0.0, 511.0, 1.96, 0.96]
    assert S.difference(xs, ys).p_value == S.difference(ys, xs).p_value
    assert S.difference(xs, ys).p_value == pytest.approx(_brute_force_p(xs, ys), rel=1e-12)


@pytest.mark.parametrize(
    ("n_a", "n_b", "expected"), [(5, 5, 2 / 252), (3, 3, 2 / 20), (2, 2, 2 / 6), (1, 1, 1.0), (10, 2, 2 / 66)]
)
def test_min_p_value(n_a, n_b, expected):
    assert S.min_p_value(n_a, n_b) == pytest.approx(expected, rel=1e-12)
    assert S.min_p_value(n_b, n_a) == S.min_p_value(n_a, n_b)


def test_min_p_value_rejects_negative():
    with pytest.raises(ValueError, match="group sizes"):
        S.min_p_value(-1, 3)


# ------------------------------------------------------------------------------------------ recovery_steps


def _shift_curve() -> tuple[np.ndarray, np.ndarray]:
    """Steps 0..19: level 1 before step 10, then 0, 0, 0.5, 1, 1, ... (hand-computed recoveries below)."""
    values = np.array([1.0] * 10 + [0.0, 0.0, 0.5] + [1.0] * 7)
    return np.arange(20.0), values


def test_recovery_steps_hand_computed():
    steps, values = _shift_curve()
    # Unsmoothed: step 13 is the first >= 0.9.
    assert S.recovery_steps(steps, values, 10, smooth=1) == 3.0
    # Trailing means of 3 from step 10: 0, 0, 1/6, 1/2, 5/6, 1 -> step 15.
    assert S.recovery_steps(steps, values, 10, smooth=3) == 5.0
    # fraction 0.5: the trailing mean of 3 at step 13 is exactly 0.5.
    assert S.recovery_steps(steps, values, 10, smooth=3, fraction=0.5) == 3.0
    # Smoothing uses post-shift values only: step 12 averages 0, 0, 0.5 (1/6); with pre-shift values mixed in
    # step 10 would already average 0.8.
    assert S.recovery_steps(steps, values, 10, smooth=5, fraction=0.1) == 2.0


def test_recovery_starts_at_the_drop_when_the_curve_falls_late():
    # An asynchronous run: steps 10-11 still train on pre-shift episodes (level 1), the drop is at step 12.
    steps = np.arange(20.0)
    values = np.array([1.0] * 12 + [0.0, 0.0, 0.5] + [1.0] * 5)
    assert S.recovery_steps(steps, values, 10, smooth=1) == 5.0  # back at step 15, not "at once" at step 10
    # Trailing mean of 3 from the drop: 0, 0, 1/6, 1/2, 5/6 (step 16), 1 -> 0.9 first at step 17.
    assert S.recovery_steps(steps, values, 10, smooth=3) == 7.0
    # A curve that never drops below the threshold is back at the first post-shift step.
    assert S.recovery_steps(steps, np.ones(20), 10, smooth=3) == 0.0
    # One that drops late and never comes back is censored.
    assert S.recovery_steps(steps, np.array([1.0] * 12 + [0.0] * 8), 10) == math.inf


def test_recovery_steps_pre_window_and_fractional_shift():
    steps = np.arange(10.0)
    values = np.array([10.0, 10.0, 2.0, 2.0, 0.0, 1.0, 1.9, 2.0, 2.0, 2.0])
    # Pre-level of the last 2 values before step 4 is 2 (the 10s are outside the window): threshold 1.8.
    assert S.recovery_steps(steps, values, 4, pre_window=2, smooth=1) == 2.0
    # With all 4 pre-shift values the level is 6: never reached -> censored.
    assert S.recovery_steps(steps, values, 4, pre_window=10, smooth=1) == math.inf
    # A shift between steps: the first step >= 3.5 is 4.
    assert S.recovery_steps(steps, values, 3.5, pre_window=2, smooth=1) == 2.5


def test_recovery_steps_censored_and_nan():
    steps, values = _shift_curve()
    never = values.copy()
    never[10:] = 0.5
    assert S.recovery_steps(steps, never, 10) == math.inf
    assert S.recovery_steps(steps, values, 20) == math.inf  # no data after the shift
    assert math.isnan(S.recovery_steps(steps, values, 0))  # nothing strictly before
    assert math.isnan(S.recovery_steps(steps, -values, 10))  # pre-level <= 0
    assert math.isnan(S.recovery_steps(steps, np.where(steps < 10, 0.0, 1.0), 10))  # pre-level 0


def test_recovery_steps_drops_nan():
    steps, values = _shift_curve()
    holed = values.copy()
    holed[[3, 12]] = math.nan
    # Without step 12 (0.5) the unsmoothed curve first reaches 0.9 at step 13 still.
    assert S.recovery_steps(steps, holed, 10, smooth=1) == 3.0
    # Trailing mean of 2 over the remaining post-shift values 0, 0, 1, 1: 0, 0, 0.5, 1 -> step 14.
    assert S.recovery_steps(steps, holed, 10, smooth=2) == 4.0


def test_recovery_steps_rejects_bad_input():
    steps, values = _shift_curve()
    with pytest.raises(ValueError, match="equal length"):
        S.recovery_steps(steps, values[:-1], 10)
    with pytest.raises(ValueError, match="ascending"):
        S.recovery_steps(steps[::-1], values, 10)
    with pytest.raises(ValueError, match="fraction"):
        S.recovery_steps(steps, values, 10, fraction=0.0)
    with pytest.raises(ValueError, match="smooth"):
        S.recovery_steps(steps, values, 10, smooth=0)


# ------------------------------------------------------------------------------------------ curve summaries


def test_tail_and_head_mean():
    x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    assert S.tail_mean(x, 0.2) == 9.5
    assert S.head_mean(x, 0.2) == 1.5
    assert S.tail_mean(x, 0.25) == 9.0  # ceil(2.5) = 3 values
    assert S.head_mean(x, 1.0) == 5.5
    assert S.tail_mean(x, 0.01) == 10.0  # at least one value
    assert S.tail_mean(np.arange(100.0), 0.07) == pytest.approx(np.mean(np.arange(93.0, 100.0)))  # 7, not 8
    assert S.tail_mean([1.0, 2.0, math.nan, 4.0, math.nan], 0.5) == 3.0  # last 2 of 3 finite values
    assert S.head_mean([math.nan, 1.0, 2.0, 4.0], 0.5) == 1.5
    assert math.isnan(S.tail_mean([], 0.5)) and math.isnan(S.head_mean([math.nan], 0.5))


@pytest.mark.parametrize("frac", [0.0, -0.1, 1.5])
def test_tail_head_reject_bad_frac(frac):
    with pytest.raises(ValueError, match="frac"):
        S.tail_mean([1.0, 2.0], frac)
    with pytest.raises(ValueError, match="frac"):
        S.head_mean([1.0, 2.0], frac)


def test_roughness():
    assert S.roughness([1.0, 3.0, 2.0, 2.0]) == 1.0  # |2| + |-1| + |0| over 3
    assert S.roughness([1.0, math.nan, 3.0]) == 2.0  # consecutive finite values
    assert S.roughness([5.0, 5.0, 5.0]) == 0.0
    assert math.isnan(S.roughness([1.0])) and math.isnan(S.roughness([]))
    smooth, jagged = np.linspace(0, 1, 50), np.tile([0.0, 1.0], 25)
    assert S.roughness(smooth) < S.roughness(jagged)
