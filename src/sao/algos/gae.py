"""Generalised advantage estimation on the packed layout: token-level, skip-observation and step-wise.

All functions take packed ``(T,)`` tensors with ``cu_seqlens`` ``(B+1,)`` and never loop over tokens.
The per-token reward vector carries the outcome on the last action token of each trajectory (and per-turn
rewards on each turn's last action token); rewards must be zero elsewhere.

* ``skip_observation_gae`` (docs/concepts.md, "Skip-observation GAE"): GAE over the action tokens
  only; an observation span is jumped over, so the last action token of turn i bootstraps from the first
  action token of turn i+1.
* ``token_gae``: the naive multi-turn baseline, GAE over every response position (first action token to
  the end), so values of observation tokens sit inside the recursion.
* ``step_gae`` (docs/algorithms.md, "Advantage estimators"; the paper's appendix A.1): one advantage
  per turn from step values (mean of the turn's token values, or the value at its last token).

Advantages and returns are 0 on non-action tokens (observation tokens never carry a training signal).

Truncation: every function takes ``bootstrap`` ``(B,)`` bool (None: no trajectory). A bootstrapped
trajectory (one cut by the token or turn budget, with ``algo.truncation="bootstrap"``) is not terminal: the
next value after its last chain element is the critic's value *at* that element instead of 0, so
``δ_last = r_last + γV_last − V_last``. The chain's last element is the last action token
(``skip_observation_gae``), the last step's value (``step_gae``), or the trajectory's last token
(``token_gae``; that is the last action token for trajectories cut after their last action token, as the
agent loop builds them). The GAE kernels take this as a per-trajectory "tail" value (0 = terminal).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from .kernels import STRAY_REWARD_MSG, chain_gae_cpu, numba_available
from .packed import action_span_bounds, check_packed, segment_count, segment_sum, seq_ids_from_cu_seqlens
from .scan import BLOCK as _SCAN_ALIGN
from .scan import discounted_cumsum

__all__ = [
    "length_adaptive_lambda",
    "skip_observation_gae",
    "step_gae",
    "token_gae",
]


def length_adaptive_lambda(lengths: Tensor, alpha: float) -> Tensor:
    """VAPO's length-adaptive λ: ``λ = 1 − 1/(α·l)`` clamped to [0, 1].

    Args:
        lengths: ``(B,)`` length of each trajectory (action tokens by default, or steps for step-wise GAE).
        alpha: α > 0 (SAO uses 1.5).

    Returns:
        ``(B,)`` float32 λ per trajectory; a zero length gives λ = 0.
    """
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    lengths = lengths.to(torch.float64)
    lam = 1.0 - 1.0 / (alpha * lengths.clamp(min=1e-12))
    return lam.clamp(0.0, 1.0).to(torch.float32)


def _lambda_per_seq(lam: float | Tensor, num_seqs: int, device: torch.device) -> Tensor:
    lam_t = torch.as_tensor(lam, dtype=torch.float64, device=device)
    if lam_t.dim() == 0:
        lam_t = lam_t.expand(num_seqs)
    if lam_t.shape != (num_seqs,):
        raise ValueError(f"lam must be a float or a ({num_seqs},) tensor, got shape {tuple(lam_t.shape)}")
    if bool(((lam_t < 0) | (lam_t > 1) | lam_t.isnan()).any()):
        raise ValueError("lam must lie in [0, 1]")
    return lam_t


def _check_bootstrap(bootstrap: Tensor | None, num_seqs: int, device: torch.device) -> Tensor | None:
    if bootstrap is None:
        return None
    if bootstrap.shape != (num_seqs,):
        raise ValueError(f"bootstrap must be a ({num_seqs},) bool tensor, got shape {tuple(bootstrap.shape)}")
    return bootstrap.to(device=device, dtype=torch.bool)


def _chain_tail(values: Tensor, chain: Tensor, cu_seqlens: Tensor, bootstrap: Tensor) -> Tensor:
    """``(B,)`` the value at each bootstrapped trajectory's last chain token, 0 elsewhere (no host sync)."""
    num_seqs = cu_seqlens.numel() - 1
    seq_ids = seq_ids_from_cu_seqlens(cu_seqlens)
    positions = torch.arange(chain.numel(), device=chain.device)
    last = torch.full((num_seqs,), -1, dtype=torch.long, device=chain.device)
    last = last.scatter_reduce(0, seq_ids, torch.where(chain, positions, -1), reduce="amax")
    picked = values.detach()[last.clamp(min=0)] if values.numel() else values.new_zeros(num_seqs)
    return torch.where(
        bootstrap & (last >= 0), picked, torch.zeros((), dtype=values.dtype, device=values.device)
    )


