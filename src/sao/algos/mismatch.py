"""Training/inference mismatch: how far the engine's recorded log-probs are from the trainer's on the same
tokens, measured where they should agree.

A token sampled at the version whose weights the trainer holds when it computes its log-probs (lag 0) was
produced by the same weights: the two log-probs differ only by the engines' numerics (kernels, dtype, batch
shape). On those tokens, per step:

- ``mean |log π_trainer − log π_engine|`` (nats);
- the k3 estimator of KL(π_engine ‖ π_trainer): with ``r = exp(log π_trainer − log π_engine)`` for a token
  sampled from the engine, ``k3 = (r − 1) − log r`` (≥ 0, 0 iff equal; unbiased for the KL, low variance:
  Schulman, "Approximating KL divergence", 2020), averaged over the tokens.

A mismatch that grows over a run (`drift_ratio`: recent mean over early-run mean) points at an engine whose
weights or numerics drift from the trainer's — e.g. pushes that silently stopped arriving — even while the
rewards look fine.

Pure tensor functions on the packed ``(T,)`` layout; inputs are never modified.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["MismatchStats", "drift_ratio", "k3_kl", "lag0_mask", "lag0_mismatch_metrics", "mismatch_stats"]

_MAX_LOG_RATIO = 20.0  # exp(20) ~ 5e8: a finite ratio for any log-prob difference a real engine produces


@dataclass(frozen=True)
class MismatchStats:
    """Mean |Δ log-prob| and mean k3 over ``tokens`` tokens (both 0.0 when ``tokens`` is 0)."""

    abs_diff: float
    k3: float
    tokens: int


def lag0_mask(versions: Tensor, action_mask: Tensor, policy_version: int) -> Tensor:
    """``(T,)`` bool: action tokens sampled at ``policy_version`` (lag 0). ``versions`` ``(T,)`` long,
    ``action_mask`` ``(T,)`` 0/1 or bool."""
    return action_mask.bool() & (versions.long() == int(policy_version))


def k3_kl(trainer_logprobs: Tensor, engine_logprobs: Tensor) -> Tensor:
    """Per-token k3 ``(r − 1) − log r`` with ``r = exp(trainer − engine)``, float64, same shape as the
    inputs; the log-ratio is clamped to ±20 so the result stays finite."""
    d = (trainer_logprobs.double() - engine_logprobs.double()).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return torch.expm1(d) - d  # (r − 1) − log r, without cancellation for small d


def mismatch_stats(trainer_logprobs: Tensor, engine_logprobs: Tensor, mask: Tensor) -> MismatchStats:
    """`MismatchStats` of the tokens where ``mask`` ``(T,)`` is true; ``trainer_logprobs`` and
    ``engine_logprobs`` ``(T,)`` aligned with it."""
    if not (trainer_logprobs.shape == engine_logprobs.shape == mask.shape):
        raise ValueError(
            f"shapes differ: trainer {tuple(trainer_logprobs.shape)}, engine {tuple(engine_logprobs.shape)}, "
            f"mask {tuple(mask.shape)}"
        )
    keep = mask.bool()
    n = int(keep.sum())
    if n == 0:
        return MismatchStats(0.0, 0.0, 0)
    t, e = trainer_logprobs[keep].double(), engine_logprobs[keep].double()
    return MismatchStats(float((t - e).abs().mean()), float(k3_kl(t, e).mean()), n)


def lag0_mismatch_metrics(
    trainer_logprobs: Tensor,
    engine_logprobs: Tensor,
    versions: Tensor,
    action_mask: Tensor,
    policy_version: int,
) -> dict[str, float]:
    """The step's lag-0 mismatch metrics: ``mismatch/lag0_tokens`` always; ``mismatch/lag0_logprob_abs_diff``
    and ``mismatch/lag0_k3_kl`` when there is at least one lag-0 action token. All inputs ``(T,)``; the
    trainer's log-probs at the sampling temperature (those the DIS ratio uses)."""
    mask = lag0_mask(versions.to(action_mask.device), action_mask, policy_version)
    stats = mismatch_stats(trainer_logprobs.detach().to(mask.device), engine_logprobs.to(mask.device), mask)
    out = {"mismatch/lag0_tokens": float(stats.tokens)}
    if stats.tokens:
        out["mismatch/lag0_logprob_abs_diff"] = stats.abs_diff
        out["mismatch/lag0_k3_kl"] = stats.k3
    return out


def drift_ratio(series: Sequence[float], window: int) -> float | None:
    """Mean of the last ``window`` values over the mean of the first ``window`` (None until the series has
    ``2 * window`` values, so the two windows do not overlap; inf when the early mean is 0 and the recent
    one is not, nan-free: 1.0 when both are 0)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if len(series) < 2 * window:
        return None
    early = sum(series[:window]) / window
    recent = sum(series[-window:]) / window
    if early > 0:
        return recent / early
    return float("inf") if recent > 0 else 1.0
