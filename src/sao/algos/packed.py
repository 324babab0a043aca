"""Helpers for the packed layout: many trajectories concatenated into one 1-D token axis.

A packed batch of B trajectories with T tokens in all is described by ``cu_seqlens`` (``(B+1,)``, int,
starting at 0 and ending at T, as in flash-attention's varlen API). Every per-token tensor is ``(T,)``.
These helpers turn segment structure into index tensors so the algorithms never loop over tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "check_packed",
    "compact_indices",
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


def compact_indices(mask: Tensor, seq_ids: Tensor, num_seqs: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Map the selected tokens of a packed batch to a right-padded ``(B, L)`` layout.

    Args:
        mask: ``(T,)`` bool, the tokens to keep (e.g. action tokens).
        seq_ids: ``(T,)`` long, trajectory index per token.
        num_seqs: B.

    Returns:
        ``token_idx`` ``(N,)`` positions of the kept tokens in the packed axis, ``row`` ``(N,)`` and
        ``col`` ``(N,)`` their place in the padded layout (col = rank among the kept tokens of the same
        trajectory), and ``counts`` ``(B,)`` kept tokens per trajectory. ``L = counts.max()``.
    """
    token_idx = mask.nonzero().squeeze(1)
    row = seq_ids[token_idx]
    counts = segment_count(mask, seq_ids, num_seqs)
    starts = torch.cumsum(counts, 0) - counts
    col = torch.arange(token_idx.numel(), device=mask.device) - starts[row]
    return token_idx, row, col, counts
