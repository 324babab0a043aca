"""Helpers for the packed layout: many trajectories concatenated into one 1-D token axis.

A packed batch of B trajectories with T tokens in all is described by ``cu_seqlens`` (``(B+1,)``, int,
starting at 0 and ending at T, as in flash-attention's varlen API). Every per-token tensor is ``(T,)``.
These helpers turn segment structure into index tensors so the algorithms never loop over tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "action_span_bounds",
    "check_packed",
    "segment_count",
    "segment_sum",
    "seq_ids_from_cu_seqlens",
]


def check_packed(cu_seqlens: Tensor, *tensors: Tensor, names: tuple[str, ...] = ()) -> int:
    """Validate packed inputs and return T.

    ``cu_seqlens`` must be 1-D, start at 0, be non-decreasing; every tensor must be ``(T,)`` with
    ``T == cu_seqlens[-1]``. Raises ``ValueError`` naming the offending argument.
    """
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise ValueError(f"cu_seqlens must be 1-D with B+1 >= 1 entries, got shape {tuple(cu_seqlens.shape)}")
    if int(cu_seqlens[0]) != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {int(cu_seqlens[0])}")
    if cu_seqlens.numel() > 1 and bool((cu_seqlens[1:] < cu_seqlens[:-1]).any()):
        raise ValueError("cu_seqlens must be non-decreasing")
    total = int(cu_seqlens[-1])
    for i, t in enumerate(tensors):
        name = names[i] if i < len(names) else f"tensor {i}"
        if t.dim() != 1 or t.numel() != total:
            raise ValueError(f"{name} must have shape ({total},) to match cu_seqlens, got {tuple(t.shape)}")
    return total


def seq_ids_from_cu_seqlens(cu_seqlens: Tensor, total: int | None = None) -> Tensor:
    """``(T,)`` long: index of the trajectory each packed token belongs to. Pass ``total`` (T) when known:
    on CUDA it saves the host sync that sizing the output needs."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    ids = torch.arange(lengths.numel(), device=cu_seqlens.device)
    return torch.repeat_interleave(ids, lengths, output_size=total)


def segment_sum(values: Tensor, seq_ids: Tensor, num_seqs: int) -> Tensor:
    """``(B,)`` per-trajectory sums of a ``(T,)`` tensor (differentiable)."""
    out = torch.zeros(num_seqs, dtype=values.dtype, device=values.device)
    return out.index_add(0, seq_ids, values)


def segment_count(mask: Tensor, seq_ids: Tensor, num_seqs: int) -> Tensor:
    """``(B,)`` long: number of True entries of a ``(T,)`` bool mask per trajectory."""
    out = torch.zeros(num_seqs, dtype=torch.long, device=mask.device)
    return out.index_add(0, seq_ids, mask.long())


def action_span_bounds(
    action: Tensor, turn_ids: Tensor | None = None, seq_ids: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """``(starts, ends)``, each ``(T,)`` bool: the first and the last token of every action span, a maximal
    run of action tokens (``action`` ``(T,)`` bool) within one turn (``turn_ids`` ``(T,)``; None: turns are
    not told apart) and one trajectory (``seq_ids`` ``(T,)`` when several are packed; None: one). The one
    definition of a span: trajectory validation, reward placement, turn counts, step-wise GAE."""
    joined = action[1:] & action[:-1]  # (T - 1,): token t + 1 continues the span of token t
    if turn_ids is not None:
        joined &= turn_ids[1:] == turn_ids[:-1]
    if seq_ids is not None:
        joined &= seq_ids[1:] == seq_ids[:-1]
    starts, ends = action.clone(), action.clone()
    starts[1:] &= ~joined
    ends[:-1] &= ~joined
    return starts, ends
