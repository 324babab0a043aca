"""A dying rollout engine: the real `ProcessEngine` child killed with SIGKILL, under `SupervisedEngine` and
in whole runs (restart with the latest weights, lost episodes dropped as ``engine_crash``, a clean stop
with a checkpoint once restarts are exhausted, and a resume from that checkpoint)."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import pytest
import torch

from sao.config import load_config
from sao.engine.process import ProcessEngine
from sao.engine.types import EngineCrashedError, SamplingParams
from sao.models.loading import load_policy
from sao.runtime.engine_guard import SupervisedEngine
from sao.runtime.faults import EngineFailedError
from sao.runtime.runner import Run, RunStopped

from .test_runner import _OVERRIDES


def _kill(engine: ProcessEngine) -> None:
    os.kill(engine._process.pid, signal.SIGKILL)


def test_a_killed_engine_is_restarted_with_the_latest_weights_and_gives_up_after_max_restarts(tiny_moe_dir):
    """max_restarts=1: one restart per trained step; the restarted engine serves the latest weights."""
    policy = load_policy(tiny_moe_dir, dtype="float32", device="cpu")
    with torch.no_grad():
        policy.lm_head.weight.mul_(3.0)  # "trained" weights, unlike those on disk
    started: list[ProcessEngine] = []
    failed: list[EngineFailedError] = []

    async def start():
        engine = await asyncio.to_thread(
            ProcessEngine, tiny_moe_dir, device="cpu", dtype="float32", threads=1
        )
        started.append(engine)
        return engine

    async def weights():
        return policy.state_dict(), 7

    async def main():
        guard = SupervisedEngine(await start(), start, weights, max_restarts=1, on_failed=failed.append)
        prompt, params = [1, 2, 3, 4], SamplingParams(max_new_tokens=4000, seed=0)
        long = asyncio.create_task(guard.generate(prompt, params))
        await asyncio.sleep(0.3)
        _kill(started[0])
        with pytest.raises(EngineCrashedError, match="exited with code -9"):
            await asyncio.wait_for(long, 30)
        short = SamplingParams(max_new_tokens=6, seed=0)
        assert guard.context_limit == started[0].context_limit > 0
        gen = await asyncio.wait_for(guard.generate(prompt, short), 60)  # waits for the restart
        assert len(started) == 2 and guard.restarts == 1 and guard.version == 7 and set(gen.versions) == {7}
        # The restarted engine serves the pushed weights, not the checkpoint's: its log-probs match them.
        ids = torch.tensor([prompt + gen.token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(policy(ids).logits[0, len(prompt) - 1 : -1].float(), dim=-1)
        teacher = logp.gather(-1, torch.tensor(gen.token_ids)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(gen.logprobs), teacher, atol=1e-4, rtol=0)
        # After a trained step (note_progress) the count starts over: a second death is restarted too.
        guard.note_progress()
        _kill(started[1])
        with pytest.raises(EngineCrashedError):
            await asyncio.wait_for(guard.generate(prompt, short), 30)
        assert set((await asyncio.wait_for(guard.generate(prompt, short), 60)).versions) == {7}
        # A third death with no trained step since the last restart exhausts max_restarts=1.
        _kill(started[2])
        with pytest.raises(EngineCrashedError):
            await asyncio.wait_for(guard.generate(prompt, short), 30)
        with pytest.raises(EngineCrashedError, match=r"engine\.max_restarts=1"):
            await asyncio.wait_for(guard.generate(prompt, short), 30)
        await guard.close()

    asyncio.run(main())
    assert len(started) == 3 and len(failed) == 1 and "died 2 time(s)" in str(failed[0])


def _cfg(run_dir, *extra):
    return load_config(
        None,
        [*_OVERRIDES, f"logging.run_dir={run_dir}", "engine.backend=process", "engine.threads=1",
         "trainer.total_steps=4", "logging.checkpoint_every=100", *extra],
    )  # fmt: skip


async def _killer(run: Run, *, after_step: int, times: int) -> int:
    """Kill the engine's child once the run trained ``after_step`` steps, and each restarted one soon after it
    starts, ``times`` times in all; returns how many it killed."""
    killed, last = 0, None
    while killed < times:
        engine = run.engine.engine
        generating = engine.alive and engine.stats().get("running", 0) > 0 and run.producer._in_flight > 0
        if run.trainer.step >= after_step and engine is not last and (generating or last is not None):
            _kill(engine)  # the first while it generates (so episodes are lost), later ones at once
            killed, last = killed + 1, engine
        await asyncio.sleep(0.005)
    return killed


def _play(cfg, *, after_step: int, times: int, resume: bool = False):
    async def main():
        run = Run(cfg, resume=resume)
        await run.start()
        killer = asyncio.create_task(_killer(run, after_step=after_step, times=times))
        try:
            await run.loop()
            error = None
        except RunStopped as err:
            error = err
        finally:
            killer.cancel()
            result = await run.close()
        return result, error

    return asyncio.run(main())


def test_a_run_whose_engine_dies_restarts_it_drops_the_lost_episodes_and_finishes(tmp_path):
    run_dir = tmp_path / "run"
    result, error = _play(_cfg(run_dir), after_step=1, times=1)
    assert error is None and result.steps == 4
    c = result.counters
    assert c["dropped/engine_crash"] >= 1 and c["started"] == c["trained"] + c["dropped"] + c["pending"]
    steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if "reward/mean" in r]
    assert steps[-1]["runtime/engine_restarts"] == 1.0 and steps[-1]["runtime/dropped/engine_crash"] >= 1
    assert [r["policy/version"] for r in steps] == [1, 2, 3, 4]


def test_an_engine_that_keeps_dying_stops_the_run_with_a_checkpoint_and_the_run_resumes(tmp_path):
    run_dir = tmp_path / "run"
    cfg = _cfg(run_dir, "engine.max_restarts=1", "trainer.total_steps=30")
    result, error = _play(cfg, after_step=1, times=30)
    assert isinstance(error, RunStopped) and "engine.max_restarts=1" in str(error)
    assert error.checkpoint is not None and error.checkpoint.name == f"step_{result.steps:08d}"
    assert 1 <= result.steps < 30
    cfg = _cfg(run_dir, "engine.max_restarts=1", f"trainer.total_steps={result.steps + 2}")
    resumed, error = _play(cfg, after_step=99, times=0, resume=True)
    assert error is None and resumed.steps == result.steps + 2
    c = resumed.counters
    assert c["started"] == c["trained"] + c["dropped"] + c["pending"]


def test_a_killed_or_unreachable_model_server_reads_as_dead_to_the_supervisor(tmp_path):
    """The server adapters' side of the same path, with a real server process (a plain HTTP server standing
    where vLLM would: no vLLM here) killed with SIGKILL, and an attached URL that refuses connections."""
    import sys

    from sao.engine.server_process import ServerProcess, free_port
    from sao.engine.vllm import VLLMEngine

    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "http.server",
        str(port),
        "--bind",
        "127.0.0.1",
        "--directory",
        str(tmp_path),
    ]
    server = ServerProcess.start(argv, f"http://127.0.0.1:{port}", health_path="/", timeout_s=30)
    restarted: list[int] = []

    async def main():
        launched = VLLMEngine(server.base_url, "m", 512, server=server)
        assert launched.alive
        server.process.kill()
        server.process.wait()
        assert not launched.alive
        await launched.close()

        refused = VLLMEngine(f"http://127.0.0.1:{free_port()}", "m", 512)  # nothing listens there
        assert refused.alive  # not known to be dead before a request fails

        async def start():
            restarted.append(1)
            raise OSError("no server to attach to")

        async def weights():
            return {}, 0

        guard = SupervisedEngine(refused, start, weights, max_restarts=1)
        with pytest.raises(EngineCrashedError, match=r"ConnectError|connection"):
            await guard.generate([1, 2, 3], SamplingParams(max_new_tokens=2))
        assert not refused.alive
        with pytest.raises(EngineCrashedError, match=r"restart failed: OSError: no server to attach to"):
            await guard.generate([1, 2, 3], SamplingParams(max_new_tokens=2))
        await guard.close()

    asyncio.run(main())
    assert restarted == [1]  # one attempt (max_restarts=1), then the supervisor gave up


BROKEN_GRADER = '''
from sao.envs.calculator import CalculatorEnv


class BrokenGrader(CalculatorEnv):
    """The calculator whose grader raises on every turn."""

    async def step(self, text):
        raise KeyError("answer column missing")
'''


def test_a_run_whose_every_episode_fails_stops_with_a_checkpoint_instead_of_spinning(tmp_path):
    source, tasks = tmp_path / "broken_env.py", tmp_path / "tasks.jsonl"
    source.write_text(BROKEN_GRADER)
    tasks.write_text(
        "".join(json.dumps({"id": f"t{i}", "prompt": f"{i} + 1?", "answer": i + 1}) + "\n" for i in range(8))
    )
    cfg = load_config(
        None,
        [*_OVERRIDES, f"logging.run_dir={tmp_path / 'run'}", f"data.env={source}:BrokenGrader",
         f"data.train_file={tasks}",
         "critic.pretrain.enabled=false", "runtime.max_consecutive_drops=12"],
    )  # fmt: skip

    async def main():
        run = Run(cfg)
        await run.start()
        try:
            with pytest.raises(RunStopped) as stopped:
                await asyncio.wait_for(run.loop(), 120)
        finally:
            result = await run.close()
        return stopped.value, result

    err, result = asyncio.run(main())
    assert "episodes in a row yielded no trajectory (runtime.max_consecutive_drops=12)" in str(err)
    assert "answer column missing" in str(err) and result.steps == 0
    assert err.checkpoint is not None and err.checkpoint.name == "step_00000000"
    c = result.counters
    assert c["dropped/env_error"] >= 12 and c["started"] == c["trained"] + c["dropped"] + c["pending"]


HUGE_REWARD = '''
from sao.envs.calculator import CalculatorEnv


class HugeReward(CalculatorEnv):
    """The calculator whose grader pays 1e30: finite, so the episode is valid, but the critic's squared
    error overflows and the actor's gradient norm is infinite."""

    async def step(self, text):
        result = await super().step(text)
        result.reward, result.done = 1e30, True
        return result
