"""Synthetic packed batches for the model tests (one shared builder)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sao.types import Batch, Trajectory


def make_batch(
    lengths: Sequence[int], seed: int = 0, vocab: int = 300, rewards: Sequence[float] | None = None
) -> Batch:
    """Trajectories of the given lengths: one prompt token, then action tokens (one turn), random token ids
    below ``vocab``; outcome reward ``rewards[i]`` (default 1.0 each)."""
    g = torch.Generator().manual_seed(seed)
    trajs = []
    for i, n in enumerate(lengths):
        action = [0] + [1] * (n - 1)
        trajs.append(
            Trajectory(
                prompt_id=f"p{i}",
                token_ids=torch.randint(0, vocab, (n,), generator=g).tolist(),
                action_mask=action,
                rollout_logprobs=[-1.0 * a for a in action],
                versions=[0 if a else -1 for a in action],
                turn_ids=[-1] + [0] * (n - 1),
                rewards=[1.0 if rewards is None else float(rewards[i])],
            )
        )
    return Batch.from_trajectories(trajs)
