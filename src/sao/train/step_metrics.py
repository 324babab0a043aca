"""Per-batch statistics the RL trainer logs (docs/training.md) that depend only on the batch, not on the
models.

Reward, response/action token counts, turns, and policy lag: per action token ``policy_version − version``
(mean/max) and per trajectory the span of policy versions its action tokens came from (max − min).
"""

from __future__ import annotations

import torch
from torch import Tensor

from sao.algos import response_mask
from sao.algos.packed import action_span_bounds, segment_count
from sao.types import Batch

__all__ = ["batch_metrics"]


def _turns_per_trajectory(batch: Batch) -> Tensor:
    """``(B,)`` long: action spans per trajectory (`sao.algos.packed.action_span_bounds`), as
    `Trajectory.num_turns` counts them."""
    _, ends = action_span_bounds(batch.action_mask.bool(), batch.turn_ids, batch.seq_ids)
    return segment_count(ends, batch.seq_ids, batch.num_sequences)


def _version_span(batch: Batch) -> Tensor:
    """``(B,)`` max − min policy version over each trajectory's action tokens (0 without action tokens)."""
    action = batch.action_mask.bool()
    B = batch.num_sequences
    v = batch.versions.long()
    big = torch.iinfo(torch.long).max
    hi = torch.full((B,), -1, dtype=torch.long, device=v.device)
    lo = torch.full((B,), big, dtype=torch.long, device=v.device)
    hi = hi.scatter_reduce(0, batch.seq_ids[action], v[action], reduce="amax")
    lo = lo.scatter_reduce(0, batch.seq_ids[action], v[action], reduce="amin")
    return torch.where(hi >= 0, hi - lo, torch.zeros_like(hi))


def batch_metrics(batch: Batch, policy_version: int) -> dict[str, float]:
    """Reward, length, turn and policy-lag metrics of one training batch."""
    action = batch.action_mask.bool()
    B = batch.num_sequences
    action_tokens = segment_count(action, batch.seq_ids, B).float()
    response_tokens = segment_count(response_mask(action, batch.cu_seqlens), batch.seq_ids, B).float()
    lag = (policy_version - batch.versions.long())[action].float()
    span = _version_span(batch).float()
    rewards = batch.outcome_rewards.float()
    return {
        "batch/trajectories": float(B),
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std(unbiased=False)),
        "batch/response_tokens_mean": float(response_tokens.mean()),
        "batch/action_tokens_mean": float(action_tokens.mean()),
        "batch/action_tokens": float(action_tokens.sum()),
        "batch/tokens": float(batch.num_tokens),
        "batch/turns_mean": float(_turns_per_trajectory(batch).float().mean()),
        "lag/token_mean": float(lag.mean()) if lag.numel() else 0.0,
        "lag/token_max": float(lag.max()) if lag.numel() else 0.0,
        # the realised lag distribution over the batch's action tokens (versions behind the trainer)
        "lag/token_p50": float(lag.quantile(0.5)) if lag.numel() else 0.0,
        "lag/token_p90": float(lag.quantile(0.9)) if lag.numel() else 0.0,
        "lag/version_span_mean": float(span.mean()),
        "lag/version_span_max": float(span.max()),
    }
