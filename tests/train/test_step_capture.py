"""`Trainer.train_step(capture=True)`: the kept per-token numbers are the trainer's own, for every preset.

Each test recomputes what the inspector keeps from the stored inputs with the public algorithm functions
(the config's estimator's `advantages`, `dis_band_state`, `ppo_clip_state`) and compares."""

from __future__ import annotations

import math

import pytest
import torch

from sao.algos import AdvantageInputs, dis_band_state, ppo_clip_state
from sao.inspector.html import render_html
from sao.inspector.records import train_records
from sao.presets import PRESETS
from sao.runtime.build import FACTORIES, build_trainer
from sao.types import Batch, Trajectory

from .test_step import _config, _models, _on_policy_batch, _trajectories


def _step(preset: str, tiny_moe_dir, off_band: bool = False, capture: bool = True):
    """One step of ``preset`` on four two-turn trajectories; ``off_band``: every second action token's
    rollout log-prob 0.5 above the actor's (ratio e^-0.5 ≈ 0.61: below DIS's band), the others on-policy."""
    torch.manual_seed(0)
    cfg = _config(preset)
    actor, critic = _models(tiny_moe_dir, cfg)
    trainer = build_trainer(FACTORIES["trainer"](cfg), actor, critic)
    batch = _on_policy_batch(actor, _trajectories())
    rollout = batch.rollout_logprobs.clone()
    if off_band:
        action = batch.action_mask.nonzero().squeeze(-1)
        rollout[action[::2]] = (rollout[action[::2]] + 0.5).clamp(max=0.0)
    cu = batch.cu_seqlens.tolist()
    trajs = [Trajectory(**{**t.__dict__, "rollout_logprobs": rollout[cu[i]:cu[i + 1]].tolist()})
             for i, t in enumerate(_trajectories())]  # fmt: skip
    batch = Batch.from_trajectories(trajs)
    metrics = trainer.train_step(batch, policy_version=3, capture=capture)
    return cfg, trainer, batch, trajs, metrics


def _record_inputs(record: dict, cfg) -> AdvantageInputs:
    """One kept trajectory's stored inputs as the estimators take them."""
    tk = record["tokens"]
    n = len(tk["id"])
    return AdvantageInputs(
        token_rewards=torch.tensor(tk["token_reward"], dtype=torch.float32),
        action_mask=torch.tensor([r == "a" for r in tk["role"]]),
        cu_seqlens=torch.tensor([0, n], dtype=torch.int32),
        values=torch.tensor([v if v is not None else 0.0 for v in tk["value_after"]]) if "value_after" in tk
        else None,
        outcome_rewards=torch.tensor([record["reward"]]),
        prompt_ids=[record["prompt_id"]],
        group_ids=[record["group_id"]],
        turn_ids=torch.tensor(tk["turn"]),
        truncated=torch.tensor([record["truncated"]]),
    )  # fmt: skip


def _one_preset_per_estimator_and_loss() -> list[str]:
    """The presets differ, for what the trainer keeps, only by (advantage estimator, policy loss)."""
    from sao.config import load_config

    seen: dict[tuple[str, str], str] = {}
    for name in sorted(PRESETS):
        algo = load_config(overrides=[f"algo={name}", "model.tiny_arch=qwen3_moe"]).algo
        seen.setdefault((algo.advantage.type, algo.loss.type), name)
    return sorted(seen.values())


