"""Policy losses: DIS (band mask on the ratio to rollout log-probs), PPO clip, positive-example NLL."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sao.algos.losses import dis_loss, positive_nll_loss, ppo_clip_loss
from sao.algos.reductions import aggregate

F64 = torch.float64


def _t(xs, dtype=F64):
    return torch.tensor(xs, dtype=dtype)


def _mask(xs):
    return torch.tensor(xs, dtype=torch.bool)


def _grad(loss_fn, logprobs):
    lp = logprobs.detach().clone().requires_grad_(True)
    loss, metrics = loss_fn(lp)
    loss.backward()
    return loss.detach(), lp.grad, metrics


# ---- DIS: gradient identity ------------------------------------------------------------------------------


@st.composite
def dis_cases(draw):
    n = draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**32 - 1))
    gen = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand(n, generator=gen, dtype=F64) * 5
    # Log-ratios spread over both band edges of every ε drawn below (log 0.05 ≈ −3, log 7 ≈ 1.9).
    log_ratio = (torch.rand(n, generator=gen, dtype=F64) - 0.5) * 6
    advantages = torch.randn(n, generator=gen, dtype=F64)
    mask = torch.rand(n, generator=gen) < 0.7
    eps_low = draw(st.floats(0.05, 0.95))
    eps_high = draw(st.floats(0.05, 6.0))
    return logprobs, logprobs - log_ratio, advantages, mask, eps_low, eps_high


@settings(max_examples=80, deadline=None)
@given(case=dis_cases())
def test_dis_gradient_equals_band_indicator_times_ratio_times_advantage(case):
    logprobs, rollout, adv, mask, eps_low, eps_high = case
    n = max(int(mask.sum()), 1)  # token-mean: every action token counts, in band or not

    loss, grad, _ = _grad(lambda lp: dis_loss(lp, rollout, adv, mask, eps_low, eps_high), logprobs)

    # Form 1: −mean(1[band]·r·Â), band tested on the ratio itself as docs/concepts.md (DIS) writes it.
    def indicator_form(lp):
        r = torch.exp(lp - rollout)
        band = mask & (r > 1 - eps_low) & (r < 1 + eps_high)
        return -(torch.where(band, r * adv, torch.zeros((), dtype=F64))).sum() / n, {}

    # Form 2: −mean(sg(f(r))·Â·log π), the stop-gradient form of J(θ).
    def stop_gradient_form(lp):
        r = torch.exp(lp - rollout)
        f = torch.where((r > 1 - eps_low) & (r < 1 + eps_high), r, torch.zeros((), dtype=F64)).detach()
        return -(torch.where(mask, f * adv * lp, torch.zeros((), dtype=F64))).sum() / n, {}

    want_loss, grad_indicator, _ = _grad(indicator_form, logprobs)
    _, grad_stop, _ = _grad(stop_gradient_form, logprobs)
    torch.testing.assert_close(grad, grad_indicator, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad, grad_stop, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(loss, want_loss, rtol=1e-12, atol=1e-14)
    # Directly: ∂loss/∂log π_t = −1[band]·r_t·Â_t / n.
    r = torch.exp(logprobs - rollout)
    band = mask & (r > 1 - eps_low) & (r < 1 + eps_high)
    torch.testing.assert_close(grad, torch.where(band, -r * adv / n, torch.zeros((), dtype=F64)))


def test_dis_gives_no_gradient_to_observation_or_out_of_band_tokens_whatever_the_advantage_sign():
    # Band (0.7, 6.0). Tokens: in band, below (r=.5, Â<0), above (r=7, Â<0), above (r=7, Â>0),
    # observation token (in band but not an action). PPO would keep a gradient on r=.5 with Â>0 and on
    # r=7 with Â<0; DIS drops every out-of-band token.
    logprobs = _t([math.log(1.2), math.log(0.5), math.log(7.0), math.log(7.0), math.log(1.0)])
    adv = _t([2.0, -1.0, -1.0, 1.0, 5.0])
    mask = _mask([1, 1, 1, 1, 0])
    loss, grad, metrics = _grad(
        lambda lp: dis_loss(lp, torch.zeros(5, dtype=F64), adv, mask, 0.3, 5.0), logprobs
    )
    # Only token 0 contributes: −1.2·2 / 4 action tokens.
    torch.testing.assert_close(loss, _t(-1.2 * 2 / 4))
    torch.testing.assert_close(grad, _t([-1.2 * 2 / 4, 0.0, 0.0, 0.0, 0.0]))
    assert bool((grad[1:] == 0).all())
    torch.testing.assert_close(metrics["dis/masked_frac"], torch.tensor(0.75))


def test_dis_band_is_strict_at_both_edges():
    eps_low, eps_high = 0.3, 5.0
    lo, hi = math.log1p(-eps_low), math.log1p(eps_high)
    # Exactly on each edge (masked), a hair inside (kept), and a hair outside (masked).
    logprobs = _t(
        [
            lo,
            math.nextafter(lo, math.inf),
            math.nextafter(lo, -math.inf),
            hi,
            math.nextafter(hi, -math.inf),
            math.nextafter(hi, math.inf),
        ]
    )
    adv = torch.ones(6, dtype=F64)
    loss, grad, metrics = _grad(
        lambda lp: dis_loss(
            lp, torch.zeros(6, dtype=F64), adv, torch.ones(6, dtype=torch.bool), eps_low, eps_high
        ),
        logprobs,
    )
    kept = grad != 0
    assert kept.tolist() == [False, True, False, False, True, False]
    torch.testing.assert_close(metrics["dis/masked_frac_below"], torch.tensor(2 / 6))
    torch.testing.assert_close(metrics["dis/masked_frac_above"], torch.tensor(2 / 6))
    torch.testing.assert_close(loss, -(torch.exp(logprobs[1]) + torch.exp(logprobs[4])) / 6)


def test_dis_metrics_on_a_hand_case():
    # eps 0.3/5.0 → band (0.7, 6). Action log-ratios: log .5 (below), 0, log 7 (above), .1, log .6 (below);
    # the observation token's log-ratio (−50) must not count anywhere.
    lr = [math.log(0.5), 0.0, math.log(7.0), 0.1, math.log(0.6), -50.0]
    mask = _mask([1, 1, 1, 1, 1, 0])
    _, metrics = dis_loss(_t(lr), torch.zeros(6, dtype=F64), torch.ones(6, dtype=F64), mask, 0.3, 5.0)
    torch.testing.assert_close(metrics["dis/masked_frac"], torch.tensor(3 / 5))
    torch.testing.assert_close(metrics["dis/masked_frac_below"], torch.tensor(2 / 5))
    torch.testing.assert_close(metrics["dis/masked_frac_above"], torch.tensor(1 / 5))
    want_abs = (abs(math.log(0.5)) + 0 + math.log(7.0) + 0.1 + abs(math.log(0.6))) / 5
    torch.testing.assert_close(metrics["dis/logprob_abs_diff"], _t(want_abs))
    torch.testing.assert_close(metrics["dis/ratio_mean"], _t((0.5 + 1 + 7 + math.exp(0.1) + 0.6) / 5))
    assert all(not v.requires_grad and v.dim() == 0 for v in metrics.values())


def test_dis_logprob_abs_diff_reports_large_differences_unclamped():
    # DIS logs mean |log π_θ − log π_rollout| (docs/algorithms.md); a 30-nat and a 100-nat gap are real
    # drift to report.
    logprobs = _t([-31.0, -1.0, -101.0])
    rollout = _t([-1.0, -1.0, -1.0])
    _, metrics = dis_loss(
        logprobs, rollout, torch.ones(3, dtype=F64), torch.ones(3, dtype=torch.bool), 0.3, 5.0
    )
    torch.testing.assert_close(metrics["dis/logprob_abs_diff"], _t((30.0 + 0.0 + 100.0) / 3))


def test_dis_on_policy_ratio_is_exactly_one_and_loss_is_minus_mean_advantage():
    gen = torch.Generator().manual_seed(0)
    logprobs = -torch.rand(12, generator=gen, dtype=F64) * 4
    adv = torch.randn(12, generator=gen, dtype=F64)
    mask = torch.rand(12, generator=gen) < 0.6
    loss, grad, metrics = _grad(lambda lp: dis_loss(lp, logprobs.clone(), adv, mask, 0.2, 0.28), logprobs)
    n = int(mask.sum())
    assert float(metrics["dis/ratio_mean"]) == 1.0
    assert float(metrics["dis/masked_frac"]) == 0.0 and float(metrics["dis/logprob_abs_diff"]) == 0.0
    torch.testing.assert_close(loss, -adv[mask].sum() / n, rtol=1e-14, atol=1e-15)
    torch.testing.assert_close(grad, torch.where(mask, -adv / n, torch.zeros((), dtype=F64)), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dis_huge_log_ratios_give_finite_loss_and_zero_grad(dtype):
    logprobs = torch.tensor([100.0, -100.0, 0.2, -1e4, 0.0], dtype=dtype)
    rollout = torch.tensor([0.0, 0.0, 0.0, 0.0, float("-inf")], dtype=dtype)  # last: observation token
    adv = torch.tensor([1.0, -1.0, 3.0, 2.0, 1.0], dtype=dtype)
    mask = _mask([1, 1, 1, 1, 0])
    loss, grad, metrics = _grad(lambda lp: dis_loss(lp, rollout, adv, mask, 0.3, 5.0), logprobs)
    assert bool(loss.isfinite()) and bool(grad.isfinite().all())
    assert all(bool(v.isfinite()) for v in metrics.values())
    assert grad[[0, 1, 3, 4]].tolist() == [0.0, 0.0, 0.0, 0.0]
    torch.testing.assert_close(loss, -math.exp(0.2) * 3 / 4 * torch.ones((), dtype=dtype))


def test_dis_aggregation_modes_on_a_hand_case():
    # Trajectory 0 = tokens 0..3 (token 3 an observation), trajectory 1 = tokens 4..5. On policy except
    # token 2, which is above the band (contributes 0 but stays in the denominators). Per-token loss −Â:
    # [−1, −2, 0, ·, −4, −6].
    cu = torch.tensor([0, 4, 6])
    logprobs = _t([-1.0, -1.0, -1.0 + math.log(10.0), -1.0, -1.0, -1.0])
    rollout = torch.full((6,), -1.0, dtype=F64)
    adv = _t([1.0, 2.0, 3.0, 99.0, 4.0, 6.0])
    mask = _mask([1, 1, 1, 0, 1, 1])

    def run(agg, **kw):
        return dis_loss(logprobs, rollout, adv, mask, 0.3, 5.0, agg, cu, **kw)[0]

    torch.testing.assert_close(run("token-mean"), _t(-13 / 5))  # 5 action tokens, masked one included
    torch.testing.assert_close(run("seq-mean-token-mean"), _t((-3 / 3 + -10 / 2) / 2))
    torch.testing.assert_close(run("seq-mean-token-sum"), _t((-3 + -10) / 2))
    # A micro-batch normalised by the whole batch's count.
    torch.testing.assert_close(run("token-mean", denominator=10.0), _t(-13 / 10))
    torch.testing.assert_close(run("seq-mean-token-sum", denominator=4.0), _t(-13 / 4))


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "seq-mean-token-sum"])
def test_dis_sequence_aggregation_without_cu_seqlens_raises(agg):
    x = torch.zeros(3, dtype=F64)
    with pytest.raises(ValueError, match="cu_seqlens"):
        dis_loss(x, x, x, torch.ones(3, dtype=torch.bool), 0.3, 5.0, agg)


def test_unknown_aggregation_raises():
    x = torch.zeros(3, dtype=F64)
    with pytest.raises(ValueError, match="agg"):
        dis_loss(x, x, x, torch.ones(3, dtype=torch.bool), 0.3, 5.0, "batch-sum", torch.tensor([0, 3]))


@pytest.mark.parametrize(("eps_low", "eps_high"), [(0.0, 1.0), (1.0, 1.0), (-0.1, 1.0), (0.2, 0.0)])
def test_dis_and_ppo_reject_invalid_bands(eps_low, eps_high):
    x = torch.zeros(3, dtype=F64)
    m = torch.ones(3, dtype=torch.bool)
    with pytest.raises(ValueError, match="eps_"):
        dis_loss(x, x, x, m, eps_low, eps_high)
    with pytest.raises(ValueError, match="eps_"):
        ppo_clip_loss(x, x, x, m, eps_low, eps_high)


def test_dis_does_not_mutate_inputs():
    lp, rl, adv = _t([-1.0, -2.0]), _t([-1.5, -2.0]), _t([1.0, -1.0])
    copies = [lp.clone(), rl.clone(), adv.clone()]
    dis_loss(lp, rl, adv, _mask([1, 1]), 0.3, 5.0)
    assert all(torch.equal(a, b) for a, b in zip([lp, rl, adv], copies, strict=True))


def test_aggregate_ignores_non_finite_entries_outside_the_mask():
    per_token = _t([1.0, float("nan"), 3.0, float("inf")])
    mask = _mask([1, 0, 1, 0])
    cu = torch.tensor([0, 2, 4])
    torch.testing.assert_close(aggregate(per_token, mask), _t(2.0))
    torch.testing.assert_close(aggregate(per_token, mask, "seq-mean-token-sum", cu), _t(2.0))


def test_aggregate_leaves_trajectories_without_masked_tokens_out_of_sequence_means():
    per_token = _t([2.0, 4.0, 100.0])
    mask = _mask([1, 1, 0])
    cu = torch.tensor([0, 2, 3])  # trajectory 1 has no masked token
    torch.testing.assert_close(aggregate(per_token, mask, "seq-mean-token-mean", cu), _t(3.0))
    torch.testing.assert_close(aggregate(per_token, mask, "seq-mean-token-sum", cu), _t(6.0))
    # An empty mask gives 0, not NaN.
    torch.testing.assert_close(aggregate(per_token, _mask([0, 0, 0])), _t(0.0))


# ---- PPO clip --------------------------------------------------------------------------------------------

# ε 0.2/0.28 → clip range [0.8, 1.28]. Token by token (r, Â) → −min(r·Â, clip(r)·Â), gradient:
#   (1.5, +1): min(1.5, 1.28) = 1.28 → 1.28 clipped (high), grad 0
#   (1.5, −1): min(−1.5, −1.28) = −1.5 → 1.5 unclipped, grad −r·Â = 1.5
#   (0.5, −1): min(−0.5, −0.8) = −0.8 → 0.8 clipped (low), grad 0
#   (0.5, +1): min(0.5, 0.8) = 0.5 → −0.5 unclipped, grad −0.5
#   (1.0, +2): → −2, grad −2
PPO_RATIOS = [1.5, 1.5, 0.5, 0.5, 1.0]
PPO_ADV = [1.0, -1.0, -1.0, 1.0, 2.0]


def _ppo_hand():
    logprobs = _t([math.log(r) for r in PPO_RATIOS] + [0.0])
    adv = _t([*PPO_ADV, 7.0])
    mask = _mask([1, 1, 1, 1, 1, 0])  # token 5 is an observation
    return _grad(lambda lp: ppo_clip_loss(lp, torch.zeros(6, dtype=F64), adv, mask, 0.2, 0.28), logprobs)


def test_ppo_clip_hand_case_loss_and_gradient():
    loss, grad, _ = _ppo_hand()
    torch.testing.assert_close(loss, _t((-1.28 + 1.5 + 0.8 - 0.5 - 2.0) / 5))
    torch.testing.assert_close(grad, _t([0.0, 1.5, 0.0, -0.5, -2.0, 0.0]) / 5)


def test_ppo_clip_gradient_is_exactly_zero_where_the_clipped_branch_is_active():
    _, grad, _ = _ppo_hand()
    assert grad[0].item() == 0.0 and grad[2].item() == 0.0 and grad[5].item() == 0.0


def test_ppo_clip_fraction_metrics():
    _, _, metrics = _ppo_hand()
    torch.testing.assert_close(metrics["ppo/clip_frac"], torch.tensor(2 / 5))
    torch.testing.assert_close(metrics["ppo/clip_frac_low"], torch.tensor(1 / 5))
    torch.testing.assert_close(metrics["ppo/clip_frac_high"], torch.tensor(1 / 5))
    want_kl = sum(0.5 * math.log(r) ** 2 for r in PPO_RATIOS) / 5
    torch.testing.assert_close(metrics["ppo/approx_kl"], _t(want_kl))
    torch.testing.assert_close(metrics["ppo/ratio_mean"], _t(sum(PPO_RATIOS) / 5))


def test_ppo_and_dis_agree_on_policy_and_differ_outside_the_band():
    gen = torch.Generator().manual_seed(3)
    logprobs = -torch.rand(10, generator=gen, dtype=F64)
    adv = torch.randn(10, generator=gen, dtype=F64)
    mask = torch.rand(10, generator=gen) < 0.7
    ref = logprobs.clone()
    dis = _grad(lambda lp: dis_loss(lp, ref, adv, mask, 0.2, 0.28), logprobs)
    ppo = _grad(lambda lp: ppo_clip_loss(lp, ref, adv, mask, 0.2, 0.28), logprobs)
    torch.testing.assert_close(dis[0], ppo[0], rtol=1e-14, atol=1e-15)
    torch.testing.assert_close(dis[1], ppo[1], rtol=1e-14, atol=1e-15)
    # Off policy, r = 1.5 with Â < 0: PPO keeps the unclipped (pessimistic) term and its gradient, DIS
    # drops the token.
    lp, zero, neg, one = _t([math.log(1.5)]), _t([0.0]), _t([-1.0]), _mask([1])
    dis_off = _grad(lambda x: dis_loss(x, zero, neg, one, 0.2, 0.28), lp)
    ppo_off = _grad(lambda x: ppo_clip_loss(x, zero, neg, one, 0.2, 0.28), lp)
    assert dis_off[0].item() == 0.0 and dis_off[1].item() == 0.0
    torch.testing.assert_close(ppo_off[0], _t(1.5))
    torch.testing.assert_close(ppo_off[1], _t([1.5]))


# ---- positive-example NLL --------------------------------------------------------------------------------


def test_positive_nll_only_positive_trajectories_action_tokens_contribute():
    # Trajectory 0 (positive): [prompt, a, a]; trajectory 1 (not positive): [prompt, a, a].
    logprobs = _t([-9.0, -1.0, -2.0, -9.0, -3.0, -4.0])
    mask = _mask([0, 1, 1, 0, 1, 1])
    positive = _mask([1, 1, 1, 0, 0, 0])
    cu = torch.tensor([0, 3, 6])
    loss, grad, metrics = _grad(lambda lp: positive_nll_loss(lp, mask, positive), logprobs)
    torch.testing.assert_close(loss, _t((1.0 + 2.0) / 2))
    torch.testing.assert_close(grad, _t([0.0, -0.5, -0.5, 0.0, 0.0, 0.0]))
    torch.testing.assert_close(metrics["nll/positive_token_frac"], torch.tensor(0.5))
    # Sequence modes average over positive trajectories only.
    torch.testing.assert_close(
        positive_nll_loss(logprobs, mask, positive, "seq-mean-token-mean", cu)[0], _t(1.5)
    )
    torch.testing.assert_close(
        positive_nll_loss(logprobs, mask, positive, "seq-mean-token-sum", cu)[0], _t(3.0)
    )


def test_positive_nll_without_positive_trajectories_is_zero_with_zero_grad():
    logprobs = _t([-1.0, -2.0, -3.0])
    loss, grad, metrics = _grad(
        lambda lp: positive_nll_loss(lp, _mask([1, 1, 0]), _mask([0, 0, 0])), logprobs
    )
    assert loss.item() == 0.0
    assert torch.equal(grad, torch.zeros(3, dtype=F64))
    assert metrics["nll/positive_token_frac"].item() == 0.0
