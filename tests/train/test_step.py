"""The RL training step on the tiny MoE model (fp32, CPU) with hand-built two-turn trajectories."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from sao.config import load_config
from sao.models.attention import PACKED_ATTENTION
from sao.models.critic import load_critic
from sao.models.forward import token_logprobs
from sao.models.loading import load_policy
from sao.presets import PRESETS
from sao.runtime.build import FACTORIES, build_trainer
from sao.train.step_schedule import actor_lr_factor, critic_lr_factor
from sao.types import Batch, Trajectory

GROUP_PRESETS = {"grpo", "grpo_dis", "vapo"}


def _config(preset: str, *extra: str):
    overrides = [
        f"algo={preset}",
        "model.tiny_arch=qwen3_moe",
        "model.dtype=float32",
        "model.device=cpu",
        "trainer.lr=1e-2",
        "critic.lr=1e-2",
        "trainer.batch_size=4",
        "trainer.micro_batch_tokens=40",  # two micro-batches of two trajectories
    ]
    if preset in GROUP_PRESETS:
        overrides.append("algo.group_size=2")
    return load_config(overrides=[*overrides, *extra])


def _models(model_dir, cfg):
    actor = load_policy(model_dir, dtype="float32", device="cpu", attn_implementation=PACKED_ATTENTION)
    critic = None
    if cfg.algo.uses_critic:
        torch.manual_seed(0)  # the value head is drawn at random
        critic = load_critic(
            model_dir, freeze=cfg.critic.freeze, dtype="float32", device="cpu", head_init="normal"
        )
    return actor, critic


def _trajectories(n: int = 4, seed: int = 0) -> list[Trajectory]:
    """prompt(5) + action(5, turn 0) + observation(4, turn 0) + action(5, turn 1) = 19 tokens each."""
    gen = torch.Generator().manual_seed(seed)
    trajs = []
    for i in range(n):
        ids = torch.randint(3, 250, (19,), generator=gen).tolist()
        action = [0] * 5 + [1] * 5 + [0] * 4 + [1] * 5
        turns = [-1] * 5 + [0] * 9 + [1] * 5
        versions = [(0 if i % 2 else 1) if a else -1 for a in action]
        trajs.append(
            Trajectory(
                prompt_id=f"p{i // 2}",
                token_ids=ids,
                action_mask=action,
                rollout_logprobs=[0.0] * 19,
                versions=versions,
                turn_ids=turns,
                rewards=[float(i % 2 == 0)],
                group_id=f"g{i // 2}",
                traj_id=f"t{i}",
            )
        )
    return trajs


def _on_policy_batch(actor, trajs: list[Trajectory], shift: float = 0.0) -> Batch:
    """A batch whose rollout log-probs are the actor's own (+ ``shift`` on action tokens)."""
    with torch.no_grad():
        lp, _ = token_logprobs(actor, Batch.from_trajectories(trajs))
    out, start = [], 0
    for t in trajs:
        n = t.num_tokens
        rollout = [
            float(x) + shift if a else 0.0 for x, a in zip(lp[start : start + n], t.action_mask, strict=True)
        ]
        out.append(Trajectory(**{**t.__dict__, "rollout_logprobs": [min(r, 0.0) for r in rollout]}))
        start += n
    return Batch.from_trajectories(out)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_runs_two_steps_with_finite_metrics(preset, tiny_moe_dir):
    torch.manual_seed(0)
    cfg = _config(preset)
    actor, critic = _models(tiny_moe_dir, cfg)
    trainer = build_trainer(FACTORIES["trainer"](cfg), actor, critic)
    trajs = _trajectories()
    for step in range(2):
        metrics = trainer.train_step(_on_policy_batch(actor, trajs), policy_version=step + 1)
        bad = {k: v for k, v in metrics.items() if not math.isfinite(v) and k != "critic/explained_variance"}
        assert not bad, f"{preset}: non-finite metrics {bad}"
    assert metrics["trainer/actor_updated"] == 1.0
    assert metrics["batch/turns_mean"] == 2.0
    assert metrics["batch/action_tokens_mean"] == 10.0
    assert metrics["batch/response_tokens_mean"] == 14.0
    assert metrics["lag/token_max"] == 2.0 and metrics["lag/token_mean"] == 1.5
    # half the tokens 1, half 2 versions behind
    assert metrics["lag/token_p50"] == 1.5 and metrics["lag/token_p90"] == 2.0
    assert "actor/entropy" in metrics and metrics["actor/entropy"] > 0
    family = "dis" if cfg.algo.loss.type == "dis" else "ppo"
    assert any(k.startswith(f"{family}/") for k in metrics)
    assert ("critic/grad_norm" in metrics) == cfg.algo.uses_critic
    if cfg.algo.uses_critic:  # the attention part of the critic's gradient: none when attention is frozen
        attention = metrics["critic/grad_norm_attention"]
        if cfg.critic.freeze == "attention":
            assert attention == 0.0
        else:
            assert 0.0 < attention <= metrics["critic/grad_norm_max"] + 1e-6


