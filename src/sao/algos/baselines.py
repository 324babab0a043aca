"""Stateful single-rollout baselines: running-mean rewards and SPO's KL-adaptive Beta tracker.

They keep history across training steps, so they are small objects with ``state_dict`` /
``load_state_dict`` (saved in checkpoints); the arithmetic on a batch is vectorised.
Convention for both: advantages of a batch use the state *before* the batch, then the batch updates it.
The two halves are separate methods: ``estimate`` is pure (reads the state, never changes it) and
``update`` records a batch; ``advantages`` is the one-call convenience ``estimate`` then ``update``.
The estimators of `sao.algos.estimators` call the halves (``estimate``, then ``update_state``), so a trainer
can compute advantages and record the batch only once it has actually been trained on.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from typing import Any, Literal

import torch
from torch import Tensor

__all__ = ["RunningMeanBaseline", "SPOTracker"]


class RunningMeanBaseline:
    """Baseline = mean of the ``window`` most recent rewards, per prompt or over all prompts.

    ``scope="prompt"`` with window 8 is the paper's running-mean ablation; ``scope="global"`` with 128
    its online-learning baseline. With no history yet the baseline is ``empty_value``.
    """

    def __init__(
        self, window: int, scope: Literal["prompt", "global"] = "prompt", empty_value: float = 0.0
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if scope not in ("prompt", "global"):
            raise ValueError(f"scope must be 'prompt' or 'global', got {scope!r}")
        self.window = window
        self.scope = scope
        self.empty_value = empty_value
        self._history: dict[Hashable, deque[float]] = {}

    def _key(self, prompt_id: Hashable) -> Hashable:
        return prompt_id if self.scope == "prompt" else "__global__"

    def baseline(self, prompt_ids: Sequence[Hashable]) -> Tensor:
        """``(B,)`` float32 baseline per trajectory from the current history."""
        out = []
        for pid in prompt_ids:
            hist = self._history.get(self._key(pid))
            out.append(sum(hist) / len(hist) if hist else self.empty_value)
        return torch.tensor(out, dtype=torch.float32)

    def update(self, prompt_ids: Sequence[Hashable], rewards: Tensor) -> None:
        """Append the batch's rewards (in batch order) to the history."""
        for pid, r in zip(prompt_ids, rewards.detach().cpu().tolist(), strict=True):
            key = self._key(pid)
            self._history.setdefault(key, deque(maxlen=self.window)).append(float(r))

    def estimate(self, prompt_ids: Sequence[Hashable], rewards: Tensor) -> Tensor:
        """``(B,)`` float32 ``R − baseline`` from the current history, on ``rewards.device``; pure (the
        history is not changed)."""
        return (rewards.detach().float().cpu() - self.baseline(prompt_ids)).to(rewards.device)

    def advantages(self, prompt_ids: Sequence[Hashable], rewards: Tensor) -> Tensor:
        """``(B,)`` ``R − baseline`` from the history before this batch; then records the batch
        (:meth:`estimate` then :meth:`update`)."""
        adv = self.estimate(prompt_ids, rewards)
        self.update(prompt_ids, rewards)
        return adv

    def state_dict(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "scope": self.scope,
            "empty_value": self.empty_value,
            "history": [[k, list(v)] for k, v in self._history.items()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["window"] != self.window or state["scope"] != self.scope:
            raise ValueError(
                f"state is for window={state['window']} scope={state['scope']!r}, "
                f"this baseline has window={self.window} scope={self.scope!r}"
            )
        self.empty_value = state["empty_value"]
        self._history = {k: deque(v, maxlen=self.window) for k, v in state["history"]}


class SPOTracker:
    """SPO's per-prompt Beta tracker with KL-adaptive forgetting (Xu & Ding 2025; docs/algorithms.md,
    "Advantage estimators").

    Each prompt has ``Beta(α, β)``; its success estimate is ``p̂ = α/(α+β)``. For a batch:
    ``A = r − p̂`` (state before the update), z-normalised over the batch; then
    ``α ← ρα + r``, ``β ← ρβ + (1 − r)`` with ``ρ = clamp(2^(−D/D_half), ρ_min, ρ_max)`` and ``D`` the
    policy divergence on that prompt's sample (the paper: mean |log π_old − log π|; the trainer's reading
    is in docs/training.md, "The trainer step"). Rewards must lie in [0, 1].

    Unseen prompts start from ``Beta(prior_alpha, prior_beta)``.
    """

    def __init__(
        self,
        d_half: float = 0.06,
        rho_min: float = 0.875,
        rho_max: float = 0.96,
        sampling_floor: float = 0.05,
        prior_alpha: float = 0.5,
        prior_beta: float = 0.5,
        eps: float = 1e-6,
    ) -> None:
        if not (0.0 < rho_min <= rho_max <= 1.0):
            raise ValueError(f"need 0 < rho_min <= rho_max <= 1, got {rho_min}, {rho_max}")
        if d_half <= 0:
            raise ValueError(f"d_half must be > 0, got {d_half}")
        if prior_alpha <= 0 or prior_beta <= 0:
            raise ValueError("prior_alpha and prior_beta must be > 0")
        self.d_half, self.rho_min, self.rho_max = d_half, rho_min, rho_max
        self.sampling_floor, self.eps = sampling_floor, eps
        self.prior = (prior_alpha, prior_beta)
        self._ab: dict[Hashable, tuple[float, float]] = {}

    def _get(self, pid: Hashable) -> tuple[float, float]:
        return self._ab.get(pid, self.prior)

    def p_hat(self, prompt_ids: Sequence[Hashable]) -> Tensor:
        """``(B,)`` float32 current success estimates."""
        return torch.tensor([a / (a + b) for a, b in map(self._get, prompt_ids)], dtype=torch.float32)

    def forgetting(self, divergence: Tensor) -> Tensor:
        """``(B,)`` ρ = clamp(2^(−D/D_half), ρ_min, ρ_max)."""
        return torch.pow(2.0, -divergence.double() / self.d_half).clamp(self.rho_min, self.rho_max)

    @staticmethod
    def _checked_rewards(rewards: Tensor) -> Tensor:
        r = rewards.detach().double().cpu()
        if bool(((r < 0) | (r > 1) | r.isnan()).any()):
            raise ValueError("SPO needs rewards in [0, 1] (it tracks a Bernoulli success rate)")
        return r

    def estimate(self, prompt_ids: Sequence[Hashable], rewards: Tensor) -> Tensor:
        """``(B,)`` float32 z-normalised ``r − p̂`` from the current trackers, on ``rewards.device``; pure
        (the trackers are not changed). A batch of one gets 0.

        Args:
            prompt_ids: B prompt keys. rewards: ``(B,)`` in [0, 1] (else ``ValueError``).
        """
        r = self._checked_rewards(rewards)
        raw = r - self.p_hat(prompt_ids).double()
        std = raw.std(unbiased=False) if raw.numel() > 1 else torch.zeros((), dtype=raw.dtype)
        adv = (raw - raw.mean()) / (std + self.eps)
        return adv.to(rewards.device, torch.float32)

    def advantages(
        self, prompt_ids: Sequence[Hashable], rewards: Tensor, divergence: Tensor | None = None
    ) -> Tensor:
        """``(B,)`` z-normalised ``r − p̂`` using the state before the batch; then updates the trackers
        (:meth:`estimate` then :meth:`update`).

        Args:
            prompt_ids: B prompt keys. rewards: ``(B,)`` in [0, 1].
            divergence: ``(B,)`` D per trajectory (0 when omitted: slowest forgetting, ρ = ρ_max).
        """
        adv = self.estimate(prompt_ids, rewards)
        self.update(prompt_ids, rewards, divergence)
        return adv

    def update(
        self, prompt_ids: Sequence[Hashable], rewards: Tensor, divergence: Tensor | None = None
    ) -> None:
        """``α ← ρα + r``, ``β ← ρβ + (1 − r)``, in batch order (repeated prompts update in turn).

        ``rewards`` ``(B,)`` in [0, 1] (else ``ValueError``, nothing updated); ``divergence`` ``(B,)`` D per
        trajectory, 0 when omitted (ρ = ρ_max).
        """
        r = self._checked_rewards(rewards)
        d = torch.zeros_like(r) if divergence is None else divergence.detach().double().cpu()
        rho = self.forgetting(d).tolist()
        for pid, reward, p in zip(prompt_ids, r.tolist(), rho, strict=True):
            a, b = self._get(pid)
            self._ab[pid] = (p * a + reward, p * b + (1.0 - reward))

    def sampling_weights(self, prompt_ids: Sequence[Hashable]) -> Tensor:
        """``(B,)`` prioritised-sampling weights ``√(p̂(1 − p̂)) + floor`` (unnormalised)."""
        p = self.p_hat(prompt_ids).double()
        return (torch.sqrt(p * (1 - p)) + self.sampling_floor).float()

    def state_dict(self) -> dict[str, Any]:
        return {"prior": list(self.prior), "trackers": [[k, a, b] for k, (a, b) in self._ab.items()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.prior = (float(state["prior"][0]), float(state["prior"][1]))
        self._ab = {k: (float(a), float(b)) for k, a, b in state["trackers"]}
