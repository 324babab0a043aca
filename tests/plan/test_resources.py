"""`sao.plan.resources` reads the precision keys as the trainer and the engine use them: the engine's dtype
from engine.dtype, the trainer's state from model.master_dtype, and the local runtime's shared GPU."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from sao.config import load_config
from sao.plan.memory import local_engine_kv_bytes
from sao.plan.resource_table import format_resource_plan
from sao.plan.resources import resource_plan

ROOT = Path(__file__).resolve().parents[2]
QWEN3_06B = "model.path=Qwen/Qwen3-0.6B"  # not a directory here: the shipped table
PARAMS_06B = 596_049_920


def _plan(*overrides: str):
    return resource_plan(load_config(None, [QWEN3_06B, "model.device=cuda", *overrides]))


def test_engine_dtype_is_engine_dtype_not_the_trainers_compute_dtype() -> None:
    plan = _plan("model.dtype=bfloat16", "engine.dtype=float32")
    assert plan.engine_dtype == "float32" and plan.compute_dtype == "bfloat16"
    assert plan.weight_bytes == 4 * PARAMS_06B
    assert plan.kv_bytes_per_token == 2 * 28 * 8 * 128 * 4
    assert _plan("model.dtype=float32", "engine.dtype=auto").engine_dtype == "bfloat16"  # auto on a GPU


def test_trainer_state_follows_the_master_dtype() -> None:
    fp32 = _plan("algo=grpo", "model.master_dtype=float32")
    bf16 = _plan("algo=grpo", "model.master_dtype=bfloat16")
    assert fp32.trainer_state_bytes == 16 * PARAMS_06B
    assert bf16.trainer_state_bytes == 8 * PARAMS_06B
    assert any("round away" in note for note in bf16.notes)
    assert not any("round away" in note for note in fp32.notes)


def test_local_runtime_counts_the_engine_on_the_trainers_gpu() -> None:
    common = ("algo=grpo", "engine.dtype=bfloat16", "engine.max_concurrent=8", "data.max_total_tokens=3000")
    sync = _plan(*common, "runtime.mode=sync")
    async_ = _plan(*common, "runtime.mode=async")
    assert sync.trainer_memory is not None and async_.trainer_memory is not None
    assert sync.trainer_memory.engine_weights == 2 * PARAMS_06B
    assert sync.trainer_memory.engine_kv == 0  # the local engine frees its cache while the trainer runs
    kv = local_engine_kv_bytes(sync.architecture, "bfloat16", 8, 3000)
    assert async_.trainer_memory.engine_kv == kv == 2 * 28 * 8 * 128 * 2 * 8 * 4096
    assert async_.trainer_peak_bytes_per_gpu - sync.trainer_peak_bytes_per_gpu == kv  # type: ignore[operator]


def test_checkpointing_defaults_to_on_with_a_gpu_and_the_largest_micro_batch_is_a_trajectory() -> None:
    plan = _plan("trainer.micro_batch_tokens=4096", "data.max_total_tokens=10000")
    assert plan.gradient_checkpointing and plan.micro_batch_tokens == 10_000
    assert plan.trainer_memory is not None and plan.trainer_memory.tokens == 10_000
    sizes = ("trainer.micro_batch_tokens=4096", "data.max_total_tokens=10000")
    off = _plan("model.gradient_checkpointing=false", *sizes)
    assert off.trainer_peak_bytes_per_gpu > plan.trainer_peak_bytes_per_gpu  # type: ignore[operator]
    cpu = resource_plan(load_config(None, [QWEN3_06B, "model.device=cpu"]))
    assert not cpu.gradient_checkpointing and cpu.trainer_memory is None


def test_formatted_plan_shows_the_trainer_peak_and_its_terms() -> None:
    plan = _plan("runtime.mode=sync", "engine.dtype=bfloat16")
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(format_resource_plan(plan))
    text = console.export_text()
    rows = ("trainer precision", "activations per GPU", "engine on the trainer GPU", "trainer peak per GPU")
    for row in rows:
        assert row in text
    assert (
        "gathered parameters" not in text
    )  # one process, checkpointed: no compute copy held through backward
    assert "compute bfloat16, master float32" in text