def test_k_critic_steps_run_k_optimizer_steps(tiny_moe_dir):
    cfg = _config("sao")
    assert cfg.algo.k_critic == 2
    actor, critic = _models(tiny_moe_dir, cfg)
    trainer = build_trainer(FACTORIES["trainer"](cfg), actor, critic)
    calls = {"critic": 0, "actor": 0}
    trainer.critic_optim.register_step_post_hook(lambda *_: calls.__setitem__("critic", calls["critic"] + 1))
    trainer.actor_optim.register_step_post_hook(lambda *_: calls.__setitem__("actor", calls["actor"] + 1))
    trainer.train_step(_on_policy_batch(actor, _trajectories()), policy_version=1)
    assert calls == {"critic": 2, "actor": 1}
    assert trainer.critic_steps == 2


def test_frozen_attention_critic_trains_only_mlp_and_head(tiny_moe_dir):
    cfg = _config("sao")
    actor, critic = _models(tiny_moe_dir, cfg)
    before = {n: p.detach().clone() for n, p in critic.named_parameters()}
    build_trainer(FACTORIES["trainer"](cfg), actor, critic).train_step(
        _on_policy_batch(actor, _trajectories()), policy_version=1
    )
    after = dict(critic.named_parameters())
    attention = [n for n in before if ".self_attn." in n]
    trained = [n for n in before if ".mlp." in n or n.startswith("model.score")]
    assert attention and trained
    assert all(torch.equal(before[n], after[n]) for n in attention)
    assert any(not torch.equal(before[n], after[n]) for n in trained if ".mlp." in n)
    assert any(not torch.equal(before[n], after[n]) for n in trained if n.startswith("model.score"))


def test_critic_warmup_steps_leave_the_actor_unchanged(tiny_moe_dir):
    cfg = _config("sao_k1", "critic.warmup_steps=1", "critic.value_clip=0.2")
    actor, critic = _models(tiny_moe_dir, cfg)
    trainer = build_trainer(FACTORIES["trainer"](cfg), actor, critic)
    before = copy.deepcopy(actor.state_dict())
    batch = _on_policy_batch(actor, _trajectories())
    metrics = trainer.train_step(batch, policy_version=1)
    assert metrics["trainer/actor_updated"] == 0.0 and metrics["trainer/trained_tokens"] == 0.0
    assert all(torch.equal(before[k], v) for k, v in actor.state_dict().items())
    assert trainer.critic_steps == 1
    metrics = trainer.train_step(batch, policy_version=1)
    assert metrics["trainer/actor_updated"] == 1.0
    assert any(not torch.equal(before[k], v) for k, v in actor.state_dict().items())


def test_dis_masked_fraction_is_zero_on_policy_and_positive_off_band(tiny_moe_dir):
    cfg = _config("grpo_dis")
    actor, _ = _models(tiny_moe_dir, cfg)
    trajs = _trajectories()
    on = build_trainer(FACTORIES["trainer"](cfg), actor, None).train_step(
        _on_policy_batch(actor, trajs), policy_version=1
    )
    assert on["dis/masked_frac"] == 0.0
    actor2, _ = _models(tiny_moe_dir, cfg)
    # rollout log-prob 2 nats above the actor's: ratio e^-2 ≈ 0.14 < 0.7, below the band
    off = build_trainer(FACTORIES["trainer"](cfg), actor2, None).train_step(
        _on_policy_batch(actor2, trajs, shift=2.0), policy_version=1
    )
    assert off["dis/masked_frac"] > 0.0 and off["dis/masked_frac_below"] > 0.0


def test_spo_divergence_updates_the_tracker_once_per_prompt_sample(tiny_moe_dir):
    cfg = _config("spo")
    actor, _ = _models(tiny_moe_dir, cfg)
    trainer = build_trainer(FACTORIES["trainer"](cfg), actor, None)
    metrics = trainer.train_step(_on_policy_batch(actor, _trajectories(), shift=-0.1), policy_version=1)
    assert metrics["adv/divergence_mean"] == pytest.approx(0.1, abs=1e-4)
    # prior Beta(0.5, 0.5); prompt p0 saw rewards 1 then 0 with rho = clamp(2^(-0.1/0.06), ...) = 0.875
    a, b = trainer.adv_state._ab["p0"]
    rho = 0.875
    a_exp, b_exp = rho * 0.5 + 1.0, rho * 0.5
    assert (a, b) == pytest.approx((rho * a_exp + 0.0, rho * b_exp + 1.0), rel=1e-5)


