"""Non-finite steps are skipped, counted and bounded (the trainer step, docs/faults.md "Non-finite steps").

The cause is real and passes every validation of `Trajectory` / `Batch`: one finite but huge reward. At
1e30 the actor loss is still finite (~-2.5e29) but the squared gradients overflow float32, so the total
gradient norm is Inf; the critic's squared error overflows, so its loss is Inf.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from sao.runtime.build import FACTORIES, build_trainer
from sao.train.step import TrainingDiverged, finite_update
from sao.types import Trajectory

from .test_step import _config, _models, _on_policy_batch, _trajectories

HUGE = 1e30


def _batch(actor, reward: float | None = None, seed: int = 0):
    trajs = _trajectories(seed=seed)
    if reward is not None:
        trajs[0] = Trajectory(**{**trajs[0].__dict__, "rewards": [reward]})
    return _on_policy_batch(actor, trajs)


def _same(a, b) -> bool:
    """Deep equality of (nested) state dicts holding tensors."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _snapshot(trainer) -> dict:
    """Everything a skipped step must leave alone: weights, optimizer moments, estimator state."""
    models = {"actor": trainer.actor} | ({"critic": trainer.critic} if trainer.critic is not None else {})
    snap = {name: copy.deepcopy(m.state_dict()) for name, m in models.items()}
    snap["actor_optim"] = copy.deepcopy(trainer.actor_optim.state_dict()["state"])
    if trainer.critic_optim is not None:
        snap["critic_optim"] = copy.deepcopy(trainer.critic_optim.state_dict()["state"])
    snap["adv_state"] = copy.deepcopy(trainer.adv_state.state_dict()) if trainer.adv_state else None
    return snap


def test_finite_update_needs_a_finite_loss_and_a_finite_grad_norm():
    one, inf, nan = torch.tensor(1.0), torch.tensor(math.inf), torch.tensor(math.nan)
    assert finite_update(one, one)
    assert not finite_update(inf, one) and not finite_update(-inf, one) and not finite_update(nan, one)
    assert not finite_update(one, inf) and not finite_update(one, nan)


def test_an_inf_grad_norm_skips_the_actor_step_and_leaves_weights_moments_and_baseline_untouched(
    tiny_moe_dir,
):
    cfg = _config("running_mean_8", "trainer.lr_schedule=linear", "trainer.total_steps=10")
    actor, _ = _models(tiny_moe_dir, cfg)
    trainer = build_trainer(FACTORIES["trainer"](cfg), actor, None)
    trainer.train_step(_batch(actor), policy_version=1)  # a normal step: Adam moments and history exist
    before = _snapshot(trainer)
    lr_before = trainer.actor_optim.param_groups[0]["lr"]

    metrics = trainer.train_step(_batch(actor, HUGE, seed=1), policy_version=2)
    assert math.isfinite(metrics["actor/loss"]) and metrics["actor/grad_norm"] == math.inf  # the cause
    assert metrics["trainer/actor_updated"] == 0.0 and metrics["trainer/trained_tokens"] == 0.0
    assert metrics["trainer/skipped_steps"] == 1.0 and metrics["trainer/consecutive_skips"] == 1.0
    assert _same(_snapshot(trainer), before)
    assert all(p.grad is None for p in trainer.actor_params)  # no stale Inf/NaN gradients
    # the step counts toward the budget and the schedule; actor_steps counts applied steps only
    assert (trainer.step, trainer.actor_steps, trainer.skipped_steps) == (2, 1, 1)
    assert trainer.actor_sched.last_epoch == 2 and trainer.actor_optim.param_groups[0]["lr"] < lr_before

    metrics = trainer.train_step(_batch(actor, seed=2), policy_version=3)  # training goes on
    assert metrics["trainer/actor_updated"] == 1.0 and metrics["trainer/consecutive_skips"] == 0.0
    assert metrics["trainer/skipped_steps"] == 1.0  # cumulative
    assert all(torch.isfinite(p).all() for p in actor.parameters())
    assert not _same(actor.state_dict(), before["actor"])


def test_a_non_finite_critic_loss_skips_each_critic_step_and_the_actor_step(tiny_moe_dir):
    cfg = _config("sao")  # K = 2 critic steps
    actor, critic = _models(tiny_moe_dir, cfg)
    trainer = build_trainer(FACTORIES["trainer"](cfg), actor, critic)
    trainer.train_step(_batch(actor), policy_version=1)
    before = _snapshot(trainer)

    metrics = trainer.train_step(_batch(actor, HUGE, seed=1), policy_version=2)
    assert metrics["critic/value_loss"] == math.inf  # the squared error overflowed
    assert metrics["critic/skipped_steps"] == 2.0 and trainer.critic_steps == 2  # both steps of batch 2
    assert metrics["trainer/skipped_steps"] == 1.0 and metrics["trainer/actor_updated"] == 0.0
    assert _same(_snapshot(trainer), before)
    assert all(p.grad is None for p in trainer.critic_params + trainer.actor_params)
    assert trainer.critic_sched.last_epoch == 2


def test_more_than_max_consecutive_skips_raise_training_diverged_and_the_counts_survive_resume(
    tiny_moe_dir,
):
    cfg = _config("running_mean_8", "trainer.max_consecutive_skips=2")
    actor, _ = _models(tiny_moe_dir, cfg)
    trainer = build_trainer(FACTORIES["trainer"](cfg), actor, None)
    bad = _batch(actor, HUGE)
    for _ in range(2):
        trainer.train_step(bad, policy_version=0)
    trainer.train_step(_batch(actor), policy_version=0)  # an applied step ends the run of skips
    for _ in range(3):  # the third in a row exceeds the limit; the step itself returns as any other
        metrics = trainer.train_step(bad, policy_version=0)
    assert metrics["trainer/consecutive_skips"] == 3.0 and metrics["trainer/skipped_steps"] == 5.0
    before = _snapshot(trainer)
    with pytest.raises(TrainingDiverged, match=r"3 consecutive .*trainer\.max_consecutive_skips=2") as err:
        trainer.train_step(_batch(actor, seed=1), policy_version=0)  # even a good batch: the run stops
    assert (err.value.skips, err.value.limit) == (3, 2)
    assert (trainer.step, trainer.actor_steps, trainer.skipped_steps) == (6, 1, 5)  # the raise changed
    assert _same(_snapshot(trainer), before)  # nothing

    saved = copy.deepcopy(trainer.state_dict())
    actor2, _ = _models(tiny_moe_dir, cfg)
    actor2.load_state_dict(actor.state_dict())
    resumed = build_trainer(FACTORIES["trainer"](cfg), actor2, None)
    resumed.load_state_dict(saved)
    assert (resumed.step, resumed.skipped_steps, resumed.consecutive_skips) == (6, 5, 3)
    with pytest.raises(TrainingDiverged, match="3 consecutive"):  # a resumed run stops alike
        resumed.train_step(_batch(actor2, seed=1), policy_version=0)
