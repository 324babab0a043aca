"""The run drives what depends on where training stands: the style-shift schedule (async, sync, resume), and
evaluation during training on held-out task files."""

from __future__ import annotations

import json

import pytest

from sao.config import load_config
from sao.envs.style_shift import StyleSchedule
from sao.runtime import runner
from sao.runtime.runner import train_sync_entry
from sao.types import Batch

from .test_runner import _OVERRIDES

STYLE = [
    "data.env=style_shift", "data.env_kwargs={shift_every: 8}", "data.max_turns=1",
    "critic.pretrain.enabled=false", "trainer.batch_size=4", "logging.checkpoint_every=3",
]  # fmt: skip
SCHEDULE = StyleSchedule.every(8)


class _BatchSpy:
    """Stands in for `Batch` in the runner: records each trained batch's trajectories, in step order."""

    def __init__(self) -> None:
        self.batches: list[list] = []

    def from_trajectories(self, trajs):
        self.batches.append(list(trajs))
        return Batch.from_trajectories(trajs)


@pytest.fixture
def spy(monkeypatch):
    spy = _BatchSpy()
    monkeypatch.setattr(runner, "Batch", spy)
    return spy


def _check_styles(batches: list[list], first_step: int, sync: bool) -> list[tuple[int, str]]:
    """Every trajectory's preferred style is the schedule's at the trained count its episode started at."""
    seen = []
    for i, trajs in enumerate(batches):
        trained_before = 4 * (first_step + i)
        for traj in trajs:
            info = traj.metadata["infos"][-1]
            assert info["clock"] == "training"
            episode = info["episode"]
            assert episode % 4 == 0 and episode <= trained_before  # started before it was trained
            if sync:  # the barrier: generated after the previous batch trained, before the next one
                assert episode == trained_before
            assert info["style"] == SCHEDULE.style_at(episode)
            seen.append((episode, info["style"]))
    return seen


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_style_shift_switches_at_the_configured_training_points(tmp_path, spy, mode):
    cfg = load_config(None, [*_OVERRIDES, *STYLE, f"logging.run_dir={tmp_path}", "trainer.total_steps=6",
                             f"runtime.mode={mode}"])  # fmt: skip
    train_sync_entry(cfg)
    seen = _check_styles(spy.batches, 0, sync=mode == "sync")
    assert {style for _, style in seen} == {"cute", "chuunibyou", "classical"}
    assert (
        min(e for e, s in seen if s == "chuunibyou") >= 8
        and min(e for e, s in seen if s == "classical") >= 16
    )


def test_style_shift_schedule_continues_after_resume(tmp_path, spy):
    base = [*_OVERRIDES, *STYLE, f"logging.run_dir={tmp_path}"]
    train_sync_entry(load_config(None, [*base, "trainer.total_steps=3"]))
    spy.batches.clear()
    train_sync_entry(load_config(None, [*base, "trainer.total_steps=6"]), resume=True)
    seen = _check_styles(spy.batches, 3, sync=False)
    assert min(e for e, _ in seen) >= 12  # episodes of the resumed run start from the restored count
    assert "classical" in {s for _, s in seen}


def test_evaluation_during_training_is_logged_and_does_not_touch_the_books(tmp_path):
    from sao.envs import make_env_tasks, save_tasks_jsonl

    held_out = tmp_path / "held_out.jsonl"
    save_tasks_jsonl(held_out, make_env_tasks("calculator", 3, seed=99))
    run = tmp_path / "run"
    cfg = load_config(None, [*_OVERRIDES, f"logging.run_dir={run}", "critic.pretrain.enabled=false",
                             f"data.eval_file={held_out}", "logging.eval_every=2", "eval.k=2"])  # fmt: skip
    result = train_sync_entry(cfg)
    c = result.counters
    assert c["trained"] == 12 and c["started"] == c["trained"] + c["dropped"] + c["pending"]
    assert c["produced"] <= c["started"]  # eval episodes are neither produced nor started
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    evals = {r["step"]: r for r in records if "eval/pass@1" in r}
    assert sorted(evals) == [0, 2, 3]  # the initial weights, every 2 steps, and at the end (step 3)
    for step, record in evals.items():
        assert record["eval/samples"] == 6.0 and 0.0 <= record["eval/pass@1"] <= 1.0
        assert record["eval/held_out/pass@1"] == record["eval/pass@1"]
        report = json.loads((run / "eval" / f"step_{step:08d}.json").read_text())
        assert report["step"] == step and report["overall"]["samples"] == 6
    # eval.engine auto = frozen here: every evaluation on its step's weights alone, in an engine of its own
    for step, record in evals.items():
        assert record["eval/policy_version_start"] == record["eval/policy_version_end"] == float(step)
        assert record["eval/wall_s"] > 0


