"""The trainer's view of a generation, for engine tests: teacher-forced log-probs of the generated tokens."""

from __future__ import annotations

import torch

from sao.engine.types import Generation
from sao.models.forward import token_logprobs
from sao.types import Batch, Trajectory


def trainer_logprobs(
    model: torch.nn.Module, prompt: list[int], gen: Generation, temperature: float = 1.0
) -> list[float]:
    """log π(token | prefix) of each generated token under ``model`` (fp32, no grad), as a list."""
    n, k = len(prompt), len(gen.token_ids)
    traj = Trajectory(
        prompt_id="p",
        token_ids=prompt + gen.token_ids,
        action_mask=[0] * n + [1] * k,
        rollout_logprobs=[0.0] * n + gen.logprobs,
        versions=[-1] * n + gen.versions,
        turn_ids=[-1] * n + [0] * k,
        rewards=[0.0],
    )
    with torch.no_grad():
        logprobs, _ = token_logprobs(model, Batch.from_trajectories([traj]), temperature=temperature)
    return logprobs[n:].tolist()
