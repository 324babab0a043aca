"""One rank's share of a training step: its trajectories, its micro-batches, and the way back to the batch.

A sharded `Trainer` gives every rank the whole batch plus the indices of its own trajectories. Everything
that needs a model (forwards, backwards) runs on the rank's micro-batches only; everything else (critic
targets, advantages, loss denominators, the estimator's state) runs on the whole batch, identically on
every rank, after the per-token model outputs are gathered back into whole-batch order (`StepShard.gather`:
zeros elsewhere, then an all-reduce sum, so each value arrives bit for bit).

FSDP runs collectives in every forward and backward, so every rank must run the same number of
micro-batches: a rank with fewer is padded with 2-token micro-batches that have no action tokens (every loss
and metric is masked by action tokens or by the value mask, so they contribute exactly 0). Per-token
tensors on the rank are laid out like ``torch.cat`` of its micro-batches, padding included (`StepShard.local`
builds them from whole-batch tensors).

Without indices (one process) the shard is the whole batch, with no padding, and `local` / `gather` return
their input: the single-process step is unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import Tensor

from sao.types import Batch

from .collective import Collective

__all__ = ["StepShard", "padding_micro_batch"]


def padding_micro_batch(batch: Batch) -> Batch:
    """A 2-token micro-batch without action tokens (the first two tokens of ``batch``'s first trajectory,
    which has at least two since its first token is never an action token)."""
    device = batch.token_ids.device
    return Batch(
        token_ids=batch.token_ids[:2].clone(),
        action_mask=torch.zeros(2, dtype=torch.bool, device=device),
        rollout_logprobs=torch.zeros(2, dtype=torch.float32, device=device),
        versions=torch.full((2,), -1, dtype=batch.versions.dtype, device=device),
        turn_ids=torch.full((2,), -1, dtype=batch.turn_ids.dtype, device=device),
        token_rewards=torch.zeros(2, dtype=torch.float32, device=device),
        position_ids=torch.arange(2, device=device),
        seq_ids=torch.zeros(2, dtype=torch.long, device=device),
        cu_seqlens=torch.tensor([0, 2], dtype=torch.int32, device=device),
        outcome_rewards=torch.zeros(1, dtype=torch.float32, device=device),
        truncated=torch.zeros(1, dtype=torch.bool, device=device),
        prompt_ids=["<padding>"],
        group_ids=[None],
        traj_ids=["<padding>"],
        max_seqlen=2,
    )


@dataclasses.dataclass(eq=False)
class StepShard:
    """``parts``: the rank's micro-batches, then ``padding`` padding ones; ``tokens`` ``(T_local,)`` long, the
    whole-batch position of each of the rank's tokens (None: the rank has the whole batch, no padding)."""

    batch: Batch
    parts: list[Batch]
    tokens: Tensor | None
    padding: int
    collective: Collective

    @classmethod
    def build(
        cls, batch: Batch, indices: Sequence[int] | None, micro_batch_tokens: int, collective: Collective
    ) -> StepShard:
        """The shard of ``batch`` at ``indices`` (this rank's trajectories; None: all of them, one process
        only), split into micro-batches of at most ``micro_batch_tokens`` tokens and padded to the largest
        count over the ranks. The ranks' indices must partition the batch (checked: ValueError on every
        rank otherwise)."""
        if indices is None:
            if collective.world_size > 1:
                raise ValueError(f"a trainer with {collective.world_size} ranks needs each rank's indices")
            return cls(batch, batch.split(micro_batch_tokens), None, 0, collective)
        idx = sorted(int(i) for i in indices)
        _check_partition(batch.num_sequences, idx, collective)
        parts: list[Batch] = []
        tokens = torch.zeros(0, dtype=torch.long, device=batch.token_ids.device)
        if idx:
            local = batch.select(idx)
            parts = local.split(micro_batch_tokens)
            starts = batch.cu_seqlens[:-1].long()[torch.as_tensor(idx, device=batch.token_ids.device)]
            tokens = starts[local.seq_ids] + local.position_ids
        padding = collective.max_int(len(parts)) - len(parts)
        parts += [padding_micro_batch(batch)] * padding
        return cls(batch, parts, tokens, padding, collective)

    def local(self, x: Tensor) -> Tensor:
        """A whole-batch ``(T,)`` tensor → the rank's ``(T_local + 2·padding,)`` (0 / False on padding)."""
        if self.tokens is None:
            return x
        return torch.cat([x[self.tokens], x.new_zeros(2 * self.padding)])

    def gather(self, x: Tensor) -> Tensor:
        """The rank's ``(T_local + 2·padding,)`` tensor (padding ignored) → the whole-batch ``(T,)`` tensor,
        every rank's tokens filled in; a collective: every rank calls it."""
        if self.tokens is None:
            return x
        n = self.tokens.numel()
        full = x.new_zeros(self.batch.num_tokens)
        full[self.tokens] = x[:n].detach()
        return self.collective.sum(full)


def _check_partition(num_sequences: int, indices: list[int], collective: Collective) -> None:
    """Raise ValueError on every rank unless each trajectory is on exactly one rank (one reduction; an
    out-of-range index is counted, not raised alone, so no rank is left waiting in a collective)."""
    counts = [0.0] * (num_sequences + 1)  # the last entry: out-of-range indices
    for i in indices:
        counts[i if 0 <= i < num_sequences else num_sequences] += 1.0
    totals = collective.sum_floats(counts)
    if totals[-1]:
        raise ValueError(f"{int(totals[-1])} shard indices out of range for a batch of {num_sequences}")
    wrong = [i for i, c in enumerate(totals[:-1]) if c != 1.0]
    if wrong:
        raise ValueError(
            f"the ranks' shards must partition the batch: trajectory {wrong[0]} is on "
            f"{int(totals[wrong[0]])} ranks ({len(wrong)} trajectories wrong)"
        )
