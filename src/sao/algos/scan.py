"""Discounted cumulative sums (the GAE recursion) without a Python loop over time.

``y_t = x_t + d · y_{t-1}`` along the last axis, one decay ``d`` per row. GAE runs this backwards in time:
``gae.py`` lays its rows out time-reversed (at no cost, while compacting) and calls :func:`discounted_cumsum`.

It is solved as a blocked scan: inside a block of C steps ``y_t = d^t Σ_{k≤t} d^{-k} x_k`` (one cumsum,
exact in float64 because C is small enough that ``d^{-(C-1)}`` cannot overflow), and the values at block
ends obey the same recursion with decay ``d^C``, solved recursively. O(L) tensor work, O(log_C L) Python
steps.
Float32 inputs are solved in float32 on the token level when ``max|x| · d^{-(C-1)}`` stays inside
float32's range for every non-zero decay (always so for d >= 0.01 and |x| < 1e8); otherwise, and for
the short block-level recursions, in float64.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["BLOCK", "discounted_cumsum"]

BLOCK = 16
# A decay below this adds less than float64 resolution per step; treating it as 0 bounds d^-(C-1) by
# 1e180, far from overflow.
_TINY_DECAY = 1e-12
_FLOAT32_MAX_SCALED = 1e36  # float32 max is 3.4e38; keep a margin for the cumsum


def discounted_cumsum(x: Tensor, decay: Tensor | float) -> Tensor:
    """Solve ``y_t = x_t + decay · y_{t-1}`` (``y_{-1} = 0``) forwards along the last axis.

    Args:
        x: ``(B, L)`` float.
        decay: ``(B,)`` per-row decay in [0, 1], or one float for all rows.

    Returns:
        ``(B, L)`` in the dtype of ``x``.
    """
    if x.dim() != 2:
        raise ValueError(f"x must be (B, L), got shape {tuple(x.shape)}")
    d = torch.as_tensor(decay, dtype=torch.float64, device=x.device).expand(x.shape[0])
    if bool(((d < 0) | (d > 1) | d.isnan()).any()):
        raise ValueError("decay must lie in [0, 1]")
    d = torch.where(d < _TINY_DECAY, torch.zeros_like(d), d)
    work = x if x.dtype == torch.float32 and _float32_safe(x, d) else x.to(torch.float64)
    return _scan(work, d).to(x.dtype)


def _float32_safe(x: Tensor, d: Tensor) -> bool:
    """True when x / d^t (t < BLOCK) cannot overflow float32 for any row."""
    positive = d[d > 0]
    if positive.numel() == 0 or x.numel() == 0:
        return True
    largest_scale = float(positive.min()) ** -(BLOCK - 1)
    return float(x.abs().max()) * largest_scale < _FLOAT32_MAX_SCALED


def _scan_block(x: Tensor, d: Tensor) -> Tensor:
    """Exact solve inside blocks: ``x`` (R, n, C), ``d`` (R,) float64, entries 0 or >= _TINY_DECAY."""
    steps = torch.arange(x.shape[-1], dtype=torch.float64, device=x.device)
    has_zero = bool((d == 0).any())
    safe_d = torch.where(d == 0, torch.ones_like(d), d) if has_zero else d
    up = safe_d[:, None].pow(steps).to(x.dtype)  # (R, C): d^t
    down = (1.0 / safe_d[:, None].pow(steps)).to(x.dtype)
    solved = (x * down[:, None, :]).cumsum(-1)
    solved.mul_(up[:, None, :])
    if has_zero:  # the recursion is y = x where d = 0
        solved = torch.where((d == 0)[:, None, None], x, solved)
    return solved


def _scan(x: Tensor, d: Tensor) -> Tensor:
    rows, length = x.shape
    blocks = -(-length // BLOCK)
    if blocks * BLOCK != length:
        x = torch.nn.functional.pad(x, (0, blocks * BLOCK - length))
    local = _scan_block(x.view(rows, blocks, BLOCK), d)  # zero carry-in from the previous block
    if blocks > 1:
        # y at each block end obeys the same recursion across blocks with decay d^C.
        d_block = d.pow(BLOCK)
        d_block = torch.where(d_block < _TINY_DECAY, torch.zeros_like(d_block), d_block)
        ends = _scan(local[:, :, -1].to(torch.float64), d_block)
        carry = torch.nn.functional.pad(ends[:, :-1], (1, 0)).to(x.dtype)  # y at the previous block's end
        steps = torch.arange(1, BLOCK + 1, dtype=torch.float64, device=x.device)
        decay_from_carry = d[:, None].pow(steps).to(x.dtype)  # (R, C): d^(t+1)
        local.addcmul_(decay_from_carry[:, None, :], carry[:, :, None])
    return local.view(rows, blocks * BLOCK)[:, :length]
