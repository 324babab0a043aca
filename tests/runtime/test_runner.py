"""End to end: the asynchronous SAO run on the tiny model, every trajectory accounted for, and resume."""

from __future__ import annotations

import json

import pytest
import torch

from sao.config import ConfigError, load_config
from sao.presets import PRESETS
from sao.runtime.runner import train_sync_entry
from sao.runtime.threads import plan_threads

_OVERRIDES = [
    "model.tiny_arch=qwen3_moe", "model.tiny_size=test", "model.dtype=float32", "model.device=cpu",
    "critic.lr=1e-3", "critic.pretrain.corpus_size=8", "critic.pretrain.max_steps=2",
    "engine.max_new_tokens=16", "engine.max_concurrent=8",
    "data.env=calculator", "data.max_turns=3", "data.max_total_tokens=200",
    "trainer.lr=1e-3", "trainer.batch_size=4", "trainer.total_steps=3",
    "runtime.max_in_flight=8", "runtime.max_staleness=1",
    "logging.tensorboard=false", "logging.checkpoint_every=2",
]  # fmt: skip


def _cfg(run_dir, *extra):
    return load_config(None, [*_OVERRIDES, f"logging.run_dir={run_dir}", *extra])


def _three_step_run(run_dir, *extra) -> list[dict]:
    """Run the 3-step config; check the books and versions; return the step records."""
    result = train_sync_entry(_cfg(run_dir, *extra))
    assert (result.steps, result.policy_version) == (3, 3)
    c = result.counters
    assert c["trained"] == 12 and c["started"] == c["trained"] + c["dropped"] + c["pending"]
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("value_pretrain/corpus_size" in r for r in lines)  # the critic was pretrained on rollouts
    steps = [r for r in lines if "reward/mean" in r]
    assert [(r["step"], r["policy/version"]) for r in steps] == [(1, 1), (2, 2), (3, 3)]
    return steps


def test_async_sao_run_trains_and_accounts_for_every_trajectory(tmp_path):
    steps = _three_step_run(tmp_path / "run")
    assert (tmp_path / "run" / "checkpoints" / "step_00000003").is_dir()
    # the default thread plan, as read inside the trainer's thread and the engine's loop thread
    plan = plan_threads("local", None, None)
    expected = torch.get_num_threads() if plan.trainer is None else plan.trainer  # OMP_NUM_THREADS set
    assert {(r["trainer/threads"], r["runtime/engine_threads"]) for r in steps} == {(expected, expected)}


def test_async_sao_with_the_engine_in_its_own_process_trains_and_pushes_every_version(tmp_path):
    """``engine.backend=process``: value pretraining rollouts, generation and the weight pushes go to a child
    process; the run is otherwise the same pipeline."""
    run = tmp_path / "run"
    steps = _three_step_run(
        run, "engine.backend=process", "engine.threads=1", "trainer.threads=2", "logging.episodes=true",
        "logging.timeline_every_s=0.05",
    )  # fmt: skip
    assert {(r["trainer/threads"], r["runtime/engine_threads"]) for r in steps} == {(2.0, 1.0)}  # as set
    assert all(0.0 <= r["runtime/engine_idle_frac"] <= 1.0 for r in steps)  # the child's own stats
    assert all(r["runtime/train_s"] > 0 and r["runtime/in_flight"] >= 0 for r in steps)
    # The throughput logs: one episode line per trained trajectory, the timeline with the child's counters.
    episodes = [json.loads(x) for x in (run / "episodes.jsonl").read_text().splitlines()]
    assert sorted(e["step"] for e in episodes) == [1] * 4 + [2] * 4 + [3] * 4
    assert all(e["turns"] and all(t["gen_tokens"] > 0 and t["generate_s"] > 0 for t in e["turns"])
               for e in episodes)  # fmt: skip
    assert all(0 <= e["lag_mean"] <= e["lag_max"] <= 2 for e in episodes)  # max_staleness=1: lag <= 2 here
    timeline = [json.loads(x) for x in (run / "timeline.jsonl").read_text().splitlines()]
    assert len(timeline) >= 3 and timeline[-1]["trained"] == 12
    busy = [t["engine"]["busy_s"] for t in timeline]
    assert busy == sorted(busy) and busy[-1] > 0  # cumulative, from the child engine
    assert timeline[-1]["engine"]["decode_steps"] > 0 and timeline[-1]["engine"]["context_tokens"] > 0


