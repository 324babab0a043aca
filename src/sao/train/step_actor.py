"""The actor's loss and backward over one rank's micro-batches (step 5 of `sao.train.step`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from sao.algos import LossInputs, PolicyLoss
from sao.types import Batch

from .step_shard import StepShard
from .step_support import Accumulator, denominator, reduce_on_last, token_slices

__all__ = ["actor_backward"]

LogprobsFn = Callable[[Batch, bool], tuple[Tensor, Tensor | None]]


def actor_backward(
    loss_fn: PolicyLoss,
    logprobs_of: LogprobsFn,
    batch: Batch,
    step: StepShard,
    advantages: Tensor,
    reference: Tensor | None,
    *,
    model: nn.Module,
    gradient_sync: str,
    keep_entropy: bool,
) -> tuple[Accumulator, Tensor, Tensor, list[Tensor]]:
    """The loss and its backward on every micro-batch of this rank (gradients accumulate in ``model``).

    ``logprobs_of(part, with_entropy)``: the actor's ``(t,)`` log-probs (with grad) and entropies of a
    micro-batch. ``advantages``: the whole batch's ``(T,)``. ``reference``: this rank's ``(T_local,)``
    log-probs the ratio is taken to, or None: the forward's own, detached (π_old without a second forward).
    Returns the metric accumulator, this rank's summed loss (0-d), the whole batch's ``(T,)`` log-probs
    before the update, and (``keep_entropy``) the micro-batches' entropies."""
    parts = step.parts
    action = batch.action_mask.bool()
    local_adv = step.local(advantages.detach())
    positive = (batch.outcome_rewards > 0)[batch.seq_ids]
    # whole-batch counts: the ranks' micro-batch losses add up to the batch's loss
    den = denominator(batch, action, loss_fn.agg)
    pos_den = denominator(batch, action & positive, loss_fn.agg)
    positive = step.local(positive)
    n_total = float(action.sum())
    acc = Accumulator()
    fresh, entropies = [], []
    total = torch.zeros((), device=advantages.device)
    with reduce_on_last(model, len(parts), gradient_sync) as before_backward:
        for i, (part, sl) in enumerate(zip(parts, token_slices(parts), strict=True)):
            lp, entropy = logprobs_of(part, True)
            mask = part.action_mask
            ref = lp.detach() if reference is None else reference[sl]
            out = loss_fn(
                LossInputs(lp, ref, local_adv[sl], mask, part.cu_seqlens, den, positive[sl], pos_den)
            )
            before_backward(i)
            out.loss.backward()
            total = total + out.loss.detach()
            fresh.append(lp.detach())
            if keep_entropy:
                entropies.append(entropy.detach())
            n_action = float(mask.sum())
            # Part losses add up to the batch loss; scaled so the action-token-weighted mean is that sum.
            scale = n_total / max(n_action, 1.0)
            metrics = dict(out.metrics)
            metrics.update({name: term * scale for name, term in out.terms.items()})
            assert entropy is not None
            metrics["actor/entropy"] = (entropy.detach() * mask).sum() / max(n_action, 1.0)
            metrics["actor/loss"] = out.loss.detach() * scale
            acc.add(metrics, n_action)
    return acc, total, step.gather(torch.cat(fresh)), entropies
