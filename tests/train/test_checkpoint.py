"""Checkpoints: exact resume (invariant 6 of docs/concepts.md), atomic writes, pruning, robust discovery,
clear errors."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from sao.algos.baselines import RunningMeanBaseline, SPOTracker
from sao.models.critic import load_critic
from sao.models.loading import load_policy
from sao.train.checkpoint import CheckpointManager, restore_rng
from sao.train.checkpoint_load import CheckpointError
from sao.train.step_schedule import actor_lr_factor


class _FakeModel:
    """Stands in for an HF model where only the directory layout matters."""

    def save_pretrained(self, path) -> None:
        path.mkdir(parents=True)
        (path / "config.json").write_text("{}")


def _save(manager, step, **kwargs):
    return manager.save(step, actor=_FakeModel(), trainer_state={"step": step}, **kwargs)


def _trainable(*models):
    return [p for m in models for p in m.parameters() if p.requires_grad]


def _train_step(actor, critic, optimizer, baseline, tracker):
    """One step that draws from every RNG: random token ids, python/numpy rewards, dropout if any."""
    ids = torch.randint(5, 60, (2, 12))
    rewards = torch.tensor([random.random(), float(np.random.rand())])
    adv = baseline.advantages(["a", "b"], rewards)
    tracker.advantages(["a", "b"], (rewards > 0.5).float())
    logits = actor(input_ids=ids).logits
    values = critic(ids)
    loss = -(logits.log_softmax(-1)[..., 0].mean() * adv.mean()) + values.pow(2).mean() + logits.pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def _seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def _fresh_rngs():
    return random.random(), float(np.random.rand()), torch.rand(4)


def test_resume_continues_bit_identically_to_an_uninterrupted_run(tiny_moe_dir, tmp_path):
    _seed_all(0)
    actor = load_policy(tiny_moe_dir, dtype="float32", device="cpu")
    critic = load_critic(tiny_moe_dir, dtype="float32", device="cpu", head_init="normal")
    optimizer = torch.optim.AdamW(_trainable(actor, critic), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, actor_lr_factor("cosine", 3, 10, floor=0.1))
    baseline, tracker = RunningMeanBaseline(window=4), SPOTracker()
    _train_step(actor, critic, optimizer, baseline, tracker)
    scheduler.step()

    manager = CheckpointManager(tmp_path / "run")
    position = {"cursor": 7, "epoch": 1, "seed": 0}
    counters = {"produced": 10, "trained": 8, "dropped": {"stale": 2}}
    manager.save(
        1,
        actor=actor,
        critic=critic,
        trainer_state={
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "baseline": baseline.state_dict(),
            "spo": tracker.state_dict(),
        },
        policy_version=1,
        data_position=position,
        counters=counters,
        config={"algo": "grpo_dis", "lr": 1e-2},
    )
    # the uninterrupted run goes on
    expected_rngs = _fresh_rngs()
    _train_step(actor, critic, optimizer, baseline, tracker)
    scheduler.step()
    expected_params = [p.detach().clone() for p in _trainable(actor, critic)]

    # a new process: scramble the RNGs, rebuild everything from the checkpoint
    _seed_all(123)
    ckpt = CheckpointManager(tmp_path / "run").load()
    assert ckpt is not None and ckpt.step == 1 and ckpt.policy_version == 1
    assert ckpt.data_position == position and ckpt.counters == counters
    assert ckpt.meta["config"]["algo"] == "grpo_dis" and ckpt.meta["sao_version"]
    assert (ckpt.actor_dir / "model.safetensors").is_file()
    actor2 = load_policy(ckpt.actor_dir, dtype="float32", device="cpu")
    critic2 = load_critic(ckpt.critic_dir, dtype="float32", device="cpu")
    optimizer2 = torch.optim.AdamW(_trainable(actor2, critic2), lr=1e-2)
    # build the scheduler before loading the optimizer state: its constructor rewrites the group lrs
    scheduler2 = torch.optim.lr_scheduler.LambdaLR(optimizer2, actor_lr_factor("cosine", 3, 10, floor=0.1))
    optimizer2.load_state_dict(ckpt.trainer_state["optimizer"])
    scheduler2.load_state_dict(ckpt.trainer_state["scheduler"])
    baseline2, tracker2 = RunningMeanBaseline(window=4), SPOTracker()
    baseline2.load_state_dict(ckpt.trainer_state["baseline"])
    tracker2.load_state_dict(ckpt.trainer_state["spo"])
    restore_rng(ckpt.rng)

    got_rngs = _fresh_rngs()
    assert got_rngs[:2] == expected_rngs[:2] and torch.equal(got_rngs[2], expected_rngs[2])
    _train_step(actor2, critic2, optimizer2, baseline2, tracker2)
    scheduler2.step()
    got_params = [p.detach() for p in _trainable(actor2, critic2)]
    assert len(got_params) == len(expected_params)
    assert all(torch.equal(g, e) for g, e in zip(got_params, expected_params, strict=True))
    assert scheduler2.state_dict() == scheduler.state_dict()
    assert baseline2.state_dict() == baseline.state_dict()
    assert tracker2.state_dict() == tracker.state_dict()


def test_keeps_only_the_last_n_checkpoints_and_points_latest_at_the_newest(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2)
    for step in (1, 2, 3, 4):
        written = _save(manager, step)
        assert written.name == f"step_{step:08d}"
    assert [p.name for p in manager.checkpoints()] == ["step_00000003", "step_00000004"]
    assert manager.latest() == written
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step_00000004"
    assert manager.load().trainer_state == {"step": 4}


def test_pruning_never_deletes_the_checkpoint_just_written(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=1)
    _save(manager, 10)
    older = _save(manager, 5)  # e.g. a resumed run re-saving an earlier step
    assert older.is_dir() and manager.latest() == older


def test_a_failed_save_leaves_no_partial_checkpoint_and_latest_unchanged(tmp_path, monkeypatch):
    manager = CheckpointManager(tmp_path)
    first = _save(manager, 1)
    real_save = torch.save

    def failing_save(obj, f, *args, **kwargs):
        if str(f).endswith("rng.pt"):
            raise OSError("disk full")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        _save(manager, 2)
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_00000001"]
    assert manager.latest() == first
    assert manager.load().step == 1


def test_latest_ignores_staging_dirs_and_falls_back_to_scanning_when_the_pointer_is_stale(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=5)
    assert manager.latest() is None
    with pytest.raises(CheckpointError, match="no checkpoint under"):
        manager.load()
    _save(manager, 1)
    second = _save(manager, 2)
    root = tmp_path / "checkpoints"
    (root / ".step_00000003.tmp-crashed").mkdir()  # a save killed mid-way
    (root / ".step_00000003.tmp-crashed" / "meta.json").write_text("{}")
    (root / "latest").write_text("step_00000009\n")  # names a checkpoint that is gone
    assert manager.latest() == second
    (root / "latest").unlink()
    assert manager.latest() == second
    _save(manager, 3)  # the next save cleans up the crashed one's leftovers
    assert not list(root.glob(".step_*"))


def test_corrupt_or_missing_files_raise_an_error_naming_the_file(tmp_path):
    manager = CheckpointManager(tmp_path)
    path = _save(manager, 1)
    (path / "meta.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"meta\.json"):
        manager.load(path)
    (path / "meta.json").write_text(json.dumps({"step": 1}))
    (path / "trainer_state.pt").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match=r"corrupt .*trainer_state\.pt"):
        manager.load(path)
    (path / "rng.pt").unlink()
    (path / "trainer_state.pt").unlink()
    with pytest.raises(CheckpointError, match=r"trainer_state\.pt.* is missing"):
        manager.load(path)
    with pytest.raises(CheckpointError, match="does not exist"):
        manager.load(tmp_path / "nowhere")


def test_meta_that_is_not_json_serialisable_fails_before_writing(tmp_path):
    manager = CheckpointManager(tmp_path)
    with pytest.raises(TypeError, match="JSON"):
        _save(manager, 1, config={"bad": object()})
    assert manager.latest() is None and not list((tmp_path).rglob("step_*"))


def test_clean_partial_removes_every_kind_of_leftover_and_only_those(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=5)
    _save(manager, 1)
    root = tmp_path / "checkpoints"
    leftovers = [".step_00000002.tmp-a1", ".step_00000001.old-b2", ".step_00000000.del-1-2"]
    for name in leftovers:  # a save, a replacement and a prune, each killed mid-way
        (root / name / "actor").mkdir(parents=True)
    (root / ".latest.tmp-c3").write_text("step_00000002\n")  # a pointer update killed mid-way
    assert manager.latest() == root / "step_00000001"  # readers never see them
    removed = manager.clean_partial()
    assert sorted(p.name for p in removed) == sorted([*leftovers, ".latest.tmp-c3"])
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_00000001"]
    assert manager.load().step == 1 and manager.clean_partial() == []
