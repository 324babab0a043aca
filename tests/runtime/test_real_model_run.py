"""Whole runs as a real model trains: the BPE tokenizer and the Qwen3-like template with thinking on,
episodes with user nudges mid-episode (they train, on-policy ratios are 1, and a template that raises on some
observations drops those episodes, counted, while the run goes on); bfloat16 compute over float32 master
weights with checkpointing, and the engine fed its own dtype."""

from __future__ import annotations

import json

import pytest

from sao.config import load_config
from sao.envs.calculator import make_tasks
from sao.envs.tasks import save_tasks_jsonl
from sao.models.templates import load_chat_template
from sao.runtime.runner import train_sync_entry

from .test_runner import _OVERRIDES

RAISES_ON_MARKED = """{%- for message in messages -%}
{%- if message.content is string and 'UNRENDERABLE' in message.content -%}
{{- raise_exception('this template cannot render marked messages') -}}
{%- endif -%}
{%- endfor -%}
"""

MARKING_ENV = '''
from sao.envs.calculator import CalculatorEnv


class MarkingCalculator(CalculatorEnv):
    """The calculator whose observations are marked UNRENDERABLE for tasks with an odd answer."""

    async def step(self, text):
        result = await super().step(text)
        if self._task.answer % 2:
            marked = [{**m, "content": m["content"] + " UNRENDERABLE"} for m in result.observation]
            result.observation = marked
        return result
'''


def test_a_run_with_the_qwen3_template_and_user_nudges_trains_and_drops_unrenderable_episodes(tmp_path):
    """`sao train`'s pipeline with the BPE tokenizer, the Qwen3-like template with thinking on, and
    observations that are user nudges; a template that raises on some observations drops those episodes
    (``dropped/template_error``) and the run finishes its steps."""
    template = tmp_path / "qwen3_raising.jinja"
    template.write_text(RAISES_ON_MARKED + load_chat_template("qwen3"))
    env = tmp_path / "marking_env.py"
    env.write_text(MARKING_ENV)
    tasks = tmp_path / "tasks.jsonl"
    save_tasks_jsonl(tasks, make_tasks(64, seed=0))
    run_dir = tmp_path / "run"
    cfg = load_config(None, [
        *_OVERRIDES, f"logging.run_dir={run_dir}", "model.tiny_tokenizer=bpe",
        f"model.chat_template={template}",
        "model.enable_thinking=true", f"data.env={env}:MarkingCalculator",
        f"data.train_file={tasks}", "critic.pretrain.enabled=false",
        "data.max_total_tokens=400",
    ])  # fmt: skip
    result = train_sync_entry(cfg)
    assert result.steps == 3
    c = result.counters
    assert c["dropped/template_error"] >= 1 and c["started"] == c["trained"] + c["dropped"] + c["pending"]
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in lines if "reward/mean" in r]
    assert steps[-1]["runtime/dropped/template_error"] >= 1
    # On-policy tokens of the first step (no update yet): the DIS ratio is 1.
    assert steps[0]["dis/ratio_mean"] == pytest.approx(1.0, abs=1e-3)


def test_a_run_computing_in_bfloat16_keeps_float32_master_weights_and_pushes_the_engines_dtype(tmp_path):
    """The one-process runtime: model.dtype=bfloat16 (compute) with master_dtype=float32 trains float32
    weights (and AdamW state) through bfloat16 forwards, with checkpointing on; the engine (its own
    engine.dtype, bfloat16) receives bfloat16 weights; the trainer's stay float32."""
    import asyncio

    import torch

    from sao.models.precision import compute_dtype_of
    from sao.models.prepare import checkpointing_enabled
    from sao.runtime.runner import Run

    cfg = load_config(None, [
        *_OVERRIDES, f"logging.run_dir={tmp_path / 'run'}", "model.dtype=bfloat16",
        "model.master_dtype=float32", "model.gradient_checkpointing=true", "engine.dtype=bfloat16",
        "critic.pretrain.enabled=false", "trainer.total_steps=1",
    ])  # fmt: skip

    async def main():
        run = Run(cfg)
        await run.start()
        try:
            await run.loop()
            models = {"actor": run.backend.actor, "critic": run.backend.critic}
            engine_dtypes = {p.dtype for p in run.engine.engine.model.parameters()}
            optim_dtypes = {v.dtype for s in run.trainer.actor_optim.state.values() for v in s.values()
                            if torch.is_tensor(v) and v.dim() > 0}  # fmt: skip
        finally:
            result = await run.close()
        return models, engine_dtypes, optim_dtypes, result

    models, engine_dtypes, optim_dtypes, result = asyncio.run(main())
    assert result.steps == 1
    for model in models.values():
        assert {p.dtype for p in model.parameters()} == {torch.float32}
        assert compute_dtype_of(model) == torch.bfloat16 and checkpointing_enabled(model)
    assert optim_dtypes == {torch.float32} and engine_dtypes == {torch.bfloat16}
