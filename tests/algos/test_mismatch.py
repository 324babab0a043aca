"""Training/inference mismatch: mean |Δ log-prob| and the k3 KL estimate on lag-0 action tokens, and the drift
ratio over a run (hand-computed values and properties)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sao.algos.mismatch import drift_ratio, k3_kl, lag0_mask, lag0_mismatch_metrics, mismatch_stats

F64 = torch.float64


def test_k3_is_r_minus_one_minus_log_r_by_hand():
    trainer = torch.tensor([-1.0, -2.0, -0.5], dtype=F64)
    engine = torch.tensor([-1.0, -1.5, -1.0], dtype=F64)  # d = 0, -0.5, +0.5
    expected = [0.0, math.exp(-0.5) - 1 + 0.5, math.exp(0.5) - 1 - 0.5]
    torch.testing.assert_close(k3_kl(trainer, engine), torch.tensor(expected, dtype=F64), rtol=1e-12, atol=0)


def test_the_step_metrics_count_only_action_tokens_sampled_at_the_trainers_version():
    trainer = torch.tensor([0.0, -1.0, -2.0, -3.0, -4.0, -5.0])
    engine = torch.tensor([9.0, -1.5, -2.0, -9.0, -3.0, -7.0])
    versions = torch.tensor([-1, 4, 4, 3, 4, 4])  # token 3 is one version old
    action = torch.tensor([0, 1, 1, 1, 1, 0])  # token 0 is the prompt, token 5 an observation
    out = lag0_mismatch_metrics(trainer, engine, versions, action, policy_version=4)
    assert out["mismatch/lag0_tokens"] == 3.0  # tokens 1, 2, 4
    assert out["mismatch/lag0_logprob_abs_diff"] == pytest.approx((0.5 + 0.0 + 1.0) / 3, abs=1e-7)
    k3 = ((math.exp(0.5) - 1 - 0.5) + 0.0 + (math.exp(-1.0) - 1 + 1.0)) / 3
    assert out["mismatch/lag0_k3_kl"] == pytest.approx(k3, abs=1e-7)


def test_a_step_without_lag_zero_tokens_logs_only_the_count():
    z = torch.zeros(3)
    out = lag0_mismatch_metrics(z, z, torch.tensor([1, 1, 1]), torch.tensor([0, 1, 1]), policy_version=2)
    assert out == {"mismatch/lag0_tokens": 0.0}


def test_shapes_must_agree():
    with pytest.raises(ValueError, match="shapes differ"):
        mismatch_stats(torch.zeros(3), torch.zeros(4), torch.ones(3, dtype=torch.bool))


def test_lag0_mask_is_action_and_version():
    mask = lag0_mask(torch.tensor([2, 2, 1, 2]), torch.tensor([True, False, True, True]), 2)
    assert mask.tolist() == [True, False, False, True]


finite = st.floats(-30.0, 0.0, allow_nan=False, width=32)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(finite, finite, st.booleans()), min_size=1, max_size=40))
def test_k3_is_nonnegative_zero_when_equal_and_inputs_are_untouched(rows):
    trainer = torch.tensor([r[0] for r in rows])
    engine = torch.tensor([r[1] for r in rows])
    mask = torch.tensor([r[2] for r in rows])
    before = (trainer.clone(), engine.clone(), mask.clone())
    per_token = k3_kl(trainer, engine)
    assert bool((per_token >= 0).all())
    d = (trainer.double() - engine.double()).abs()
    assert bool((per_token[d == 0] == 0).all())
    assert bool((per_token[d > 1e-6] > 0).all())  # below, d^2 / 2 is under float64's resolution of d
    stats = mismatch_stats(trainer, engine, mask)
    n = int(mask.sum())
    assert stats.tokens == n
    if n:
        diffs = [abs(float(t) - float(e)) for t, e, m in rows if m]
        assert stats.abs_diff == pytest.approx(sum(diffs) / n, rel=1e-6, abs=1e-9)
        assert stats.k3 == pytest.approx(float(per_token[mask].mean()), rel=1e-12)
    else:
        assert (stats.abs_diff, stats.k3) == (0.0, 0.0)
    for a, b in zip(before, (trainer, engine, mask), strict=True):
        assert torch.equal(a, b)


@settings(max_examples=100, deadline=None)
@given(st.floats(-1e-3, 1e-3, allow_nan=False))
def test_k3_of_a_small_difference_is_half_its_square(d):
    value = float(k3_kl(torch.tensor([d], dtype=F64), torch.tensor([0.0], dtype=F64))[0])
    assert value == pytest.approx(d * d / 2, rel=1e-3, abs=1e-18)


def test_a_huge_log_ratio_stays_finite():
    value = k3_kl(torch.tensor([0.0]), torch.tensor([-1e4]))
    assert math.isfinite(float(value[0])) and float(value[0]) > 1e8


def test_drift_ratio_compares_the_last_window_with_the_first():
    assert drift_ratio([0.01, 0.01, 0.01], window=2) is None  # the windows would overlap
    assert drift_ratio([0.01, 0.03, 0.5, 0.04, 0.06], window=2) == pytest.approx(0.05 / 0.02)
    assert drift_ratio([0.0, 0.0, 0.0, 0.0], window=2) == 1.0
    assert drift_ratio([0.0, 0.0, 0.1, 0.1], window=2) == math.inf
    with pytest.raises(ValueError, match="window"):
        drift_ratio([1.0], window=0)
