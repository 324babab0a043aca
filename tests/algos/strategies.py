"""Random packed batches for the property tests, and the textbook per-token loops they are checked against.

A trajectory is ``prompt, a_0, o_0, a_1, o_1, …`` packed one after another; a zero-length observation
between two action spans makes them one run of action tokens. Rewards sit only on action tokens; values
on prompt/observation tokens are large junk so that reading one by mistake shows in the result.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import strategies as st
from torch import Tensor

# λ values the scan treats specially (0, below its tiny-decay cut, below float32's minimum decay) or at
# the ends of the range.
SPECIAL_LAMBDAS = (0.0, 1e-13, 1e-6, 0.005, 0.5, 0.95, 1.0)
SPECIAL_GAMMAS = (0.0, 0.5, 0.99, 1.0)


@dataclass(frozen=True)
class Packed:
    rewards: Tensor  # (T,)
    values: Tensor  # (T,)
    action_mask: Tensor  # (T,) bool
    cu_seqlens: Tensor  # (B+1,) long

    @property
    def num_seqs(self) -> int:
        return self.cu_seqlens.numel() - 1

    def bounds(self) -> list[tuple[int, int]]:
        cu = self.cu_seqlens.tolist()
        return list(itertools.pairwise(cu))


def build_packed(
    masks: list[list[bool]], seed: int, dtype: torch.dtype = torch.float64, reward_prob: float = 0.3
) -> Packed:
    """Pack per-trajectory action masks; draw values (junk ×10 off actions) and rewards on action tokens.

    Every trajectory with an action token gets an outcome reward on its last one, and each other action
    token carries a reward with probability ``reward_prob`` (per-turn / shaped rewards).
    """
    rng = np.random.default_rng(seed)
    mask = np.array([m for seq in masks for m in seq], dtype=bool)
    total = mask.size
    values = rng.normal(size=total)
    values[~mask] = rng.normal(scale=10.0, size=int((~mask).sum()))
    rewards = np.where(mask & (rng.random(total) < reward_prob), rng.normal(size=total), 0.0)
    start = 0
    for seq in masks:
        idx = [start + i for i, m in enumerate(seq) if m]
        if idx:
            rewards[idx[-1]] = rng.choice([0.0, 1.0, rng.normal()])
        start += len(seq)
    cu = np.cumsum([0] + [len(seq) for seq in masks])
    return Packed(
        rewards=torch.tensor(rewards, dtype=dtype),
        values=torch.tensor(values, dtype=dtype),
        action_mask=torch.tensor(mask, dtype=torch.bool),
        cu_seqlens=torch.tensor(cu, dtype=torch.long),
    )


@st.composite
def trajectory_masks(draw, max_turns: int = 4, max_span: int = 7) -> list[bool]:
    """One trajectory's action mask: prompt, then turns of (action span, observation span)."""
    mask = [False] * draw(st.integers(0, 3))
    for _ in range(draw(st.integers(0, max_turns))):
        mask += [True] * draw(st.integers(1, max_span))
        mask += [False] * draw(st.integers(0, max_span))
    return mask


@st.composite
def packed_batches(
    draw, dtype: torch.dtype = torch.float64, max_seqs: int = 5, max_turns: int = 4, max_span: int = 7
) -> Packed:
    """A packed batch with at least one action token in all."""
    masks = draw(
        st.lists(trajectory_masks(max_turns, max_span), min_size=1, max_size=max_seqs).filter(
            lambda ms: any(any(m) for m in ms)
        )
    )
    return build_packed(masks, draw(st.integers(0, 2**32 - 1)), dtype)


def unit_floats() -> st.SearchStrategy[float]:
    return st.floats(0.0, 1.0, allow_nan=False)


def lambdas() -> st.SearchStrategy[float]:
    return st.one_of(st.sampled_from(SPECIAL_LAMBDAS), unit_floats())


def gammas() -> st.SearchStrategy[float]:
    return st.one_of(st.sampled_from(SPECIAL_GAMMAS), unit_floats())


@st.composite
def lambda_args(draw, num_seqs: int) -> float | Tensor:
    """λ as one float, or a per-trajectory ``(B,)`` tensor (float32 like the adaptive rule, or float64)."""
    if draw(st.booleans()):
        return draw(lambdas())
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    return torch.tensor(draw(st.lists(lambdas(), min_size=num_seqs, max_size=num_seqs)), dtype=dtype)


def per_seq_lambda(lam: float | Tensor, num_seqs: int) -> list[float]:
    if isinstance(lam, Tensor):
        return [float(x) for x in lam.tolist()]
    return [float(lam)] * num_seqs


# ---- textbook references: one Python loop per trajectory, float64 ---------------------------------------


