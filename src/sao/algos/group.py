"""Trajectory-level advantages: GRPO's group baseline and broadcasting to tokens."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

from .packed import seq_ids_from_cu_seqlens

__all__ = ["broadcast_to_tokens", "group_index", "grpo_advantages"]


def group_index(group_ids: Tensor | Sequence[Hashable]) -> Tensor:
    """``(B,)`` long: dense group numbers 0..G−1 for any hashable group labels (or an int tensor)."""
    if isinstance(group_ids, Tensor):
        return torch.unique(group_ids, return_inverse=True)[1]
    numbering: dict[Hashable, int] = {}
    return torch.tensor([numbering.setdefault(g, len(numbering)) for g in group_ids], dtype=torch.long)


def grpo_advantages(
    rewards: Tensor,
    group_ids: Tensor | Sequence[Hashable],
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> Tensor:
    """GRPO advantages ``(R − mean_group) / (std_group + eps)`` (std division optional).

    Args:
        rewards: ``(B,)`` outcome reward per trajectory.
        group_ids: ``(B,)`` group of each trajectory (same prompt, sampled together).
        normalize_std: divide by the group's unbiased standard deviation (Dr.GRPO turns this off).

    Returns:
        ``(B,)`` float advantages; a group with one member, or with equal rewards, gets 0.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be (B,), got shape {tuple(rewards.shape)}")
    groups = group_index(group_ids).to(rewards.device)
    if groups.numel() != rewards.numel():
        raise ValueError(f"group_ids has {groups.numel()} entries for {rewards.numel()} rewards")
    num_groups = int(groups.max()) + 1 if groups.numel() else 0
    r = rewards.detach().to(torch.float64)
    count = torch.zeros(num_groups, dtype=torch.float64, device=r.device).index_add(
        0, groups, torch.ones_like(r)
    )
    mean = torch.zeros_like(count).index_add(0, groups, r) / count
    centred = r - mean[groups]
    adv = centred
    if normalize_std:
        sq = torch.zeros_like(count).index_add(0, groups, centred**2)
        std = torch.sqrt(sq / (count - 1).clamp(min=1))
        adv = centred / (std[groups] + eps)
    return adv.to(rewards.dtype if rewards.is_floating_point() else torch.float32)


def broadcast_to_tokens(per_seq: Tensor, action_mask: Tensor, cu_seqlens: Tensor) -> Tensor:
    """``(T,)``: each trajectory's scalar on its action tokens, 0 elsewhere."""
    values = per_seq[seq_ids_from_cu_seqlens(cu_seqlens)]
    return torch.where(action_mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))