@pytest.mark.parametrize("preset", _one_preset_per_estimator_and_loss())
def test_every_preset_keeps_the_numbers_it_trained_with(preset, tiny_moe_dir, tiny_tokenizer):
    cfg, trainer, batch, trajs, metrics = _step(preset, tiny_moe_dir, off_band=True)
    capture = trainer.last_capture
    assert capture is not None and capture.step == 1 and capture.policy_version == 3 and capture.actor_updated
    records = train_records(batch, capture, trajs, range(batch.num_sequences), tiny_tokenizer)
    assert [r["traj_id"] for r in records] == batch.traj_ids
    algo = cfg.algo
    for rec in records:
        tk = rec["tokens"]
        action = [r == "a" for r in tk["role"]]
        assert tk["role"] == "ppppp" + "aaaaa" + "oooo" + "aaaaa"
        assert rec["lag_max"] == 3 - min(v for v, a in zip(tk["version"], action, strict=True) if a)
        # the loss's mask, from the stored log-probs (DIS: to the rollout's; PPO-clip: to pi_old)
        lp = torch.tensor([x if x is not None else 0.0 for x in tk["logprob"]])
        if algo.loss.type == "dis":
            ref = torch.tensor([x if x is not None else 0.0 for x in tk["rollout_logprob"]])
            state = dis_band_state(lp, ref, algo.loss.eps_low, algo.loss.eps_high)
        else:
            ref = lp - torch.log(torch.tensor([r if r is not None else 1.0 for r in tk["ratio"]]))
            adv = torch.tensor(tk["advantage"])
            state = ppo_clip_state(lp, ref, adv, algo.loss.eps_low, algo.loss.eps_high)
        kept_state = [s for s in tk["state"] if s is not None]
        assert kept_state == [int(s) for s, a in zip(state, action, strict=True) if a]
        assert rec["masked_frac"] == pytest.approx(sum(s != 0 for s in kept_state) / len(kept_state))
        # the advantages, from the stored rewards and values (state-free estimators: one trajectory alone)
        if algo.advantage.type in ("skip_observation_gae", "token_gae", "step_gae"):
            result = algo.advantage.build().advantages(_record_inputs(rec, cfg))
            assert tk["advantage"] == pytest.approx(result.advantages.tolist(), rel=1e-4, abs=1e-5)
            assert "value_before" in tk and "return" in tk and "value_mask" in tk
        else:
            assert "value_after" not in tk  # critic-free: no values kept
    # the batch's DIS masked fraction is the kept states' (every trajectory was kept)
    if algo.loss.type == "dis":
        assert 0.3 < metrics["dis/masked_frac"] < 0.7  # the off-band half
        n_masked = sum(s != 0 for r in records for s in r["tokens"]["state"] if s is not None)
        n_action = sum(r["action_tokens"] for r in records)
        assert metrics["dis/masked_frac"] == pytest.approx(n_masked / n_action, abs=1e-6)
    assert "<script" in render_html({"title": preset, "meta": {}, "trajectories": records})


def test_grpo_records_carry_the_group_and_its_rewards(tiny_moe_dir, tiny_tokenizer):
    _, trainer, batch, trajs, _ = _step("grpo_dis", tiny_moe_dir)
    records = train_records(batch, trainer.last_capture, trajs, [0, 3], tiny_tokenizer)
    for rec in records:
        group = rec["group"]
        members = [t for t in trajs if t.group_id == rec["group_id"]]
        assert [m["traj_id"] for m in group] == [t.traj_id for t in members]
        rewards = [t.outcome_reward for t in members]
        assert [m["reward"] for m in group] == rewards
        # GRPO's advantage of this trajectory from its group's rewards: (r - mean) / std
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
        expected = (rec["reward"] - mean) / (std + 1e-6)
        adv = {a for a, r in zip(rec["tokens"]["advantage"], rec["tokens"]["role"], strict=True) if r == "a"}
        assert len(adv) == 1 and adv.pop() == pytest.approx(expected, rel=1e-4)


def test_step_wise_gae_keeps_one_advantage_per_turn(tiny_moe_dir, tiny_tokenizer):
    _, trainer, batch, trajs, _ = _step("step_average", tiny_moe_dir)
    (rec,) = train_records(batch, trainer.last_capture, trajs, [1], tiny_tokenizer)
    tk = rec["tokens"]
    per_turn: dict[int, set[float]] = {}
    for a, role, turn in zip(tk["advantage"], tk["role"], tk["turn"], strict=True):
        if role == "a":
            per_turn.setdefault(turn, set()).add(a)
    assert sorted(per_turn) == [0, 1] and all(len(v) == 1 for v in per_turn.values())


def test_without_capture_nothing_is_kept_and_the_step_is_the_same(tiny_moe_dir):
    *_, with_capture = _step("sao", tiny_moe_dir, capture=True)
    _, trainer, *_, without = _step("sao", tiny_moe_dir, capture=False)
    assert trainer.last_capture is None
    assert with_capture == without


def test_a_critic_warm_up_step_keeps_values_but_no_actor_numbers(tiny_moe_dir, tiny_tokenizer):
    torch.manual_seed(0)
    cfg = _config("sao", "critic.warmup_steps=1")
    actor, critic = _models(tiny_moe_dir, cfg)
    trainer = build_trainer(FACTORIES["trainer"](cfg), actor, critic)
    trajs = _trajectories()
    batch = _on_policy_batch(actor, trajs)
    trainer.train_step(batch, policy_version=0, capture=True)
    capture = trainer.last_capture
    assert not capture.actor_updated and capture.advantages is None and capture.values_before is not None
    (rec,) = train_records(batch, capture, trajs, [0], tiny_tokenizer)
    assert "advantage" not in rec["tokens"] and "value_before" in rec["tokens"] and rec["masked_frac"] is None
