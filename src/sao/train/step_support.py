"""The pieces of a trainer step that are not the step: the divergence stop, the finite-update rule,
gradient clipping, schedules after skipped steps, metric means over micro-batches, the gradient-sync switch
of FSDP2 models, and the whole-batch counts and divergences the step computes (`sao.train.step`)."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator

import torch
from torch import Tensor, nn

from sao.algos.packed import segment_count, segment_sum
from sao.types import Batch

from .collective import Collective

__all__ = [
    "Accumulator",
    "TrainingDiverged",
    "advance",
    "clip_grad_norm",
    "denominator",
    "divergence",
    "finite_update",
    "host",
    "reduce_on_last",
    "token_slices",
]


class TrainingDiverged(RuntimeError):  # noqa: N818 (the name the runner catches)
    """More than ``trainer.max_consecutive_skips`` (``limit``) actor steps in a row were skipped for a
    non-finite loss or gradient norm (``skips`` of them). Raised by `Trainer.train_step` on the call after
    the step that exceeded the limit, before that call changes anything."""

    def __init__(self, skips: int, limit: int) -> None:
        super().__init__(
            f"training diverged: {skips} consecutive actor steps skipped for a non-finite loss or gradient "
            f"norm (more than trainer.max_consecutive_skips={limit})"
        )
        self.skips, self.limit = skips, limit


def finite_update(loss: Tensor, grad_norm: Tensor) -> bool:
    """Whether an optimizer step may be taken: the 0-d ``loss`` and total ``grad_norm`` are both finite
    (one host sync)."""
    return bool(torch.isfinite(loss) & torch.isfinite(grad_norm))


def clip_grad_norm(params: list[nn.Parameter], max_norm: float) -> Tensor:
    """Clip the gradients in place to total norm ``max_norm``; returns the 0-d total norm before clipping
    (over all ranks for sharded parameters: FSDP's norm is a replicated DTensor, returned as a tensor)."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm, error_if_nonfinite=False)
    full_tensor = getattr(norm, "full_tensor", None)  # a DTensor's (not imported: no distributed needed)
    return full_tensor() if full_tensor is not None else norm


def grad_norm(params: list[nn.Parameter]) -> float:
    """The total 2-norm of ``params``' gradients (0.0 when none has one), over all ranks for sharded
    parameters; the gradients are not changed."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    norm = torch.nn.utils.get_total_norm(grads)
    full_tensor = getattr(norm, "full_tensor", None)
    return float(full_tensor() if full_tensor is not None else norm)


def advance(sched: torch.optim.lr_scheduler.LRScheduler, skipped: bool) -> None:
    """``sched.step()``; after a skipped optimizer step without torch's warning that no optimizer step
    preceded it (the skip is deliberate)."""
    if not skipped:
        sched.step()
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
        sched.step()


class Accumulator:
    """Weighted means of 0-d metric tensors over micro-batches (weights: action tokens)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}

    def add(self, metrics: dict[str, Tensor], weight: float) -> None:
        for name, value in metrics.items():
            self.sums[name] = self.sums.get(name, 0.0) + float(value) * weight
            self.weights[name] = self.weights.get(name, 0.0) + weight

    def means(self, collective: Collective) -> dict[str, float]:
        """The means over every rank's micro-batches (every rank has the same metric names)."""
        sums, weights = self.sums, self.weights
        if collective.world_size > 1:
            names = sorted(sums)
            total = collective.sum_floats([sums[k] for k in names] + [weights[k] for k in names])
            n = len(names)
            sums = dict(zip(names, total[:n], strict=True))
            weights = dict(zip(names, total[n:], strict=True))
        return {k: sums[k] / weights[k] if weights[k] else 0.0 for k in sums}


def host(x: Tensor) -> Tensor:
    """A detached float32 CPU copy (the captured quantities)."""
    return x.detach().float().cpu()


def token_slices(parts: list[Batch]) -> list[slice]:
    """The packed token range of each micro-batch (`Batch.split` keeps whole trajectories, in order)."""
    slices, start = [], 0
    for part in parts:
        slices.append(slice(start, start + part.num_tokens))
        start += part.num_tokens
    return slices


@contextlib.contextmanager
def reduce_on_last(
    model: nn.Module | None, count: int, gradient_sync: str
) -> Iterator[Callable[[int], None]]:
    """Yields ``before_backward(i)``, to call before the backward of micro-batch ``i`` of ``count``: on an
    FSDP2 model with ``gradient_sync="step"`` it turns the reduce-scatter off for all but the last one
    (FSDP2 reads the switch in backward); the switch is back on afterwards, whatever happens.

    Gradient reduction once per optimizer step (``gradient_sync="step"``, the default): on FSDP2 models the
    backward of every micro-batch but the last skips the reduce-scatter (``set_requires_gradient_sync``) and
    adds its gradients to the rank's *unsharded* sum; the last one reduce-scatters that sum once (the
    actor's step, and each of the K critic steps, is one such step). FSDP2 keeps that sum in the policy's
    reduce dtype (float32 with `sao.models.precision.fsdp_policy`: each micro-batch's compute-dtype gradient
    is upcast before it is added), so accumulation is as exact as with a reduce-scatter per micro-batch. The
    price is memory: from the first backward to the step, every rank holds a full unsharded gradient in the
    reduce dtype (4 bytes per parameter in float32: 32 GB for an 8B model, 122 GB for Qwen3-30B-A3B), where
    per-micro-batch reduction holds one unit's unsharded gradient at a time. ``gradient_sync="micro_batch"``
    is that trade the other way. A rank with one micro-batch reduces once either way; one process is
    unaffected.
    """
    setter = getattr(model, "set_requires_gradient_sync", None)
    if setter is None or gradient_sync != "step":
        yield lambda i: None
        return
    try:
        yield lambda i: setter(i == count - 1)
    finally:
        setter(True)


def denominator(batch: Batch, mask: Tensor, agg: str) -> float:
    """Whole-batch count the aggregation divides by: masked tokens, or trajectories with one."""
    if agg == "token-mean":
        return max(float(mask.sum()), 1.0)
    return max(float((segment_count(mask, batch.seq_ids, batch.num_sequences) > 0).sum()), 1.0)


def divergence(batch: Batch, logprobs: Tensor) -> Tensor:
    """``(B,)`` mean |log π − log π_rollout| over each trajectory's action tokens (SPO's D)."""
    action = batch.action_mask.bool()
    diff = torch.where(action, (logprobs - batch.rollout_logprobs).abs(), torch.zeros_like(logprobs))
    counts = segment_count(action, batch.seq_ids, batch.num_sequences).clamp(min=1)
    return segment_sum(diff, batch.seq_ids, batch.num_sequences) / counts
