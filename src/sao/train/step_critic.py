"""The critic's part of a trainer step (steps 1–3 of `sao.train.step`): values, targets, K optimizer steps
on fixed targets, values of the updated critic.

`CriticLearner` owns the critic's trainable parameters, its AdamW and lr schedule and its step counters;
`sao.train.step.Trainer` holds one when its estimator uses a critic. The critic's freezing rule is
(re)applied from ``CriticOptim.freeze`` when it is built (a value-pretrained critic may have trained all
parameters).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from sao.algos import CriticTargets, explained_variance, value_loss
from sao.models.forward import token_values
from sao.models.freezing import apply_freeze, trainable_parameters
from sao.types import Batch

from .capture import StepCapture
from .collective import Collective
from .settings import CriticOptim
from .step_schedule import critic_lr_factor
from .step_shard import StepShard
from .step_support import (
    advance,
    clip_grad_norm,
    finite_update,
    grad_norm,
    host,
    reduce_on_last,
    token_slices,
)

__all__ = ["CriticLearner"]


class CriticLearner:
    """The critic, its optimizer and schedule, and ``steps`` / ``skipped_steps`` (applied / skipped
    optimizer steps: a step with a non-finite loss or gradient norm is skipped, as the actor's)."""

    def __init__(
        self, critic: nn.Module, args: CriticOptim, collective: Collective, gradient_sync: str, device: Any
    ) -> None:
        apply_freeze(getattr(critic, "model", critic), args.freeze)
        self.critic, self.args, self.collective = critic, args, collective
        self.gradient_sync, self.device = gradient_sync, device
        self.params: list[nn.Parameter] = trainable_parameters(critic)
        # the attention part of the gradient (none when attention is frozen): how much of it attention carries
        self.attention_params = [
            p for name, p in critic.named_parameters() if p.requires_grad and ".self_attn." in name
        ]
        self.optim = torch.optim.AdamW(self.params, lr=args.lr, weight_decay=args.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.optim, critic_lr_factor(args.lr_warmup_steps))
        self.steps = 0
        self.skipped_steps = 0

    @torch.no_grad()
    def values(self, parts: list[Batch]) -> Tensor:
        """``(T,)`` float32 values of this rank's micro-batches, concatenated."""
        return torch.cat([token_values(self.critic, part).float() for part in parts])

    def end_step(self, skipped_before: int) -> None:
        """Advance the lr schedule once per trainer step (quietly when this step's updates were skipped)."""
        advance(self.sched, self.skipped_steps > skipped_before)

    def update(
        self,
        batch: Batch,
        step: StepShard,
        targets_of: Callable[[Tensor], CriticTargets],
        capture: StepCapture | None,
    ) -> tuple[Tensor, dict[str, float]]:
        """Steps 1–3 on ``batch``: ``targets_of(values)`` gives the estimator's targets from the pre-update
        ``(T,)`` values. Returns the whole batch's ``(T,)`` values for the advantages (recomputed after the
        updates when ``recompute_values``) and the metrics."""
        args, parts = self.args, step.parts
        # One micro-batch: the first critic step's forward (with grad) also gives the pre-update values the
        # targets need, so the separate no-grad forward is skipped (same values: same weights, same input).
        first: Tensor | None = None
        if len(parts) == 1 and args.k_critic >= 1:
            first = token_values(self.critic, parts[0]).float()
            old_values = step.gather(first.detach())
        else:
            old_values = step.gather(self.values(parts))
        targets = targets_of(old_values)
        returns = targets.returns.detach()
        mask = (batch.action_mask if targets.value_mask is None else targets.value_mask).bool()
        metrics = {"critic/explained_variance": explained_variance(old_values, returns, mask)}
        local = (step.local(returns), step.local(mask), step.local(old_values))
        losses, norms, attention = self._optimizer_steps(parts, local, max(float(mask.sum()), 1.0), first)
        metrics.update(
            {
                "critic/value_loss": losses[0],
                "critic/value_loss_last": losses[-1],
                "critic/grad_norm": sum(norms) / len(norms),
                "critic/grad_norm_max": max(norms),
                "critic/grad_norm_attention": sum(attention) / len(attention),
                "critic/lr": self.optim.param_groups[0]["lr"],
                "critic/value_mean": float(old_values[mask].mean()) if mask.any() else 0.0,
                "critic/return_mean": float(returns[mask].mean()) if mask.any() else 0.0,
            }
        )
        values = old_values
        if args.recompute_values:
            values = step.gather(self.values(parts))
            metrics["critic/explained_variance_after"] = explained_variance(values, returns, mask)
        if capture is not None:
            capture.values_before, capture.values_after = host(old_values), host(values)
            capture.returns, capture.value_mask = host(returns), mask.cpu()
        return values, metrics

    def _optimizer_steps(
        self,
        parts: list[Batch],
        local: tuple[Tensor, Tensor, Tensor],
        denominator: float,
        first: Tensor | None,
    ) -> tuple[list[float], list[float], list[float]]:
        """K optimizer steps on fixed targets; returns each step's whole-batch loss, gradient norm and the
        norm of its attention parameters' part (before clipping)."""
        local_returns, local_mask, local_old = local
        slices = token_slices(parts)
        losses, norms, attention = [], [], []
        for _ in range(self.args.k_critic):
            self.optim.zero_grad(set_to_none=True)
            total = torch.zeros((), device=self.device)
            with reduce_on_last(self.critic, len(parts), self.gradient_sync) as before_backward:
                for i, (part, sl) in enumerate(zip(parts, slices, strict=True)):
                    v = first if first is not None else token_values(self.critic, part).float()
                    first = None
                    loss, _ = value_loss(
                        v, local_returns[sl], local_mask[sl], local_old[sl], self.args.value_clip,
                        denominator=denominator, with_metrics=False,
                    )  # fmt: skip
                    before_backward(i)
                    loss.backward()
                    total = total + loss.detach()
            attention.append(grad_norm(self.attention_params))
            norm = clip_grad_norm(self.params, self.args.grad_clip)
            total = self.collective.sum(total)  # the whole batch's loss: the same skip decision everywhere
            if finite_update(total, norm):
                self.optim.step()
                self.steps += 1
            else:  # skipped: no stale NaN/Inf gradients left behind
                self.optim.zero_grad(set_to_none=True)
                self.skipped_steps += 1
            norms.append(float(norm))
            losses.append(float(total))
        return losses, norms, attention
