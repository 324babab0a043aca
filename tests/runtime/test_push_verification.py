"""Every push verified, and a push that hangs is an error: the probe after each weight push on real engines
(a replica given other weights than the trainer's is named), whole local runs that stop on it or warn, a
real push that never returns (the engine process stopped with SIGSTOP) hitting the deadline, and the lag-0
mismatch drift alarm."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import os
import signal
import time

import pytest
import torch

from sao.config import load_config
from sao.engine.local import LocalEngine
from sao.models.loading import load_policy
from sao.models.tiny import build_tiny_model
from sao.runtime.engine_guard import SupervisedEngine
from sao.runtime.engine_pool import EnginePool
from sao.runtime.push_check import PushCheck, PushCheckError, probe_diff, probe_token_ids
from sao.runtime.runner import Run, RunStopped
from sao.runtime.weight_checks import MismatchDrift

from .test_runner import _OVERRIDES


def _cfg(run_dir, *extra):
    return load_config(
        None,
        [*_OVERRIDES, f"logging.run_dir={run_dir}", "critic.pretrain.enabled=false", "trainer.total_steps=2",
         "logging.checkpoint_every=100", *extra],
    )  # fmt: skip


def _steps(run_dir) -> list[dict]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if "reward/mean" in r]


def _perturbed(model: torch.nn.Module) -> torch.nn.Module:
    """A real copy of ``model`` with other weights, the LM head scaled by 10: what a wrong push delivers. (The
    tiny random model's next-token distribution is nearly uniform, so it takes that much to move its
    log-probs by more than the default threshold; a trained checkpoint's peaked ones move by nats.)"""
    wrong = copy.deepcopy(model)
    with torch.no_grad():
        wrong.lm_head.weight.mul_(10.0)
    return wrong


def _play(cfg, prepare=None):
    """Start a run, let ``prepare(run)`` inject a fault (it may return a task to cancel), train, close."""

    async def main():
        run = Run(cfg)
        await run.start()
        side = prepare(run) if prepare is not None else None
        error = None
        try:
            await run.loop()
        except RunStopped as err:
            error = err
        finally:
            if side is not None:
                await side
            result = await run.close()
        return run, result, error

    return asyncio.run(main())


def test_a_clean_run_probes_every_push_and_finds_the_trainers_weights(tmp_path):
    run_dir = tmp_path / "run"
    _, result, error = _play(_cfg(run_dir))
    assert error is None and result.steps == 2
    for r in _steps(run_dir):  # fp32 engine and trainer on the CPU: the same numbers
        assert r["weight_sync/probe_mean_abs_diff/replica0"] < 1e-4
        assert r["weight_sync/probe_max_abs_diff/replica0"] < 1e-3
        assert r["weight_sync/probe_failed"] == 0.0 and r["weight_sync/probe_s"] > 0


def test_a_push_that_delivers_other_weights_stops_the_run_naming_the_replica_and_the_version(tmp_path):
    run_dir = tmp_path / "run"

    def inject(run):  # the in-process sync now hands the engine a perturbed copy of the actor's weights
        run.sync.inner.actor = _perturbed(run.backend.actor)

    _, result, error = _play(_cfg(run_dir, "trainer.total_steps=4"), inject)
    assert isinstance(error, RunStopped) and result.steps == 1
    assert (
        "replica0" in str(error)
        and "version 1" in str(error)
        and "runtime.push_check.threshold" in str(error)
    )
    assert error.checkpoint is not None and error.checkpoint.name == "step_00000001"
    (step,) = _steps(run_dir)  # the failing step is logged before the run stops
    assert step["weight_sync/probe_mean_abs_diff/replica0"] > 0.5 and step["weight_sync/probe_failed"] == 1.0


def test_warn_mode_warns_once_and_trains_on(tmp_path, caplog):
    run_dir = tmp_path / "run"

    def inject(run):
        run.sync.inner.actor = _perturbed(run.backend.actor)

    with caplog.at_level(logging.WARNING, logger="sao.runtime.push_check"):
        _, result, error = _play(_cfg(run_dir, "runtime.push_check.action=warn"), inject)
    assert error is None and result.steps == 2
    warnings = [r.getMessage() for r in caplog.records if "push check failed" in r.getMessage()]
    assert len(warnings) == 1 and "replica0" in warnings[0] and "version 1" in warnings[0]
    assert [r["weight_sync/probe_failed"] for r in _steps(run_dir)] == [1.0, 1.0]
    # `sao inspect RUN_DIR` shows the checks even without kept trajectories
    from sao.inspector import load_source

    doc = load_source(run_dir)
    checks = doc["weight_checks"]
    assert checks["replicas"] == ["replica0"] and [p["version"] for p in checks["probe"]] == [1, 2]
    assert checks["push_check"]["action"] == "warn" and checks["probe"][0]["mean"]["replica0"] > 0.5


def test_the_lag0_mismatch_is_logged_per_step_and_its_drift_stops_a_run_whose_pushes_went_wrong(tmp_path):
    """With the probe off, a push that delivers other weights is caught by the per-step mismatch: the tokens
    the engine samples as version 1 do not have the trainer's log-probs, and the drift alarm stops the run."""
    clean = tmp_path / "clean"
    _, result, error = _play(_cfg(clean, "runtime.push_check.action=none"))
    assert error is None and result.steps == 2
    first = _steps(clean)[0]
    assert first["mismatch/lag0_tokens"] > 0 and first["mismatch/lag0_logprob_abs_diff"] < 1e-5
    assert first["mismatch/lag0_k3_kl"] < 1e-9 and "weight_sync/probe_failed" not in first

    def inject(run):
        run.sync.inner.actor = _perturbed(run.backend.actor)

    keys = ["runtime.push_check.action=none", "runtime.mismatch_drift.action=error",
            "runtime.mismatch_drift.window=1", "runtime.mismatch_drift.min_abs_diff=0.05",
            "trainer.total_steps=6", "runtime.max_staleness=0"]  # fmt: skip
    _, result, error = _play(_cfg(tmp_path / "wrong", *keys), inject)
    assert isinstance(error, RunStopped) and "lag-0 log-prob mismatch drifted at step 2" in str(error)
    assert result.steps == 2 and _steps(tmp_path / "wrong")[1]["mismatch/lag0_logprob_abs_diff"] > 0.05


def test_a_push_that_never_returns_hits_the_deadline_and_stops_the_run_naming_path_replica_and_version(
    tmp_path,
):
    """The engine process is stopped (SIGSTOP) while the trainer trains step 1: the push after it waits for
    an acknowledgement that never comes, until ``runtime.weight_sync_timeout_s``."""
    run_dir = tmp_path / "run"
    cfg = _cfg(run_dir, "engine.backend=process", "engine.threads=1", "runtime.weight_sync_timeout_s=2")
    stopped: list[int] = []

    def inject(run):
        async def stop_engine_while_training():
            async with asyncio.timeout(60):
                while not run._train_lock.locked():  # held while step 1 trains, before its push
                    await asyncio.sleep(0.001)
            stopped.append(run.engine.engine._process.pid)
            os.kill(stopped[0], signal.SIGSTOP)

        return asyncio.create_task(stop_engine_while_training())

    t0 = time.monotonic()
    _, result, error = _play_resuming(cfg, inject, stopped)
    assert isinstance(error, RunStopped) and result.steps == 1
    message = str(error)
    assert "'inproc'" in message and "version 1" in message and "replica0" in message
    assert "runtime.weight_sync_timeout_s" in message and error.checkpoint is not None
    assert time.monotonic() - t0 < 120


def _play_resuming(cfg, inject, stopped):
    """`_play`, with the stopped engine process continued before the run closes (so it exits promptly)."""

    async def main():
        run = Run(cfg)
        await run.start()
        side = inject(run)
        error = None
        try:
            await run.loop()
        except RunStopped as err:
            error = err
        finally:
            await side
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
            result = await run.close()
        return run, result, error

    return asyncio.run(main())


def test_the_deadline_reports_only_its_own_expiry_and_names_the_path(tiny_moe_dir):
    """A path's own TimeoutError (e.g. a ping it bounds itself) is not reported as a missed deadline."""
    from sao.runtime.sync_deadline import DeadlineSync, WeightSyncTimeoutError, sync_path_name
    from sao.runtime.weight_sync import BroadcastSync, DiskSync, InprocSync

    class OwnTimeout:  # a path whose push fails at once with a TimeoutError of its own
        path = "custom"

        async def push(self, version: int) -> None:
            raise TimeoutError("the path's own ping")

    class Slow:
        path = "slow"

        async def push(self, version: int) -> None:
            await asyncio.sleep(30)

    engine = LocalEngine(tiny_moe_dir, device="cpu", dtype="float32")

    async def main():
        with pytest.raises(TimeoutError, match="own ping"):
            await DeadlineSync(OwnTimeout(), 5, engine).push(1)
        with pytest.raises(WeightSyncTimeoutError, match=r"path 'slow'.*version 1 .*replica0") as caught:
            await DeadlineSync(Slow(), 0.2, engine).push(1)
        assert caught.value.replicas == ["replica0"] and caught.value.version == 1
        await engine.close()

    asyncio.run(main())
    assert sync_path_name(InprocSync(engine, None)) == "inproc"
    assert sync_path_name(DiskSync(None, None, tiny_moe_dir)) == "disk"
    assert sync_path_name(BroadcastSync(None, None)) == "broadcast"


def test_the_probe_names_the_one_replica_of_a_pool_that_holds_other_weights(tiny_moe_dir, tiny_tokenizer):
    trainer = load_policy(tiny_moe_dir, dtype="float32", device="cpu")
    probe = probe_token_ids("vocab", 64, 0, tiny_tokenizer, [])
    assert probe == probe_token_ids("vocab", 64, 0, tiny_tokenizer, [])  # fixed for the run
    assert not set(probe) & set(tiny_tokenizer.all_special_ids)

    async def main():
        engines = [LocalEngine(tiny_moe_dir, device="cpu", dtype="float32") for _ in range(2)]

        async def never():
            raise AssertionError("no restart expected")

        pool = EnginePool([SupervisedEngine(e, never, never, max_restarts=0) for e in engines])
        try:
            await engines[0].update_weights(trainer.state_dict(), 1)
            # the wrong push: another checkpoint's weights (the tiny model of seed 1)
            await engines[1].update_weights(build_tiny_model("qwen3_moe", "test", seed=1).state_dict(), 1)
            check = PushCheck(pool, lambda ids: _score(trainer, ids), probe, threshold=0.05, action="error",
                              timeout_s=60)  # fmt: skip
            metrics, failure = await check.check(1)
            warn = PushCheck(pool, lambda ids: _score(trainer, ids), probe, threshold=0.05, action="warn",
                             timeout_s=60)  # fmt: skip
            _, no_failure = await warn.check(1)
        finally:
            await pool.close()
        return metrics, failure, no_failure

    metrics, failure, no_failure = asyncio.run(main())
    assert metrics["weight_sync/probe_mean_abs_diff/replica0"] < 1e-4
    assert metrics["weight_sync/probe_mean_abs_diff/replica1"] > 0.1
    assert isinstance(failure, PushCheckError) and failure.replica == "replica1" and failure.version == 1
    assert metrics["weight_sync/probe_failed"] == 1.0 and no_failure is None


def _score(model, ids):
    from sao.engine.scoring import score_tokens

    return score_tokens(model, ids)


def test_non_finite_probe_numbers_fail_and_lengths_must_match():
    assert probe_diff([-1.0, -2.0], [-1.5, -2.0]) == (0.25, 0.5)
    assert probe_diff([-1.0, -2.0], [float("nan"), -2.0]) == (float("inf"), float("inf"))
    with pytest.raises(ValueError, match="1 engine log-probs for 2"):
        probe_diff([-1.0, -2.0], [-1.0])


def test_the_prompt_probe_is_the_first_tasks_rendered_prompt(tiny_tokenizer):
    from sao.envs.base import Task

    ids = probe_token_ids("prompt", 16, 0, tiny_tokenizer, [Task(id="t", prompt="What is 2 + 3?")])
    assert len(ids) == 16 and "What is" in tiny_tokenizer.decode(ids)
    with pytest.raises(ValueError, match=r"runtime\.push_check\.probe='prompt'"):
        probe_token_ids("prompt", 16, 0, tiny_tokenizer, [])


def test_the_drift_alarm_fires_when_the_recent_mismatch_grows_past_factor_and_floor(caplog):
    warn = MismatchDrift(window=2, factor=2.0, min_abs_diff=0.01, action="warn")
    series = [0.01, 0.01, 0.012, 0.015, 0.03, 0.05, 0.05, 0.011, 0.01, 0.06, 0.06]
    fired = []
    with caplog.at_level(logging.WARNING, logger="sao.runtime.weight_checks"):
        for step, value in enumerate(series, 1):
            metrics, error = warn.observe({"mismatch/lag0_logprob_abs_diff": value}, step)
            assert error is None  # warn mode never stops the run
            fired.append(metrics.get("mismatch/drift_alarm"))
    assert fired[:3] == [None, None, None] and fired[3] == 0.0  # ratio 1.35 at step 4
    assert fired[4:7] == [1.0, 1.0, 1.0] and fired[7:9] == [1.0, 0.0] and fired[9:] == [1.0, 1.0]
    assert len([r for r in caplog.records if "drifted" in r.getMessage()]) == 2  # once per episode of drift
    tiny = MismatchDrift(window=2, factor=2.0, min_abs_diff=0.01, action="error")
    for step, value in enumerate([1e-6, 1e-6, 5e-6, 5e-6], 1):  # 5x growth, but far below the floor
        _, error = tiny.observe({"mismatch/lag0_logprob_abs_diff": value}, step)
        assert error is None
    stop = MismatchDrift(window=1, factor=2.0, min_abs_diff=0.0, action="error")
    stop.observe({"mismatch/lag0_logprob_abs_diff": 0.02}, 1)
    assert stop.observe({}, 2) == ({}, None)  # a step without lag-0 tokens adds nothing
    _, error = stop.observe({"mismatch/lag0_logprob_abs_diff": 0.05}, 3)
    assert error is not None and "step 3" in str(error) and "runtime.mismatch_drift.factor=2" in str(error)


@pytest.mark.slow  # a private Ray cluster with 2 FSDP ranks and 2 replicas (~40 s); `make test-slow`
def test_on_ray_each_replica_and_the_sharded_trainer_score_the_probe_after_every_push(tmp_path):
    pytest.importorskip("ray")
    run_dir = tmp_path / "run"
    ray_keys = ["runtime.backend=ray", "cluster.num_cpus=4", "cluster.trainer_workers=2",
                "cluster.engine_replicas=2", "runtime.weight_sync=broadcast"]  # fmt: skip
    _, result, error = _play(_cfg(run_dir, *ray_keys))
    assert error is None and result.steps == 2
    for r in _steps(run_dir):  # fp32 replicas against the FSDP ranks' sharded forward
        for replica in ("replica0", "replica1"):
            assert r[f"weight_sync/probe_mean_abs_diff/{replica}"] < 1e-4
        assert r["weight_sync/probe_failed"] == 0.0 and r["weight_sync/probe_errors"] == 0.0
