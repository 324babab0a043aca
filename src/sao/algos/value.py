"""Critic objective and diagnostics: masked value loss and explained variance (docs/concepts.md,
"The critic: K updates per actor update")."""

from __future__ import annotations

import torch
from torch import Tensor

from .reductions import LossAgg, aggregate, masked_mean, masked_var

__all__ = ["explained_variance", "value_loss"]


def value_loss(
    values: Tensor,
    returns: Tensor,
    mask: Tensor,
    old_values: Tensor | None = None,
    clip_eps: float | None = None,
    agg: LossAgg = "token-mean",
    cu_seqlens: Tensor | None = None,
    *,
    denominator: float | None = None,
    with_metrics: bool = True,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Masked MSE ``(V − R)²`` over the value-trained tokens (action tokens), optionally PPO-clipped.

    Our reading (docs/concepts.md, "The critic: K updates per actor update") is the unclipped MSE
    (``clip_eps=None``); with ``clip_eps`` the loss is
    ``max((V − R)², (clip(V, V_old − ε, V_old + ε) − R)²)`` as in PPO implementations (the same as
    ``V_old + clip(V − V_old, ±ε)``, but a value inside the band stays bit-identical to ``V``).

    Args:
        values: ``(T,)`` critic outputs (with grad). returns: ``(T,)`` targets (constants).
        mask: ``(T,)`` tokens the critic is trained on. old_values: ``(T,)`` needed with ``clip_eps``.
        with_metrics: False skips the metrics (and their host sync): returns ``(loss, {})``.

    Returns:
        ``(loss, metrics)``: ``critic/value_loss``, ``critic/value_mean``, ``critic/return_mean``,
        ``critic/explained_variance`` and, when clipping, ``critic/clip_frac`` (the fraction of masked
        tokens where the clipped term is the larger one, i.e. where clipping changes the loss; a token
        with ``|V − V_old| <= ε`` never counts).
    """
    mask = mask.bool()
    target = returns.detach()
    per_token = (values - target) ** 2
    metrics: dict[str, Tensor] = {}
    if clip_eps is not None:
        if old_values is None:
            raise ValueError("value clipping needs old_values")
        old = old_values.detach()
        clipped = torch.clamp(values, min=old - clip_eps, max=old + clip_eps)
        clipped_loss = (clipped - target) ** 2
        if with_metrics:
            metrics["critic/clip_frac"] = masked_mean((clipped_loss > per_token).float().detach(), mask)
        per_token = torch.maximum(per_token, clipped_loss)
    loss = aggregate(per_token, mask, agg, cu_seqlens, denominator)
    if not with_metrics:
        return loss, metrics
    with torch.no_grad():
        metrics["critic/value_loss"] = loss.detach()
        metrics["critic/value_mean"] = masked_mean(values.detach(), mask)
        metrics["critic/return_mean"] = masked_mean(target, mask)
        metrics["critic/explained_variance"] = torch.tensor(explained_variance(values.detach(), target, mask))
    return loss, metrics


# Returns whose std is at most this fraction of the largest |R| or |V| count as constant: float32 rounding
# of returns equal in exact arithmetic is ~1e-7 relative, so 1e-6 leaves it out and any real spread in.
_FLAT_RETURNS = 1e-6


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """``1 − Var(R − V) / Var(R)`` over the masked tokens (docs/concepts.md, "The critic: K updates
    per actor update").

    1 is a perfect critic, 0 one that predicts the mean, negative worse than the mean. Returns NaN when
    the mask is empty or the returns have no variance beyond rounding (the ratio is undefined): their std
    at most ``_FLAT_RETURNS`` × the largest ``|R|`` or ``|V|`` over the mask. Returns that are all equal
    in exact arithmetic can carry float32 rounding: a step-wise estimator's returns on a batch where every
    episode fails are ~1e-19, not 0, which without the tolerance gave EV ≈ −1e33.
    """
    mask = mask.bool()
    if not bool(mask.any()):
        return float("nan")
    values = values.detach().to(torch.float64)
    returns = returns.detach().to(torch.float64)
    var_returns = masked_var(returns, mask)
    scale = max(float(returns[mask].abs().max()), float(values[mask].abs().max()))
    if float(var_returns) <= (_FLAT_RETURNS * scale) ** 2:
        return float("nan")
    return float(1.0 - masked_var(returns - values, mask) / var_returns)
