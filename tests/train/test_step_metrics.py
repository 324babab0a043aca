"""The trainer's batch metrics count turns as `Trajectory.num_turns` does (back-to-back turns are two)."""

from __future__ import annotations

import pytest

from sao.train.step_metrics import batch_metrics
from sao.types import Batch, Trajectory


def _trajectory(kinds: str, turn_ids: list[int], rewards: list[float]) -> Trajectory:
    """``kinds``: one letter per token, ``p`` prompt, ``a`` action, ``o`` observation."""
    action = [int(k == "a") for k in kinds]
    return Trajectory(
        token_ids=list(range(10, 10 + len(kinds))),
        action_mask=action,
        rollout_logprobs=[-0.5 * a for a in action],
        versions=[2 if a else -1 for a in action],
        turn_ids=turn_ids,
        rewards=rewards,
        prompt_id="p",
    )


def test_turns_mean_counts_action_spans_per_trajectory_across_packing_boundaries():
    trajs = [
        _trajectory("paaoaa", [-1, 0, 0, 0, 1, 1], [1.0]),  # two turns with an observation between
        _trajectory("paaaa", [-1, 0, 0, 1, 1], [0.0, 1.0]),  # two back-to-back turns
        _trajectory("pa", [-1, 0], [1.0]),  # one turn, followed in the pack by the next trajectory's action
        _trajectory("aa", [0, 0], [0.0]),
    ]
    metrics = batch_metrics(Batch.from_trajectories(trajs), policy_version=3)
    assert [t.num_turns for t in trajs] == [2, 2, 1, 1]
    assert metrics["batch/turns_mean"] == pytest.approx(6 / 4)
    assert metrics["lag/token_mean"] == 1.0 and metrics["batch/trajectories"] == 4.0
