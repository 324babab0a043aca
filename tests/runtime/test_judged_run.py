"""An LLM judge's reward in a training run (``judge.*``): the run trains on the judge's scores combined with
the env's reward, logs the judge's counters, drops episodes the judge failed as ``judge_error`` and goes
on; a real ``sao serve`` of a tiny untrained model answers unparseably, which drops, never rewards."""

from __future__ import annotations

import itertools
import json

import pytest
from fastapi import FastAPI, Request

from sao.config import load_config
from sao.runtime.faults import RunStopped
from sao.runtime.runner import train_sync_entry

_RUN = [
    "model.tiny_arch=qwen3_moe", "model.tiny_size=test", "model.dtype=float32", "model.device=cpu",
    "algo.preset=running_mean_8",
    "engine.max_new_tokens=8", "engine.max_concurrent=8", "data.env=long_tail", "data.max_turns=2",
    "data.max_total_tokens=200", "trainer.lr=1e-3", "trainer.batch_size=4", "trainer.total_steps=3",
    "runtime.max_in_flight=8", "runtime.max_staleness=1", "logging.tensorboard=false",
    "logging.checkpoint_every=3", "judge.timeout_s=5", "judge.retries=1",
]  # fmt: skip


def _grader() -> FastAPI:
    """A judge with exact answers: every 4th request gets HTTP 400 (not retried: that episode is dropped as
    judge_error); the others get "Score: 7" on the default 0..10 scale."""
    app, count = FastAPI(), itertools.count(1)

    @app.post("/v1/chat/completions")
    async def complete(request: Request):
        body = await request.json()
        assert body["messages"][-1]["role"] == "user" and "Conversation:" in body["messages"][-1]["content"]
        if next(count) % 4 == 0:
            from fastapi.responses import JSONResponse

            return JSONResponse({"error": "bad request"}, status_code=400)
        return {"choices": [{"message": {"role": "assistant", "content": "Fair. Score: 7"}}]}

    return app


def test_a_run_trains_on_the_judge_scores_and_drops_what_the_judge_failed(tmp_path, serve_app):
    url = serve_app(_grader())
    run = tmp_path / "run"
    result = train_sync_entry(load_config(None, [
        *_RUN, f"logging.run_dir={run}", f"judge.url={url}", "judge.combine=judge",
    ]))  # fmt: skip
    c = result.counters
    assert result.steps == 3 and c["started"] == c["trained"] + c["dropped"] + c["pending"]
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if "reward/mean" in r]
    assert all(r["reward/mean"] == pytest.approx(0.7) for r in steps)  # the judge's 7/10 alone
    last = steps[-1]
    assert last["judge/grades"] >= 12 and last["judge/failures/http"] >= 3
    assert last["runtime/dropped/judge_error"] == c["dropped/judge_error"] >= 3
    assert 0 < last["judge/latency_mean_s"] <= last["judge/latency_max_s"]


def test_a_real_untrained_judge_answers_unparseably_and_its_episodes_are_dropped_not_rewarded(
    tmp_path, serve_app, tiny_moe_dir, tiny_tokenizer
):
    from sao.engine import LocalEngine
    from sao.serve.gateway import create_app

    engine = LocalEngine(tiny_moe_dir, device="cpu", dtype="float32", max_running=4)
    url = serve_app(create_app(engine, tiny_tokenizer, default_max_tokens=8))
    cfg = load_config(None, [
        *_RUN, f"logging.run_dir={tmp_path / 'run'}", f"judge.url={url}", "judge.max_tokens=8",
        "runtime.max_consecutive_drops=6",
    ])  # fmt: skip
    with pytest.raises(RunStopped, match=r"\{.judge_error.: 6\}.*unparseable answer"):
        train_sync_entry(cfg)


class _AlwaysJudgeFails:
    """One turn, whose grade always fails."""

    max_turns = 1

    async def reset(self, task):
        return [{"role": "user", "content": str(task.prompt)}]

    async def step(self, text):
        from sao.envs import JudgeError

        raise JudgeError("the judge is down")

    async def close(self):
        pass


def test_a_value_pretraining_corpus_with_no_trajectory_is_a_clear_error(tiny_tokenizer):
    import asyncio

    from tests.envs.scripted import ScriptedEngine

    from sao.envs import Task
    from sao.rollout.agent_loop import AgentLoopConfig
    from sao.runtime.faults import NothingTrainableError
    from sao.runtime.rollouts import collect_rollouts

    engine = ScriptedEngine(tiny_tokenizer, ["x"] * 4)
    with pytest.raises(NothingTrainableError, match=r"none of the 4 rollouts .* \{'judge_error': 4\}"):
        asyncio.run(collect_rollouts(engine, tiny_tokenizer, _AlwaysJudgeFails, [Task("t", "q")], 4,
                                     AgentLoopConfig(max_turns=1)))  # fmt: skip