@pytest.mark.parametrize("preset", ["sao", "running_mean_8"])
def test_state_dict_round_trip_gives_identical_next_step(preset, tiny_moe_dir):
    cfg = _config(preset, "trainer.lr_schedule=cosine", "trainer.warmup_steps=1", "trainer.total_steps=4")
    actor, critic = _models(tiny_moe_dir, cfg)
    trainer = build_trainer(FACTORIES["trainer"](cfg), actor, critic)
    trajs = _trajectories()
    trainer.train_step(_on_policy_batch(actor, trajs), policy_version=1)
    saved = copy.deepcopy(trainer.state_dict())
    weights = (copy.deepcopy(actor.state_dict()), copy.deepcopy(critic.state_dict()) if critic else None)
    batch2 = _on_policy_batch(actor, _trajectories(seed=1))
    expected = trainer.train_step(batch2, policy_version=2)

    actor2, critic2 = _models(tiny_moe_dir, cfg)
    actor2.load_state_dict(weights[0])
    if critic2 is not None:
        critic2.load_state_dict(weights[1])
    restored = build_trainer(FACTORIES["trainer"](cfg), actor2, critic2)
    restored.load_state_dict(saved)
    got = restored.train_step(batch2, policy_version=2)
    assert got.keys() == expected.keys()
    for k in expected:
        assert got[k] == pytest.approx(expected[k], rel=1e-5, abs=1e-7, nan_ok=True), k
    for (n, p), q in zip(actor.named_parameters(), actor2.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6), n


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_micro_batches_are_normalised_by_the_whole_batch(agg, tiny_moe_dir):
    results = []
    for tokens in (40, 1000):  # two micro-batches vs one
        cfg = _config("vapo", f"trainer.micro_batch_tokens={tokens}", f"algo.loss.agg={agg}")
        actor, critic = _models(tiny_moe_dir, cfg)
        results.append(
            build_trainer(FACTORIES["trainer"](cfg), actor, critic).train_step(
                _on_policy_batch(actor, _trajectories()), policy_version=1
            )
        )
    split, whole = results
    for key in (
        "actor/loss",
        "actor/grad_norm",
        "nll/loss",
        "critic/value_loss",
        "critic/grad_norm",
        "actor/entropy",
    ):
        assert split[key] == pytest.approx(whole[key], rel=1e-4), key


def test_one_micro_batch_takes_the_targets_from_the_first_critic_step_forward(tiny_moe_dir):
    """With one micro-batch the pre-update values come from critic step 1's forward: K + 1 critic forwards
    (K steps, the recompute) instead of K + 2, and the same critic, values and metrics as two
    micro-batches."""
    runs = []
    for tokens in (40, 1000):  # two micro-batches (separate no-grad forward) vs one (reused forward)
        cfg = _config("sao", f"trainer.micro_batch_tokens={tokens}", "algo.k_critic=2")
        actor, critic = _models(tiny_moe_dir, cfg)
        calls: list[bool] = []
        critic.register_forward_hook(lambda *_, calls=calls: calls.append(torch.is_grad_enabled()))
        metrics = build_trainer(FACTORIES["trainer"](cfg), actor, critic).train_step(
            _on_policy_batch(actor, _trajectories()), policy_version=1
        )
        runs.append((metrics, calls, [p.detach().clone() for p in critic.parameters()]))
    (split, split_calls, split_params), (whole, whole_calls, whole_params) = runs
    assert split_calls == [False, False, True, True, True, True, False, False]  # per part: V0, 2 steps, V
    assert whole_calls == [True, True, False]
    for key in ("critic/explained_variance", "critic/explained_variance_after", "critic/value_mean",
                "critic/value_loss", "critic/value_loss_last", "critic/grad_norm"):  # fmt: skip
        assert split[key] == pytest.approx(whole[key], rel=1e-4, abs=1e-6), key
    for a, b in zip(split_params, whole_params, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_trainer_needs_a_critic_for_gae_presets(tiny_moe_dir):
    cfg = _config("sao")
    actor, _ = _models(tiny_moe_dir, cfg)
    with pytest.raises(ValueError, match="needs a critic"):
        build_trainer(FACTORIES["trainer"](cfg), actor, None)


def test_lr_schedules_warm_up_then_decay():
    cos = actor_lr_factor("cosine", 2, 10)
    lin = actor_lr_factor("linear", 0, 4)
    assert [cos(0), cos(1), cos(2)] == [0.5, 1.0, 1.0]
    assert cos(10) == pytest.approx(0.0, abs=1e-12) and cos(6) == pytest.approx(0.5)
    assert [lin(s) for s in range(5)] == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert actor_lr_factor("constant", 0, 5)(100) == 1.0
    assert [critic_lr_factor(4)(s) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert critic_lr_factor(0)(0) == 1.0
