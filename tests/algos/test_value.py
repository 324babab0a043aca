"""Critic objective: masked (optionally clipped) MSE, and explained variance 1 − Var(R − V)/Var(R)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sao.algos import value as value_module
from sao.algos.value import explained_variance, value_loss

F64 = torch.float64


def _t(xs, dtype=F64):
    return torch.tensor(xs, dtype=dtype)


def _mask(xs):
    return torch.tensor(xs, dtype=torch.bool)


def test_value_loss_is_masked_mse_on_a_hand_case():
    # Action tokens 1, 2, 4: squared errors (.5−1)², (2−1)², (0−1)² = .25, 1, 1 → mean 2.25/3 = .75;
    # tokens 0 and 3 (prompt/observation) carry junk that must not enter.
    values = _t([50.0, 0.5, 2.0, -30.0, 0.0]).requires_grad_(True)
    returns = _t([0.0, 1.0, 1.0, 0.0, 1.0])
    mask = _mask([0, 1, 1, 0, 1])
    loss, metrics = value_loss(values, returns, mask)
    torch.testing.assert_close(loss, _t(0.75))
    loss.backward()
    # ∂/∂V of Σ(V − R)²/3 = 2(V − R)/3 on the masked tokens.
    torch.testing.assert_close(values.grad, _t([0.0, -1 / 3, 2 / 3, 0.0, -2 / 3]))
    torch.testing.assert_close(metrics["critic/value_loss"], _t(0.75))
    torch.testing.assert_close(metrics["critic/value_mean"], _t(2.5 / 3))
    torch.testing.assert_close(metrics["critic/return_mean"], _t(1.0))
    assert "critic/clip_frac" not in metrics


def test_value_loss_sequence_aggregation():
    values = _t([0.0, 0.0, 0.0])
    returns = _t([1.0, 3.0, 2.0])
    cu = torch.tensor([0, 2, 3])
    mask = _mask([1, 1, 1])
    # Per trajectory: (1 + 9)/2 = 5 and 4 → mean 4.5; token sums 10 and 4 → mean 7.
    torch.testing.assert_close(
        value_loss(values, returns, mask, agg="seq-mean-token-mean", cu_seqlens=cu)[0], _t(4.5)
    )
    torch.testing.assert_close(
        value_loss(values, returns, mask, agg="seq-mean-token-sum", cu_seqlens=cu)[0], _t(7.0)
    )


def test_value_loss_clipping_takes_the_worse_of_clipped_and_unclipped():
    # clip ε = .2 around V_old = .5, R = 1:
    #   V = 1.0: unclipped 0, clipped V' = .7 → .09  → .09 (clipped active, no gradient through V)
    #   V = .6:  inside the clip range, both .16     → .16 (gradient 2(V − R) = −.8)
    #   V = 0.0: unclipped 1, clipped V' = .3 → .49  → 1   (unclipped, gradient −2)
    values = _t([1.0, 0.6, 0.0]).requires_grad_(True)
    old = _t([0.5, 0.5, 0.5])
    returns = _t([1.0, 1.0, 1.0])
    loss, metrics = value_loss(values, returns, _mask([1, 1, 1]), old_values=old, clip_eps=0.2)
    torch.testing.assert_close(loss, _t((0.09 + 0.16 + 1.0) / 3))
    loss.backward()
    torch.testing.assert_close(values.grad, _t([0.0, -0.8 / 3, -2.0 / 3]))
    torch.testing.assert_close(metrics["critic/clip_frac"], torch.tensor(1 / 3))


def test_value_clipping_needs_old_values():
    x = _t([0.0])
    with pytest.raises(ValueError, match="old_values"):
        value_loss(x, x, _mask([1]), clip_eps=0.2)


def test_value_loss_targets_are_constants():
    values = _t([0.0, 1.0]).requires_grad_(True)
    returns = _t([1.0, 2.0]).requires_grad_(True)
    loss, _ = value_loss(values, returns, _mask([1, 1]))
    loss.backward()
    assert returns.grad is None
    assert values.grad is not None


def test_explained_variance_perfect_mean_and_constant_returns():
    returns = _t([1.0, 0.0, 3.0, 2.0, 99.0])
    mask = _mask([1, 1, 1, 1, 0])
    assert explained_variance(returns.clone(), returns, mask) == 1.0
    mean = float(returns[mask].mean())
    assert explained_variance(torch.full((5,), mean, dtype=F64), returns, mask) == pytest.approx(
        0.0, abs=1e-12
    )
    # Returns without variance over the mask: undefined.
    assert math.isnan(explained_variance(_t([0.1, 0.2, 0.3]), _t([1.0, 1.0, 5.0]), _mask([1, 1, 0])))
    assert math.isnan(explained_variance(_t([0.1]), _t([1.0]), _mask([0])))


def test_explained_variance_is_undefined_for_returns_flat_up_to_rounding():
    # A step-wise estimator on a batch where every episode failed: returns 0 in exact arithmetic, ~1e-19
    # after float32 GAE (recorded in a grid run), values ~0.03. The ratio would be ~−1e33; it is undefined.
    values = _t([0.031, 0.012, 0.058, 0.044])
    flat = _t([3.2e-20, -5.9e-20, 1.1e-19, 0.0])
    assert math.isnan(explained_variance(values, flat, _mask([1, 1, 1, 1])))
    # Flat at 1.0 with rounding of 1e-7 relative: undefined too.
    assert math.isnan(explained_variance(values, _t([1.0, 1.0 + 1e-7, 1.0 - 1e-7, 1.0]), _mask([1, 1, 1, 1])))
    # A small but real spread stays defined: returns 1e-3 apart around 1 (std 5e-4 ≫ 1e-6 × 1).
    got = explained_variance(_t([1.0, 1.0, 1.0, 1.0]), _t([1.0, 1.001, 1.0, 1.001]), _mask([1, 1, 1, 1]))
    assert got == pytest.approx(0.0, abs=1e-9)


def test_explained_variance_is_negative_for_a_critic_worse_than_the_mean():
    # R = [0, 2] (Var 1), V = [2, 0]: R − V = [−2, 2], Var 4 → 1 − 4 = −3.
    assert explained_variance(_t([2.0, 0.0]), _t([0.0, 2.0]), _mask([1, 1])) == pytest.approx(-3.0)


@settings(max_examples=50, deadline=None)
@given(
    n=st.integers(2, 60),
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_explained_variance_matches_numpy(n, seed, dtype):
    rng = np.random.default_rng(seed)
    returns = rng.normal(size=n)
    values = returns + rng.normal(scale=rng.uniform(0.1, 3.0), size=n)
    mask = rng.random(n) < 0.7
    mask[:2] = True  # at least two tokens, so Var(R) > 0 almost surely
    r32, v32 = torch.tensor(returns, dtype=dtype), torch.tensor(values, dtype=dtype)
    r, v = r32.double().numpy()[mask], v32.double().numpy()[mask]
    want = 1.0 - np.var(r - v) / np.var(r)
    got = explained_variance(v32, r32, torch.tensor(mask))
    assert isinstance(got, float)
    assert got == pytest.approx(want, rel=1e-9, abs=1e-9)


def test_value_loss_reports_explained_variance_over_the_mask():
    values = _t([0.0, 1.0, 2.5, 7.0])
    returns = _t([0.0, 1.0, 2.0, 0.0])
    mask = _mask([1, 1, 1, 0])
    _, metrics = value_loss(values, returns, mask)
    torch.testing.assert_close(
        metrics["critic/explained_variance"].double(), _t(explained_variance(values, returns, mask))
    )


@pytest.mark.parametrize("target", [-1.0, -0.1, 0.0, 1.0])
def test_value_clip_frac_does_not_count_an_unclipped_token(target):
    # |V − V_old| = .18017… < ε = .2, so nothing is clipped. Clipping as V_old + clamp(V − V_old, ±ε)
    # rounds to −0.05542847551318919 ≠ V, which for a return below both (e.g. R = −.1) made the "clipped"
    # loss larger and the token count as clipped.
    values = _t([-0.055428475513189204]).requires_grad_(True)
    old = _t([-0.2356017990047628])
    returns = _t([target])
    loss, metrics = value_loss(values, returns, _mask([1]), old_values=old, clip_eps=0.2)
    assert metrics["critic/clip_frac"].item() == 0.0
    assert loss.item() == ((values.detach() - returns) ** 2).item()  # bit-identical to the unclipped loss
    loss.backward()
    torch.testing.assert_close(values.grad, 2 * (values.detach() - returns))


def test_value_loss_without_metrics_returns_the_same_loss_and_no_metrics(monkeypatch):
    values = _t([1.0, 0.6, 0.0, 3.0]).requires_grad_(True)
    old = _t([0.5, 0.5, 0.5, 0.5])
    returns = _t([1.0, 1.0, 1.0, 0.0])
    mask = _mask([1, 1, 1, 0])
    for kwargs in ({}, {"old_values": old, "clip_eps": 0.2}):
        want, _ = value_loss(values, returns, mask, **kwargs)

        # No metrics means no explained variance and no host sync: every Tensor → Python conversion raises.
        def no_sync(*args, **kw):
            raise AssertionError("host sync")

        with monkeypatch.context() as m:
            m.setattr(value_module, "explained_variance", no_sync)
            for name in ("__float__", "__int__", "__bool__", "item", "tolist"):
                m.setattr(torch.Tensor, name, no_sync)
            got, metrics = value_loss(values, returns, mask, with_metrics=False, **kwargs)
        assert metrics == {}
        assert torch.equal(got, want)
        (grad,) = torch.autograd.grad(got, values)
        (want_grad,) = torch.autograd.grad(want, values)
        assert torch.equal(grad, want_grad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_value_loss_without_metrics_does_not_synchronise_on_cuda():
    values = torch.randn(64, device="cuda", requires_grad=True)
    returns, old = torch.randn(64, device="cuda"), torch.randn(64, device="cuda")
    mask = torch.rand(64, device="cuda") < 0.7
    cu = torch.tensor([0, 20, 64], device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
            loss, metrics = value_loss(
                values, returns, mask, old, 0.2, agg=agg, cu_seqlens=cu, with_metrics=False
            )
            loss.backward()
            assert metrics == {}
    finally:
        torch.cuda.set_sync_debug_mode("default")
