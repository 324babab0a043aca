"""Exact resume (docs/faults.md, "SIGKILL, also mid-checkpoint"): a sync run SIGKILLed right after its
step-2 checkpoint and resumed logs the same steps 3-4 as the run that was never interrupted, to float
tolerance."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from sao.config import load_config
from sao.runtime.runner import train_sync_entry

from .test_runner import _OVERRIDES

# Sync SAO (critic pretrained on rollouts, K = 2) on long_tail, whose rewards vary; a cosine schedule with
# warm-up, so the lr depends on the restored scheduler. One sequence at a time in the engine: with more, a
# decode batch's make-up depends on timing and moves logits by ~1e-7, which now and then flips a sampled
# token, so even two uninterrupted runs can differ.
_EXACT = [
    *_OVERRIDES, "runtime.mode=sync", "data.env=long_tail", "data.max_turns=4", "engine.max_new_tokens=8",
    "engine.max_concurrent=1",
    "trainer.lr=3e-3", "critic.lr=3e-3", "trainer.batch_size=8", "trainer.total_steps=4",
    "trainer.lr_schedule=cosine", "trainer.warmup_steps=1", "logging.checkpoint_every=2",
]  # fmt: skip

# `sao train`, SIGKILLed by itself as soon as the step-2 checkpoint is written (a deterministic kill point).
_KILLED_AFTER_STEP_2 = """
import os, signal
from sao.train.checkpoint import CheckpointManager

save = CheckpointManager.save

def save_then_die(self, step, **kwargs):
    path = save(self, step, **kwargs)
    if step == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return path

CheckpointManager.save = save_then_die
from sao.cli import app
app(prog_name="sao")
"""

# Wall-clock measurements differ from run to run; everything else must match.
_TIMING = (
    "time",
    "throughput/",
    "runtime/weight_push_s",
    "weight_sync/probe_s",
    "runtime/trainer_idle_frac",
    "runtime/engine_idle_frac",
    "runtime/wait_s",  # seconds, and occupancy sampled at a moment: not training results
    "runtime/elapsed_s",
    "runtime/train_s",
    "runtime/in_flight",
    "runtime/engine_running",
)


def _steps(run_dir) -> dict[int, dict]:
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in records}


def test_a_sync_run_killed_after_a_checkpoint_resumes_exactly(tmp_path):
    import torch

    from sao.models.loading import load_policy

    whole, killed = tmp_path / "whole", tmp_path / "killed"
    train_sync_entry(load_config(None, [*_EXACT, f"logging.run_dir={whole}"]))

    overrides = [*_EXACT, f"logging.run_dir={killed}"]
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_AFTER_STEP_2, "train", *overrides],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert sorted(p.name for p in (killed / "checkpoints").glob("step_*")) == ["step_00000002"]
    train_sync_entry(load_config(None, overrides), resume=True)

    a, b = _steps(whole), _steps(killed)
    assert sorted(a) == sorted(b) == [0, 1, 2, 3, 4]
    rewards = {a[s]["reward/mean"] for s in (3, 4)}
    assert len(rewards) == 2 and rewards != {0.0}  # steps that learn from rewards that vary
    for step in (3, 4):
        keys = {k for k in a[step] if not k.startswith(_TIMING)}
        assert keys == {k for k in b[step] if not k.startswith(_TIMING)}, step
        for key in sorted(keys):
            if a[step][key] is None:  # NaN, written as null (e.g. the explained variance of constant returns)
                assert b[step][key] is None, (step, key)
                continue
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-4, abs=1e-6, nan_ok=True), (step, key)
    # the run's clock continues from its checkpoint: resumed steps count the time before the kill too
    assert b[3]["runtime/elapsed_s"] > b[2]["runtime/elapsed_s"] > b[1]["runtime/elapsed_s"] > 0
    # the books: the same trajectories started, trained and dropped (none lost: sync has none in flight)
    assert b[4]["runtime/started"] == b[4]["runtime/trained"] == 32.0 and b[4]["runtime/dropped"] == 0.0

    last = "checkpoints/step_00000004/actor"
    pa, pb = (load_policy(d / last, dtype="float32", device="cpu") for d in (whole, killed))
    for (name, x), (_, y) in zip(pa.named_parameters(), pb.named_parameters(), strict=True):
        torch.testing.assert_close(y, x, rtol=0, atol=1e-5, msg=name)