'''


def test_sao_train_whose_steps_keep_diverging_stops_with_a_checkpoint_and_exit_code_3(tmp_path):
    """Non-finite steps are skipped (weights untouched) and counted; more than trainer.max_consecutive_skips
    in a row stop the run cleanly: a checkpoint, a message naming the key, exit code 3."""
    from typer.testing import CliRunner

    from sao.cli import app

    source, tasks, run_dir = tmp_path / "huge_env.py", tmp_path / "tasks.jsonl", tmp_path / "run"
    source.write_text(HUGE_REWARD)
    tasks.write_text(
        "".join(json.dumps({"id": f"t{i}", "prompt": f"{i} + 1?", "answer": i + 1}) + "\n" for i in range(8))
    )
    overrides = [
        *_OVERRIDES, f"logging.run_dir={run_dir}", f"data.env={source}:HugeReward",
        f"data.train_file={tasks}", "critic.pretrain.enabled=false", "trainer.total_steps=10",
        "trainer.max_consecutive_skips=2",
    ]  # fmt: skip
    result = CliRunner().invoke(app, ["train", *overrides])
    assert result.exit_code == 3, result.output
    assert "stopped: the run stopped at step 3: training diverged" in result.output
    assert "trainer.max_consecutive_skips=2" in result.output and "--resume" in result.output
    steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if "trainer/skipped_steps" in r]
    assert [r["trainer/skipped_steps"] for r in steps] == [1, 2, 3]
    assert (run_dir / "checkpoints" / "step_00000003").is_dir()