def test_an_engine_that_does_not_start_is_a_clear_error(tmp_path):
    from sao.runtime.runner import EngineStartError

    missing = tmp_path / "no-such-venv" / "bin" / "python"
    with pytest.raises(EngineStartError, match=r"engine\.backend=vllm: .*no-such-venv"):
        train_sync_entry(_cfg(tmp_path / "run", "engine.backend=vllm", f"engine.python={missing}"))


def test_async_sao_from_scratch_raises_the_reward(tmp_path):
    """The real thing, small: async SAO (critic pretrained on rollouts, K=2, DIS, skip-observation GAE) on a
    randomly initialised test-size model in ``long_tail``, whose reward is the share of replies that contain
    a target letter. 40 steps of 16 take ~15 s; in seeds 0-2 the reward went ~0.15 → 0.6-0.7."""
    run = tmp_path / "run"
    cfg = _cfg(
        run, "data.env=long_tail", "data.max_turns=8", "data.max_total_tokens=300", "engine.max_new_tokens=8",
        "critic.lr=3e-3", "critic.pretrain.corpus_size=16", "critic.pretrain.max_steps=4",
        "trainer.lr=3e-3", "trainer.batch_size=16", "trainer.total_steps=40",
        "engine.max_concurrent=16", "runtime.max_in_flight=32", "runtime.max_staleness=1",
        "logging.checkpoint_every=40",
    )  # fmt: skip
    assert cfg.algo.preset == "sao"
    train_sync_entry(cfg)
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward/mean"] for r in steps if "reward/mean" in r]
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert len(rewards) == 40 and first < 0.3 and last > first + 0.25, rewards
    assert max(r.get("lag/token_max") or 0 for r in steps) >= 1  # trained on tokens of older policies
    last_step = steps[-1]
    assert last_step["trainer/critic_steps"] == 2 * last_step["trainer/actor_steps"] == 80  # K = 2


def test_resume_continues_the_step_count_and_the_books_balance(tmp_path):
    run = tmp_path / "run"
    first = train_sync_entry(_cfg(run, "trainer.total_steps=2"))
    assert first.steps == 2
    resumed = train_sync_entry(_cfg(run, "trainer.total_steps=4"), resume=True)
    assert (resumed.steps, resumed.policy_version) == (4, 4)
    c = resumed.counters
    assert c["trained"] == 16
    assert c["started"] == c["trained"] + c["dropped"] + c["pending"]
    assert c["produced"] >= c["trained"]  # the producer's counters continue from the checkpoint
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps.count(3) == 1 and steps.count(4) == 1  # steps 3-4 logged once, after 1-2


