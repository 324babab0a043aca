"""Policy losses. Each is a pure function of packed ``(T,)`` tensors returning ``(loss, metrics)``.

* :func:`dis_loss` — SAO's direct double-sided importance sampling (docs/concepts.md,
  "DIS: direct double-sided importance sampling"): the ratio is taken to the log-prob the engine
  recorded while sampling, tokens outside the strict band (1−ε_low, 1+ε_high) are dropped whatever the
  sign of the advantage, and there is no π_old and no PPO min/clip on top.
* :func:`ppo_clip_loss` — PPO's clipped surrogate against π_old with asymmetric (clip-higher) bounds.
* :func:`positive_nll_loss` — VAPO's negative log-likelihood on positive (rewarded) trajectories.

Per-token states (what the loss did with each token; the trajectory inspector shows them):
:func:`dis_band_state` (−1 below the band, 0 inside, +1 above) and :func:`ppo_clip_state` (−1 clipped low,
0 unclipped, +1 clipped high). The losses use them, so a state is exactly the mask the loss applied.

The config classes `sao.algos.loss_types.DIS` and `PPOClip` (``algo.loss.type`` ``dis`` / ``ppo_clip``) call
them.

Losses are to be minimised. Metrics are detached 0-d tensors (no host sync inside the loss).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .reductions import LossAgg, aggregate, masked_mean

__all__ = [
    "dis_band_state",
    "dis_loss",
    "positive_nll_loss",
    "ppo_clip_loss",
    "ppo_clip_state",
]

# exp() of a log-ratio beyond this overflows float32; such tokens are far outside any band anyway.
_MAX_LOG_RATIO = 20.0


def _check_band(eps_low: float, eps_high: float) -> None:
    if not 0.0 < eps_low < 1.0:
        raise ValueError(f"eps_low must lie in (0, 1), got {eps_low}")
    if not eps_high > 0.0:
        raise ValueError(f"eps_high must be > 0, got {eps_high}")


def dis_band_state(logprobs: Tensor, rollout_logprobs: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """``(T,)`` int8: −1 where ``r = exp(log π_θ − log π_rollout) <= 1−ε_low``, +1 where ``r >= 1+ε_high``,
    0 strictly inside the band (the tokens DIS keeps). Computed on log-ratios; no mask applied."""
    _check_band(eps_low, eps_high)
    lr = (logprobs - rollout_logprobs).detach().clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    below = lr <= math.log1p(-eps_low)
    above = lr >= math.log1p(eps_high)
    return above.to(torch.int8) - below.to(torch.int8)


def ppo_clip_state(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, eps_low: float, eps_high: float
) -> Tensor:
    """``(T,)`` int8: −1 where the clipped branch of PPO's min is active below (``r < 1−ε_low`` and
    ``Â < 0``), +1 above (``r > 1+ε_high`` and ``Â > 0``), else 0 (the token's gradient flows)."""
    _check_band(eps_low, eps_high)
    r = torch.exp((logprobs - old_logprobs).detach().clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    adv = advantages.detach()
    low = (r < 1.0 - eps_low) & (adv < 0)
    high = (r > 1.0 + eps_high) & (adv > 0)
    return high.to(torch.int8) - low.to(torch.int8)


def dis_loss(
    logprobs: Tensor,
    rollout_logprobs: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    eps_low: float,
    eps_high: float,
    agg: LossAgg = "token-mean",
    cu_seqlens: Tensor | None = None,
    *,
    denominator: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DIS policy loss ``−Ê_t[ sg(f(r_t)) · Â_t · log π_θ(a_t|s_t) ]``.

    The formulas are in docs/concepts.md, "DIS: direct double-sided importance sampling".

    ``r_t = exp(log π_θ − log π_rollout)``; ``f(r) = r`` if ``1−ε_low < r < 1+ε_high`` (strict) else 0. It is
    computed as ``−1[band]·r·Â``, which has the same gradient. Out-of-band tokens contribute zero but stay
    in the aggregation denominator.

    Args:
        logprobs: ``(T,)`` log π_θ of the taken tokens (with grad).
        rollout_logprobs: ``(T,)`` log-probs the engine recorded when sampling.
        advantages: ``(T,)`` Â (treated as constants).
        action_mask: ``(T,)`` 1 on action tokens.
        eps_low, eps_high: band (1−ε_low, 1+ε_high); math TIR 0.3/5.0, coding 0.8/3.0.
        agg, cu_seqlens, denominator: see :func:`sao.algos.reductions`.

    Returns:
        ``(loss, metrics)`` with ``dis/masked_frac`` (+ ``_below``/``_above``), ``dis/logprob_abs_diff``
        (mean |log π_θ − log π_rollout|) and ``dis/ratio_mean`` over action tokens.
    """
    _check_band(eps_low, eps_high)
    mask = action_mask.bool()
    raw_log_ratio = logprobs - rollout_logprobs
    log_ratio = raw_log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    state = dis_band_state(logprobs, rollout_logprobs, eps_low, eps_high)
    below, above = state < 0, state > 0
    keep = mask & (state == 0)
    ratio = torch.exp(log_ratio)
    per_token = torch.where(keep, -ratio * advantages.detach(), torch.zeros((), dtype=ratio.dtype))
    loss = aggregate(per_token, mask, agg, cu_seqlens, denominator)
    with torch.no_grad():
        metrics = {
            "dis/masked_frac": masked_mean((below | above).float(), mask),
            "dis/masked_frac_below": masked_mean(below.float(), mask),
            "dis/masked_frac_above": masked_mean(above.float(), mask),
            "dis/logprob_abs_diff": masked_mean(raw_log_ratio.detach().abs(), mask),
            "dis/ratio_mean": masked_mean(ratio.detach(), mask),
        }
    return loss, metrics


def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    eps_low: float,
    eps_high: float,
    agg: LossAgg = "token-mean",
    cu_seqlens: Tensor | None = None,
    *,
    denominator: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate ``−min(r·Â, clip(r, 1−ε_low, 1+ε_high)·Â)`` with ``r = π_θ/π_old``.

    Asymmetric bounds give DAPO's clip-higher (GRPO baseline: 0.2/0.28). Shapes as :func:`dis_loss`.

    Returns:
        ``(loss, metrics)`` with ``ppo/clip_frac`` (tokens whose clipped branch is active),
        ``ppo/clip_frac_low``/``_high``, ``ppo/approx_kl`` (mean ½(log r)²) and ``ppo/ratio_mean``.
    """
    _check_band(eps_low, eps_high)
    mask = action_mask.bool()
    log_ratio = (logprobs - old_logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    adv = advantages.detach()
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    loss = aggregate(per_token, mask, agg, cu_seqlens, denominator)
    with torch.no_grad():
        r = ratio.detach()
        state = ppo_clip_state(logprobs, old_logprobs, advantages, eps_low, eps_high)
        low, high = state < 0, state > 0
        metrics = {
            "ppo/clip_frac": masked_mean((low | high).float(), mask),
            "ppo/clip_frac_low": masked_mean(low.float(), mask),
            "ppo/clip_frac_high": masked_mean(high.float(), mask),
            "ppo/approx_kl": masked_mean(0.5 * log_ratio.detach() ** 2, mask),
            "ppo/ratio_mean": masked_mean(r, mask),
        }
    return loss, metrics


def positive_nll_loss(
    logprobs: Tensor,
    action_mask: Tensor,
    positive: Tensor,
    agg: LossAgg = "token-mean",
    cu_seqlens: Tensor | None = None,
    *,
    denominator: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """VAPO's positive-example LM loss: ``−log π_θ`` over the action tokens of positive trajectories.

    Args:
        logprobs: ``(T,)`` log π_θ (with grad).
        action_mask: ``(T,)``.
        positive: ``(T,)`` bool, True on tokens of trajectories counted as positive (e.g. reward > 0);
            broadcast a ``(B,)`` flag with ``positive[seq_ids]``.

    Returns:
        ``(loss, metrics)``; the loss is the aggregate over positive action tokens (0 when there are none)
        and ``nll/positive_token_frac`` the share of action tokens that are positive.
    """
    mask = action_mask.bool()
    pos = mask & positive.bool()
    loss = aggregate(-logprobs, pos, agg, cu_seqlens, denominator)
    with torch.no_grad():
        metrics = {"nll/positive_token_frac": masked_mean(positive.bool().float(), mask)}
    return loss, metrics
