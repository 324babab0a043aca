"""π_old for ``ppo_clip`` presets: the training forward's log-probs, detached, instead of a second forward.

The trainer takes one actor step per batch, so π_old has the weights the training forward runs with; with a
deterministic forward the detached log-probs are the no-grad forward's numbers and the update is bitwise
the same (sao.train.step, module docstring)."""

from __future__ import annotations

import pytest
import torch

from sao.models.forward import stochastic_forward
from sao.runtime.build import FACTORIES, build_trainer
from sao.train.step import Trainer

from .test_step import _config, _models, _on_policy_batch, _trajectories


def _run(tiny_moe_dir, preset: str, old_logprobs: str, steps: int = 2):
    """Train ``steps`` steps on fixed batches; returns (trainer, per-step metrics, actor state)."""
    cfg = _config(preset)
    torch.manual_seed(0)
    actor, critic = _models(tiny_moe_dir, cfg)
    trainer = Trainer(actor, critic, FACTORIES["trainer"](cfg), old_logprobs=old_logprobs)
    metrics = []
    for step in range(steps):
        batch = _on_policy_batch(actor, _trajectories(seed=step), shift=0.3)
        metrics.append(trainer.train_step(batch, policy_version=step, capture=True))
    return trainer, metrics, {k: v.clone() for k, v in actor.state_dict().items()}


@pytest.mark.parametrize("preset", ["grpo", "vapo"])
def test_detached_reference_gives_the_bitwise_update_of_the_old_logprob_forward(preset, tiny_moe_dir):
    forward, m_forward, w_forward = _run(tiny_moe_dir, preset, "forward")
    detached, m_detached, w_detached = _run(tiny_moe_dir, preset, "auto")
    assert forward.old_logprob_forwards == 2 and detached.old_logprob_forwards == 0
    assert [m["actor/old_logprob_forward"] for m in m_detached] == [0.0, 0.0]
    assert [m["actor/old_logprob_forward"] for m in m_forward] == [1.0, 1.0]
    for name, value in w_forward.items():
        assert torch.equal(value, w_detached[name]), name
    for a, b in zip(m_forward, m_detached, strict=True):
        for key in ("actor/loss", "actor/grad_norm", "ppo/clip_frac", "ppo/ratio_mean", "ppo/approx_kl"):
            assert a[key] == b[key], key
    cf, cd = forward.last_capture, detached.last_capture
    assert cf is not None and cd is not None
    assert torch.equal(cf.reference, cd.reference) and torch.equal(cf.logprobs, cd.logprobs)
    assert torch.equal(cd.reference, cd.logprobs)  # π_old = the pre-update policy


def test_a_stochastic_forward_keeps_the_old_logprob_forward(tiny_moe_dir):
    cfg = _config("grpo")
    actor, critic = _models(tiny_moe_dir, cfg)
    assert not stochastic_forward(actor)
    actor.config.attention_dropout = 0.1  # HF attention applies it while training
    assert not stochastic_forward(actor.eval())  # from_pretrained's mode: no dropout
    actor.train()
    assert stochastic_forward(actor)
    assert build_trainer(FACTORIES["trainer"](cfg), actor, critic).old_logprob_forward
    actor.config.attention_dropout = 0.0
    actor.add_module("drop", torch.nn.Dropout(0.2))
    assert stochastic_forward(actor)


def test_dis_presets_never_run_the_old_logprob_forward(tiny_moe_dir):
    trainer, metrics, _ = _run(tiny_moe_dir, "grpo_dis", "auto", 1)
    assert not trainer.old_logprob_forward and metrics[0]["actor/old_logprob_forward"] == 0.0
