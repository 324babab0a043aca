"""scripts/gpu_check.py's CPU dry run: the GPU check's path (a shaped checkpoint, `sao train` through the CLI,
the metrics it reads, the resource model's prediction) works before any GPU sees it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_dry_run_trains_on_policy_and_reports_the_prediction(tmp_path: Path) -> None:
    from sao.config import load_config
    from sao.plan.resources import resource_plan

    script = str(ROOT / "scripts" / "gpu_check.py")
    cmd = [sys.executable, script, "--device", "cpu", "--tiny", "--steps", "2",
           "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert summary["trained_all_steps"] and summary["on_policy"] and summary["dis_ratio_ok"]
    assert [row["step"] for row in summary["steps"]] == [1, 2]
    assert all(row["tokens_per_s"] > 0 and abs(row["dis_ratio_mean"] - 1) < 0.02 for row in summary["steps"])
    checkpoint = tmp_path / "work" / "qwen3-0.6b-tiny"
    overrides = [f"model.path={checkpoint}", "model.device=cuda", "engine.max_new_tokens=96",
                 "data.max_total_tokens=256", "trainer.batch_size=4"]  # fmt: skip
    plan = resource_plan(load_config(ROOT / "configs" / "gpu_check.yaml", overrides))
    assert summary["prediction"]["planned_peak_bytes"] == plan.trainer_peak_bytes_per_gpu
    assert "sdpa kernel per trajectory" in done.stdout and "predicted trainer peak" in done.stdout