def test_a_missing_eval_file_fails_at_start_naming_the_key(tmp_path):
    from sao.config import ConfigError

    cfg = load_config(
        None, [*_OVERRIDES, f"logging.run_dir={tmp_path}", f"data.eval_file={tmp_path}/nope.jsonl"]
    )
    with pytest.raises(ConfigError, match=r"data\.eval_file: .*nope\.jsonl"):
        train_sync_entry(cfg)


def test_evaluations_of_a_shifting_env_see_the_progress_at_their_start(tmp_path):
    from sao.envs import make_env_tasks, save_tasks_jsonl

    held_out = tmp_path / "held_out.jsonl"
    save_tasks_jsonl(held_out, make_env_tasks("style_shift", 2, seed=5))
    run = tmp_path / "run"
    cfg = load_config(None, [*_OVERRIDES, *STYLE, f"logging.run_dir={run}", "trainer.total_steps=4",
                             f"data.eval_file={held_out}", "logging.eval_every=2", "eval.k=1"])  # fmt: skip
    train_sync_entry(cfg)
    for step, style in [(0, "cute"), (2, "chuunibyou"), (4, "classical")]:  # trained: 0, 8, 16
        report = json.loads((run / "eval" / f"step_{step:08d}.json").read_text())
        infos = [s["info"] for t in report["tasks"] for s in t["samples"]]
        assert infos and all(i["clock"] == "training" and i["style"] == style for i in infos), (step, infos)


def test_a_resumed_run_evaluates_its_checkpoint_step_when_that_evaluation_was_cut_short(tmp_path):
    from sao.envs import make_env_tasks, save_tasks_jsonl

    held_out = tmp_path / "held_out.jsonl"
    save_tasks_jsonl(held_out, make_env_tasks("calculator", 2, seed=99))
    run = tmp_path / "run"
    base = [*_OVERRIDES, f"logging.run_dir={run}", "critic.pretrain.enabled=false",
            f"data.eval_file={held_out}", "logging.eval_every=2", "logging.checkpoint_every=2",
            "eval.at_start=false", "eval.k=1"]  # fmt: skip
    train_sync_entry(load_config(None, [*base, "trainer.total_steps=2"]))
    report = run / "eval" / "step_00000002.json"
    report.unlink()  # as if the run had been killed while it evaluated step 2
    train_sync_entry(load_config(None, [*base, "trainer.total_steps=3"]), resume=True)
    assert json.loads(report.read_text())["step"] == 2
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    again = [r for r in records if r["step"] == 2 and "eval/pass@1" in r][-1]
    assert again["eval/policy_version_start"] == again["eval/policy_version_end"] == 2.0


def test_a_resumed_run_evaluates_after_rotation_deleted_the_checkpoint_it_resumed_from(tmp_path):
    """The frozen evaluation engine starts from the configured model, not from the resumed-from checkpoint
    (keep_checkpoints=1 has deleted it by the first evaluation)."""
    from sao.envs import make_env_tasks, save_tasks_jsonl

    held_out = tmp_path / "held_out.jsonl"
    save_tasks_jsonl(held_out, make_env_tasks("calculator", 2, seed=99))
    run = tmp_path / "run"
    base = [*_OVERRIDES, f"logging.run_dir={run}", "critic.pretrain.enabled=false",
            f"data.eval_file={held_out}", "logging.eval_every=3", "logging.checkpoint_every=1",
            "logging.keep_checkpoints=1", "eval.at_start=false", "eval.k=1"]  # fmt: skip
    train_sync_entry(load_config(None, [*base, "trainer.total_steps=1"]))
    train_sync_entry(load_config(None, [*base, "trainer.total_steps=4"]), resume=True)
    assert not (run / "checkpoints" / "step_00000001").exists()  # rotated away before step 3's evaluation
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if any(k.startswith("eval/") for k in r)]
    assert [r["step"] for r in evals] == [1, 3, 4] and not any("eval/failed" in r for r in evals)
    assert all(r["eval/policy_version_start"] == r["eval/policy_version_end"] == r["step"] for r in evals)


def test_start_dirs_give_the_resumed_checkpoint_once_then_the_configured_model(tmp_path):
    from sao.runtime.engines import StartDirs

    dirs = StartDirs(tmp_path / "checkpoints" / "step_00000025" / "actor", tmp_path / "base")
    assert [dirs().name for _ in range(3)] == ["actor", "base", "base"]