def _chain_gae(
    rewards: Tensor,
    values: Tensor,
    chain: Tensor,
    keep: Tensor,
    cu_seqlens: Tensor,
    gamma: float,
    lam: Tensor,
    bootstrap: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """GAE along the ``chain`` tokens of each trajectory, jumping over every other token.

    Dispatch: the compiled kernel for CPU tensors (``kernels.py``), else the tensor scan below.

    Args:
        rewards, values: ``(T,)``; chain, keep: ``(T,)`` bool, keep ⊆ chain (the tokens whose outputs
        are kept); cu_seqlens: ``(B+1,)``; lam: ``(B,)`` float64; bootstrap: ``(B,)`` bool or None, the
        trajectories whose last chain token bootstraps from its own value (see the module docstring).

    Returns:
        ``(advantages, returns)`` ``(T,)`` in the dtype of ``values``, 0 off ``keep``; returns = Â + V.
    """
    tail = None if bootstrap is None else _chain_tail(values, chain, cu_seqlens, bootstrap)
    if values.device.type == "cpu" and numba_available():
        return chain_gae_cpu(rewards, values, chain, keep, cu_seqlens, gamma, lam, tail)
    if bool(((rewards != 0) & ~keep).any()):
        raise ValueError(STRAY_REWARD_MSG)
    adv = _chain_gae_scan(rewards, values, chain, cu_seqlens, gamma, lam, tail)
    zero = torch.zeros((), dtype=adv.dtype, device=adv.device)
    if keep is not chain:
        adv = torch.where(keep, adv, zero)
    return adv, torch.where(keep, adv + values.detach(), zero)


def _chain_gae_scan(
    rewards: Tensor,
    values: Tensor,
    chain: Tensor,
    cu_seqlens: Tensor,
    gamma: float,
    lam: Tensor,
    tail: Tensor | None = None,
) -> Tensor:
    """Tensor-op GAE along the chain (any device).

    The chain tokens are scattered into a time-reversed, right-padded ``(B, W)`` layout (column 0 holds
    the last chain token) where GAE is a forward discounted cumsum of the TD errors. Every packed token
    gets a destination (tokens off the chain go to a trash slot), so no ``nonzero`` compaction is needed.

    Args:
        rewards, values: ``(T,)``; chain: ``(T,)`` bool; cu_seqlens: ``(B+1,)``; lam: ``(B,)`` float64;
        tail: ``(B,)`` the value after each trajectory's last chain token (None: 0).

    Returns:
        ``(T,)`` advantages in the dtype of ``values``, 0 off the chain.
    """
    num_seqs = cu_seqlens.numel() - 1
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    rank = torch.cumsum(chain, 0)  # 1-based rank of each chain token in the whole batch
    ends = torch.cat([rank.new_zeros(1), rank])[cu_seqlens.long()]  # chain tokens before each boundary
    counts = ends[1:] - ends[:-1]
    width = -(-(int(counts.max()) if num_seqs else 0) // _SCAN_ALIGN) * _SCAN_ALIGN
    stride = width + 1  # one always-zero column, so V(s_{t+1}) past the last chain token reads 0
    trash = num_seqs * stride
    # Reversed column of a chain token: counts_b − (rank − ends_b); its flat slot is b·stride + that.
    base = torch.arange(num_seqs, device=chain.device) * stride + counts + ends[:-1]
    dest = torch.where(chain, torch.repeat_interleave(base, lengths) - rank, trash)
    dtype = values.dtype
    r = torch.zeros(trash + 2, dtype=dtype, device=values.device)
    v = torch.zeros_like(r)
    r[dest] = rewards.to(dtype)
    v[dest + 1] = values.detach()
    r2, v2 = r[:trash].view(num_seqs, stride), v[:trash].view(num_seqs, stride)
    if tail is not None:  # column 0 is V(s_{t+1}) after the last chain token: 0 unless bootstrapped
        v2[:, 0] = tail.to(dtype)
    # Reversed: v2[:, j+1] is V(s_t) and v2[:, j] is V(s_{t+1}).
    delta = torch.sub(r2[:, :width], v2[:, 1:]).add_(v2[:, :width], alpha=gamma)
    out = torch.zeros_like(r)
    out[:trash].view(num_seqs, stride)[:, :width] = discounted_cumsum(delta, gamma * lam)
    return out[dest]


def _prepare(
    rewards: Tensor, values: Tensor, action_mask: Tensor, cu_seqlens: Tensor, gamma: float
) -> tuple[Tensor, int]:
    check_packed(cu_seqlens, rewards, values, action_mask, names=("rewards", "values", "action_mask"))
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
    if not values.is_floating_point():
        raise ValueError(f"values must be a float tensor, got {values.dtype}")
    return action_mask.bool(), cu_seqlens.numel() - 1


def skip_observation_gae(
    rewards: Tensor,
    values: Tensor,
    action_mask: Tensor,
    cu_seqlens: Tensor,
    gamma: float = 1.0,
    lam: float | Tensor = 1.0,
    *,
    bootstrap: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Token-level GAE over action tokens only, jumping over observation spans.

    The formulas are in docs/concepts.md, "Skip-observation GAE".

    Inside an action span ``δ_t = r_t + γV(s_{t+1}) − V(s_t)``; at an action→observation boundary the
    next value is that of the next turn's first action token; after the last action token it is 0, or,
    for a trajectory marked in ``bootstrap``, the value at the last action token itself.

    Args:
        rewards: ``(T,)`` packed token rewards, non-zero only on action tokens.
        values: ``(T,)`` critic values (detached inside).
        action_mask: ``(T,)`` bool/int, 1 on model-generated tokens.
        cu_seqlens: ``(B+1,)`` trajectory boundaries.
        gamma: discount γ (SAO: 1.0).
        lam: λ as a float or a ``(B,)`` tensor (length-adaptive λ per trajectory).
        bootstrap: ``(B,)`` bool, truncated trajectories whose tail is not terminal (None: all terminal).

    Returns:
        ``(advantages, returns)``, both ``(T,)`` in the dtype of ``values``, 0 on non-action tokens;
        ``returns = advantages + values`` on action tokens.
    """
    mask, num_seqs = _prepare(rewards, values, action_mask, cu_seqlens, gamma)
    lam_t = _lambda_per_seq(lam, num_seqs, rewards.device)
    boot = _check_bootstrap(bootstrap, num_seqs, rewards.device)
    return _chain_gae(rewards, values, mask, mask, cu_seqlens, gamma, lam_t, boot)


def response_mask(action_mask: Tensor, cu_seqlens: Tensor) -> Tensor:
    """``(T,)`` bool: tokens from the first action token of each trajectory to its end."""
    mask = action_mask.bool()
    seq_ids = seq_ids_from_cu_seqlens(cu_seqlens)
    positions = torch.arange(mask.numel(), device=mask.device)
    big = mask.numel()
    first = torch.full((cu_seqlens.numel() - 1,), big, dtype=torch.long, device=mask.device)
    first = first.scatter_reduce(0, seq_ids[mask], positions[mask], reduce="amin")
    return positions >= first[seq_ids]


def token_gae(
    rewards: Tensor,
    values: Tensor,
    action_mask: Tensor,
    cu_seqlens: Tensor,
    gamma: float = 1.0,
    lam: float | Tensor = 1.0,
    *,
    bootstrap: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Plain token-level GAE over every response position (the naive multi-turn baseline).

    The recursion runs over all tokens from the first action token to the end of the trajectory, so
    observation tokens' values enter the TD errors; the outputs are then masked to action tokens.
    A trajectory marked in ``bootstrap`` takes the value at its last token as the next value after it.
    Shapes and returns as :func:`skip_observation_gae`.
    """
    mask, num_seqs = _prepare(rewards, values, action_mask, cu_seqlens, gamma)
    lam_t = _lambda_per_seq(lam, num_seqs, rewards.device)
    boot = _check_bootstrap(bootstrap, num_seqs, rewards.device)
    chain = response_mask(mask, cu_seqlens)
    return _chain_gae(rewards, values, chain, mask, cu_seqlens, gamma, lam_t, boot)


def step_spans(
    action_mask: Tensor, cu_seqlens: Tensor, turn_ids: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Locate steps: maximal runs of action tokens within a trajectory (and, when ``turn_ids`` ``(T,)``
    is given, within one turn, so two back-to-back turns with no observation between stay two steps).

    Returns:
        ``step_of_token`` ``(T,)`` long (step index, −1 on non-action tokens), ``step_cu_seqlens``
        ``(B+1,)`` (steps per trajectory, cumulative), ``is_last`` ``(T,)`` bool (last token of a step).
    """
    mask = action_mask.bool()
    seq_ids = seq_ids_from_cu_seqlens(cu_seqlens)
    starts, is_last = action_span_bounds(mask, turn_ids, seq_ids)
    step_idx = torch.cumsum(starts.long(), 0) - 1
    step_of_token = torch.where(mask, step_idx, torch.full_like(step_idx, -1))
    steps_per_seq = segment_count(starts, seq_ids, cu_seqlens.numel() - 1)
    step_cu = torch.zeros(steps_per_seq.numel() + 1, dtype=torch.long, device=mask.device)
    step_cu[1:] = torch.cumsum(steps_per_seq, 0)
    return step_of_token, step_cu, is_last


def step_gae(
    rewards: Tensor,
    values: Tensor,
    action_mask: Tensor,
    cu_seqlens: Tensor,
    gamma: float = 1.0,
    lam: float | Tensor = 1.0,
    step_value: Literal["average", "last_token"] = "average",
    turn_ids: Tensor | None = None,
    *,
    bootstrap: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Step-wise GAE: one advantage per turn (a step = a maximal run of action tokens).

    Step value ``V(S_i)`` is the mean of the step's token values (``average``) or the value at its last
    token (``last_token``); ``δ_i = R_i + γV(S_{i+1}) − V(S_i)`` with ``R_i`` the sum of the step's token
    rewards, ``V(S_{n+1}) = 0`` (``V(S_n)`` for a trajectory marked in ``bootstrap`` ``(B,)`` bool);
    ``Â_i = δ_i + γλÂ_{i+1}``. Pass λ per trajectory to count steps in the length-adaptive rule.
    ``turn_ids`` ``(T,)`` optionally splits steps at turn changes (see :func:`step_spans`).

    Returns:
        ``(advantages, returns, value_mask)``, all ``(T,)``: every action token of step i gets ``Â_i``;
        the value target ``Â_i + V(S_i)`` is on all of the step's tokens (``average``) or on its last token
        only (``last_token``); ``value_mask`` marks the tokens the value loss trains on.
    """
    if step_value not in ("average", "last_token"):
        raise ValueError(f"step_value must be 'average' or 'last_token', got {step_value!r}")
    mask, num_seqs = _prepare(rewards, values, action_mask, cu_seqlens, gamma)
    lam_t = _lambda_per_seq(lam, num_seqs, rewards.device)
    boot = _check_bootstrap(bootstrap, num_seqs, rewards.device)
    if bool(((rewards != 0) & ~mask).any()):
        raise ValueError(STRAY_REWARD_MSG)
    step_of_token, step_cu, is_last = step_spans(mask, cu_seqlens, turn_ids)
    num_steps = int(step_cu[-1])
    if num_steps == 0:  # no action token in the batch: nothing to estimate
        zeros = torch.zeros_like(values, requires_grad=False)
        return zeros, zeros.clone(), mask
    act_steps = step_of_token[mask]
    v64 = values.detach().to(torch.float64)
    step_rewards = segment_sum(rewards[mask].to(torch.float64), act_steps, num_steps)
    if step_value == "average":
        sums = segment_sum(v64[mask], act_steps, num_steps)
        step_values = sums / segment_count(mask[mask], act_steps, num_steps).clamp(min=1)
        value_mask = mask
    else:
        step_values = torch.zeros(num_steps, dtype=torch.float64, device=values.device)
        step_values[step_of_token[is_last]] = v64[is_last]
        value_mask = is_last
    all_steps = torch.ones(num_steps, dtype=torch.bool, device=mask.device)
    step_adv, _ = _chain_gae(step_rewards, step_values, all_steps, all_steps, step_cu, gamma, lam_t, boot)
    gathered = step_of_token.clamp(min=0)
    adv = torch.where(mask, step_adv[gathered], torch.zeros_like(v64))
    returns = torch.where(value_mask, (step_adv + step_values)[gathered], torch.zeros_like(v64))
    return adv.to(values.dtype), returns.to(values.dtype), value_mask
