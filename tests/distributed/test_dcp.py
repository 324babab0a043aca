"""Sharded checkpoints (`sao.train.dcp`): written by 2 FSDP ranks after step 1 of the ``sao`` scenario
(``conftest.fsdp_runs``), resumed on 2 ranks, loaded into one plain process, read as HF directories."""

from __future__ import annotations

import json

import pytest
import torch
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

from sao.models.critic import load_critic
from sao.models.loading import load_policy
from sao.train.dcp import has_sharded, load_plain, saved_entries

from . import fsdp_scenarios as scenarios


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _assert_same_optimizer_state(got: dict, want: dict) -> None:
    assert got["param_groups"] == want["param_groups"]
    assert got["state"].keys() == want["state"].keys()
    for name, moments in want["state"].items():
        assert moments.keys() == got["state"][name].keys(), name
        for key, value in moments.items():
            assert torch.equal(torch.as_tensor(got["state"][name][key]), torch.as_tensor(value)), (name, key)


@pytest.mark.parametrize("preset", ["sao", "sao_warmup"])
def test_resume_on_two_ranks_redoes_the_next_step_exactly(preset, fsdp_runs):
    run = fsdp_runs.ranks[preset]
    never_stopped, resumed = run["steps"][1], run["resumed"]
    assert _equal(resumed["actor"], never_stopped["actor"])
    assert _equal(resumed["critic"], never_stopped["critic"])
    assert resumed["metrics"] == never_stopped["metrics"]
    assert resumed["state"] == never_stopped["state"]
    assert not _equal(never_stopped["actor"], run["steps"][0]["actor"])  # step 2 changed the weights


def test_checkpoint_holds_hf_directories_of_the_full_weights(fsdp_runs):
    ckpt, after_1 = scenarios.checkpoint_dir(fsdp_runs.work, "sao"), fsdp_runs.ranks["sao"]["steps"][0]
    assert has_sharded(ckpt) and not has_sharded(fsdp_runs.work)
    actor_cfg = json.loads((ckpt / "actor" / "config.json").read_text())
    critic_cfg = json.loads((ckpt / "critic" / "config.json").read_text())
    assert actor_cfg["architectures"] == ["Qwen3MoeForCausalLM"]
    assert critic_cfg["architectures"] == ["Qwen3MoeForTokenClassification"]
    dtype = scenarios.DTYPE
    actor = load_policy(ckpt / "actor", dtype=dtype, device="cpu")
    critic = load_critic(ckpt / "critic", freeze="none", dtype=dtype, device="cpu")  # the head as saved
    assert _equal(scenarios.cpu_state(actor), after_1["actor"])
    assert _equal(scenarios.cpu_state(critic), after_1["critic"])


def test_one_plain_process_loads_weights_and_optimizers_exactly_and_trains_on(fsdp_runs):
    ckpt, run = scenarios.checkpoint_dir(fsdp_runs.work, "sao"), fsdp_runs.ranks["sao"]
    trainer = scenarios.plain_trainer(fsdp_runs.model_dir, "sao")
    fresh = scenarios.cpu_state(trainer.actor)
    load_plain(ckpt, trainer.actor, trainer.critic, trainer.actor_optim, trainer.critic_optim)
    assert _equal(scenarios.cpu_state(trainer.actor), run["steps"][0]["actor"])
    assert _equal(scenarios.cpu_state(trainer.critic), run["steps"][0]["critic"])
    assert not _equal(fresh, run["steps"][0]["actor"])
    for name, model, optim in (("actor", trainer.actor, trainer.actor_optim),
                               ("critic", trainer.critic, trainer.critic_optim)):  # fmt: skip
        _assert_same_optimizer_state(
            get_optimizer_state_dict(model, optim), run["saved_optim"][f"{name}_optim"]
        )
    trainer.load_state_dict(run["steps"][0]["state"])
    batch = scenarios.batches_for("sao", fsdp_runs.batches)[1]
    trainer.train_step(batch, policy_version=2)
    want = run["steps"][1]
    for name, model in (("actor", trainer.actor), ("critic", trainer.critic)):
        got = scenarios.cpu_state(model)
        assert max(float((got[k] - want[name][k]).abs().max()) for k in got) < 1e-10, name


def test_an_optimizer_that_never_stepped_is_saved_without_state(fsdp_runs):
    """Critic warm-up: at the save the actor's optimizer has no state. None is written (DCP would make one
    by a zero-gradient step, which AdamW counts), so one process resuming it takes the actor's first step
    as the uninterrupted ranks did."""
    ckpt, run = scenarios.checkpoint_dir(fsdp_runs.work, "sao_warmup"), fsdp_runs.ranks["sao_warmup"]
    assert saved_entries(ckpt) == {"actor", "critic", "critic_optim"}
    trainer = scenarios.plain_trainer(fsdp_runs.model_dir, "sao_warmup")
    load_plain(ckpt, trainer.actor, trainer.critic, trainer.actor_optim, trainer.critic_optim)
    assert not trainer.actor_optim.state and trainer.critic_optim.state
    trainer.load_state_dict(run["steps"][0]["state"])
    metrics = trainer.train_step(scenarios.batches_for("sao_warmup", fsdp_runs.batches)[1], policy_version=2)
    assert metrics["trainer/actor_updated"] == 1.0
    got, want = scenarios.cpu_state(trainer.actor), run["steps"][1]["actor"]
    assert max(float((got[k] - want[k]).abs().max()) for k in got) < 1e-10


def test_load_refuses_a_directory_without_shards(fsdp_runs, tmp_path):
    trainer = scenarios.plain_trainer(fsdp_runs.model_dir, "sao")
    with pytest.raises(FileNotFoundError, match="no DCP checkpoint"):
        load_plain(tmp_path, trainer.actor, trainer.critic)
