"""Masked reductions on the packed layout: loss aggregation modes and masked moments."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from .packed import segment_count, segment_sum, seq_ids_from_cu_seqlens

__all__ = ["AGG_MODES", "LossAgg", "aggregate", "masked_mean", "masked_var"]

LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def aggregate(
    per_token: Tensor,
    mask: Tensor,
    agg: LossAgg = "token-mean",
    cu_seqlens: Tensor | None = None,
    denominator: float | None = None,
) -> Tensor:
    """Reduce a ``(T,)`` per-token loss over the masked tokens.

    * ``token-mean``: Σ loss / Σ mask over the whole batch (our reading of DIS's Ê_t, docs/concepts.md,
      "DIS: direct double-sided importance sampling": tokens the loss zeroes, e.g. DIS out-of-band
      tokens, stay in the denominator because they are in ``mask``).
    * ``seq-mean-token-mean``: mean over trajectories of each trajectory's token mean.
    * ``seq-mean-token-sum``: mean over trajectories of each trajectory's token sum.

    Trajectories with no masked token are left out of the sequence means. ``denominator`` overrides the
    count (tokens or trajectories), so micro-batches can be normalised by the whole batch's count.
    Entries outside ``mask`` may be non-finite; they are never read. No host sync (the count stays a tensor).
    """
    mask = mask.bool()
    values = torch.where(mask, per_token, torch.zeros((), dtype=per_token.dtype, device=per_token.device))
    if agg == "token-mean":
        if denominator is None:  # a tensor count: no host sync
            return values.sum() / mask.sum().clamp(min=1)
        return values.sum() / max(denominator, 1.0)
    if agg not in AGG_MODES:
        raise ValueError(f"agg must be one of {AGG_MODES}, got {agg!r}")
    if cu_seqlens is None:
        raise ValueError(f"agg={agg!r} needs cu_seqlens")
    seq_ids = seq_ids_from_cu_seqlens(cu_seqlens, per_token.shape[0])
    num_seqs = cu_seqlens.numel() - 1
    sums = segment_sum(values, seq_ids, num_seqs)
    counts = segment_count(mask, seq_ids, num_seqs)
    per_seq = sums / counts.clamp(min=1) if agg == "seq-mean-token-mean" else sums
    if denominator is None:
        return per_seq.sum() / (counts > 0).sum().clamp(min=1)
    return per_seq.sum() / max(denominator, 1.0)


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over ``mask`` (any shape, same shape); 0 when the mask is empty."""
    mask = mask.bool()
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum() / mask.sum().clamp(
        min=1
    )


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = False) -> Tensor:
    """Variance of ``x`` over ``mask``; 0 with fewer than two (unbiased) or one element."""
    mask = mask.bool()
    n = mask.sum()
    centred = torch.where(mask, x - masked_mean(x, mask), torch.zeros((), dtype=x.dtype, device=x.device))
    denom = (n - 1) if unbiased else n
    return (centred**2).sum() / denom.clamp(min=1)