def _gae_over(
    positions: list[int], r: list[float], v: list[float], gamma: float, lam: float, bootstrap: bool = False
) -> dict:
    """Backward GAE along ``positions`` (in time order); the value after the last one is 0, or (with
    ``bootstrap``, a truncated trajectory) the value at the last one."""
    out = {}
    adv = 0.0
    next_value = v[positions[-1]] if bootstrap and positions else 0.0
    for t in reversed(positions):
        delta = r[t] + gamma * next_value - v[t]
        adv = delta + gamma * lam * adv
        out[t] = adv
        next_value = v[t]
    return out


def _bootstrap_list(bootstrap: Tensor | None, num_seqs: int) -> list[bool]:
    return [False] * num_seqs if bootstrap is None else [bool(x) for x in bootstrap.tolist()]


def reference_skip_observation_gae(
    p: Packed, gamma: float, lam: float | Tensor, bootstrap: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    r, v, m = p.rewards.double().tolist(), p.values.double().tolist(), p.action_mask.tolist()
    adv, ret = [0.0] * len(m), [0.0] * len(m)
    per_seq = zip(
        p.bounds(), per_seq_lambda(lam, p.num_seqs), _bootstrap_list(bootstrap, p.num_seqs), strict=True
    )
    for (s, e), lam_b, boot in per_seq:
        for t, a in _gae_over([t for t in range(s, e) if m[t]], r, v, gamma, lam_b, boot).items():
            adv[t], ret[t] = a, a + v[t]
    return torch.tensor(adv, dtype=torch.float64), torch.tensor(ret, dtype=torch.float64)


def reference_token_gae(
    p: Packed, gamma: float, lam: float | Tensor, bootstrap: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    r, v, m = p.rewards.double().tolist(), p.values.double().tolist(), p.action_mask.tolist()
    adv, ret = [0.0] * len(m), [0.0] * len(m)
    per_seq = zip(
        p.bounds(), per_seq_lambda(lam, p.num_seqs), _bootstrap_list(bootstrap, p.num_seqs), strict=True
    )
    for (s, e), lam_b, boot in per_seq:
        actions = [t for t in range(s, e) if m[t]]
        if not actions:
            continue
        for t, a in _gae_over(list(range(actions[0], e)), r, v, gamma, lam_b, boot).items():
            if m[t]:
                adv[t], ret[t] = a, a + v[t]
    return torch.tensor(adv, dtype=torch.float64), torch.tensor(ret, dtype=torch.float64)


def steps_of(mask: list[bool], s: int, e: int) -> list[list[int]]:
    """Maximal runs of action tokens in ``[s, e)``."""
    steps: list[list[int]] = []
    for t in range(s, e):
        if mask[t]:
            if t > s and mask[t - 1]:
                steps[-1].append(t)
            else:
                steps.append([t])
    return steps


def reference_step_gae(
    p: Packed, gamma: float, lam: float | Tensor, step_value: str, bootstrap: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    r, v, m = p.rewards.double().tolist(), p.values.double().tolist(), p.action_mask.tolist()
    adv, ret, vmask = [0.0] * len(m), [0.0] * len(m), [False] * len(m)
    per_seq = zip(
        p.bounds(), per_seq_lambda(lam, p.num_seqs), _bootstrap_list(bootstrap, p.num_seqs), strict=True
    )
    for (s, e), lam_b, boot in per_seq:
        steps = steps_of(m, s, e)
        step_r = [sum(r[t] for t in step) for step in steps]
        if step_value == "average":
            step_v = [sum(v[t] for t in step) / len(step) for step in steps]
        else:
            step_v = [v[step[-1]] for step in steps]
        step_adv = _gae_over(list(range(len(steps))), step_r, step_v, gamma, lam_b, boot)
        for i, step in enumerate(steps):
            for t in step:
                adv[t] = step_adv[i]
            for t in step if step_value == "average" else step[-1:]:
                ret[t], vmask[t] = step_adv[i] + step_v[i], True
    return (
        torch.tensor(adv, dtype=torch.float64),
        torch.tensor(ret, dtype=torch.float64),
        torch.tensor(vmask, dtype=torch.bool),
    )


def reference_discounted_cumsum(x: np.ndarray, decay: np.ndarray | float) -> np.ndarray:
    """``y_t = x_t + d·y_{t-1}`` with a loop over time (vectorised over rows), float64."""
    x = np.asarray(x, dtype=np.float64)
    d = np.broadcast_to(np.asarray(decay, dtype=np.float64), x.shape[:1])
    out = np.empty_like(x)
    acc = np.zeros(x.shape[0])
    for t in range(x.shape[1]):
        acc = x[:, t] + d * acc
        out[:, t] = acc
    return out