def test_a_run_killed_mid_way_resumes_from_its_checkpoint_and_the_books_balance(tmp_path):
    """SIGKILL a real ``sao train`` process after step 3 (checkpoints every 2 steps), then ``--resume``."""
    import signal
    import subprocess
    import sys
    import time

    from sao.sinks import DISCARDED_METRICS_FILE

    run = tmp_path / "run"
    overrides = [*_OVERRIDES, f"logging.run_dir={run}", "trainer.total_steps=10"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sao", "train", *overrides],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    metrics = run / "metrics.jsonl"

    def logged_steps() -> list[int]:
        text = metrics.read_text() if metrics.exists() else ""
        return [json.loads(x)["step"] for x in text.splitlines() if x.endswith("}")]

    deadline = time.monotonic() + 180
    while max(logged_steps(), default=0) < 3:
        assert proc.poll() is None, f"sao train ended before step 3: {proc.stderr.read()}"
        assert time.monotonic() < deadline, "sao train did not reach step 3 in 180 s"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    killed_at = max(logged_steps())
    checkpoint = max(int(p.name.removeprefix("step_")) for p in (run / "checkpoints").glob("step_*"))
    assert killed_at < 10 and checkpoint in (2, 4, 6, 8) and checkpoint <= killed_at

    with pytest.raises(ConfigError, match="already holds a run"):  # not resuming would mix two runs
        train_sync_entry(load_config(None, overrides))
    resumed = train_sync_entry(load_config(None, overrides), resume=True)
    assert (resumed.steps, resumed.policy_version) == (10, 10)
    c = resumed.counters
    assert c["trained"] == 40 and c["started"] == c["trained"] + c["dropped"] + c["pending"]
    records = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(11))  # value pretraining (0), then each step once
    assert all(r["policy/version"] == r["step"] for r in records[1:])
    assert [r["runtime/trained"] for r in records[1:]] == [4.0 * s for s in range(1, 11)]  # none twice
    discarded = (run / DISCARDED_METRICS_FILE).read_text().splitlines() if killed_at > checkpoint else []
    assert len(discarded) == killed_at - checkpoint  # the killed run's steps after its checkpoint, kept


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_runs_two_steps_in_the_full_pipeline(tmp_path, preset):
    extra = [
        f"algo={preset}",
        "trainer.total_steps=2",
        "trainer.batch_size=8",
        "critic.pretrain.enabled=false",
    ]
    result = train_sync_entry(_cfg(tmp_path / preset, *extra))
    assert (result.steps, result.policy_version) == (2, 2)
    c = result.counters
    assert c["trained"] == 16 and c["started"] == c["trained"] + c["dropped"] + c["pending"]


def test_sync_and_async_with_one_episode_in_flight_and_no_staleness_train_the_same(tmp_path):
    import torch

    from sao.models.loading import load_policy

    common = ["data.env=long_tail", "trainer.total_steps=2", "critic.pretrain.enabled=false"]
    sync = train_sync_entry(_cfg(tmp_path / "sync", *common, "runtime.mode=sync"))
    one = ["runtime.mode=async", "runtime.max_in_flight=1", "runtime.max_staleness=0"]
    asyn = train_sync_entry(_cfg(tmp_path / "async", *common, *one))
    for key in ("reward/mean", "actor/loss", "critic/value_loss", "lag/token_mean"):
        assert sync.last_metrics[key] == pytest.approx(asyn.last_metrics[key], rel=1e-4, abs=1e-6), key
    a = load_policy(tmp_path / "sync" / "checkpoints" / "step_00000002" / "actor", device="cpu")
    b = load_policy(tmp_path / "async" / "checkpoints" / "step_00000002" / "actor", device="cpu")
    # Equal up to float noise: the engine batches 16 sequences in one mode and 1 in the other (forwards agree
    # to ~5e-7), which Adam can turn into ~1e-5 weight differences; one Adam step at lr 1e-3 moves ~1e-3.
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=0, atol=2e-5, msg=name)


def test_checkpointed_actor_is_a_complete_checkpoint_with_its_tokenizer(tmp_path):
    from sao.models.loading import load_tokenizer

    train_sync_entry(_cfg(tmp_path / "run", "trainer.total_steps=1", "critic.pretrain.enabled=false"))
    tok = load_tokenizer(tmp_path / "run" / "checkpoints" / "step_00000001" / "actor")
    assert tok.eos_token == "<|im_end|>"


def test_bad_env_kwargs_fail_at_startup_with_a_config_error(tmp_path):
    from sao.config import ConfigError

    with pytest.raises(ConfigError, match=r"data.env_kwargs.*unexpected keyword argument 'colour'"):
        train_sync_entry(_cfg(tmp_path / "run", "data.env_kwargs={colour: red}"))
