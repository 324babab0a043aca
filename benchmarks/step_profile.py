"""Benchmark: where one trainer step's time goes, and the step against an earlier commit's, interleaved.

The batch is the shape of `vs_trl.py`'s job: 32 trajectories (4 prompts x 8) of a ~50-token rendered prompt
and 10 generated tokens (lengths vary by a few tokens, as the prompts' character sets do), on the
quickstart-size Qwen3-MoE (``sao init-model --arch qwen3_moe --size small``), float32, CPU, one torch
thread (the trainer's share of 2 cores under the thread plan). Presets ``grpo`` (PPO clip against π_old)
and ``sao`` (critic, K=2, DIS).

- ``--profile``: torch's profiler over 5 steps of the current code: the top operators by self time, and the
  step split into actor forward, backward, optimizer and the rest (`torch.profiler.record_function` spans
  read from the trace).
- ``--before REV``: the median step of this checkout against commit REV (checked out into a temporary git
  worktree), each measured in a fresh process (PYTHONPATH selects the source tree), arms interleaved,
  ``--reps`` times; prints both and the ratio.

    python benchmarks/step_profile.py --profile
    python benchmarks/step_profile.py --before 7fe767e --reps 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _batch(seed: int):
    import torch

    from sao.types import Batch, Trajectory

    gen = torch.Generator().manual_seed(seed)
    trajs = []
    for i in range(32):
        prompt = 48 + int(torch.randint(0, 5, (1,), generator=gen))
        n = prompt + 10
        ids = torch.randint(3, 250, (n,), generator=gen).tolist()
        action = [0] * prompt + [1] * 10
        trajs.append(Trajectory(
            prompt_id=f"p{i // 8}", token_ids=ids, action_mask=action,
            rollout_logprobs=[-3.0 if a else 0.0 for a in action],
            versions=[seed if a else -1 for a in action],
            turn_ids=[-1] * prompt + [0] * 10, rewards=[float(i % 3 == 0)], group_id=f"g{seed}-{i // 8}",
            traj_id=f"t{seed}-{i}",
        ))  # fmt: skip
    return Batch.from_trajectories(trajs)


def _trainer(model: Path, preset: str):
    from sao.config import load_config
    from sao.models.attention import PACKED_ATTENTION
    from sao.models.critic import load_critic
    from sao.models.loading import load_policy
    from sao.runtime import build

    extra = ["algo.group_size=8"] if preset == "grpo" else []
    cfg = load_config(None, [f"algo={preset}", *extra, f"model.path={model}", "model.dtype=float32",
                             "model.device=cpu", "trainer.lr=3e-3", "trainer.batch_size=32"])  # fmt: skip
    actor = load_policy(model, dtype="float32", device="cpu", attn_implementation=PACKED_ATTENTION)
    critic = None
    if cfg.algo.uses_critic:
        critic = load_critic(model, freeze=cfg.critic.freeze, dtype="float32", device="cpu", head_init="zero")
    if "loss" in type(cfg.algo).model_fields:  # typed algorithm configs (issue 29)
        return build.build_trainer(build.FACTORIES["trainer"](cfg), actor, critic)
    return build.build_trainer(cfg, actor, critic)  # an earlier commit: the trainer took the run config


def measure(model: Path, preset: str, steps: int) -> float:
    """Median seconds of ``steps`` trainer steps (after 3 untimed) on 4 cycled batches."""
    trainer = _trainer(model, preset)
    batches = [_batch(s) for s in range(4)]
    for i in range(3):
        trainer.train_step(batches[i % 4], policy_version=i)
    times = []
    for i in range(steps):
        t = time.perf_counter()
        trainer.train_step(batches[i % 4], policy_version=i)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def profile(model: Path, preset: str) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from sao.train import step as step_module
    from sao.train import step_critic

    trainer = _trainer(model, preset)
    batches = [_batch(s) for s in range(4)]
    for i in range(3):
        trainer.train_step(batches[i % 4], policy_version=i)
    phases = {"forward": step_module.token_logprobs, "critic fwd": step_critic.token_values,
              "optimizer": torch.optim.AdamW.step, "backward": torch.Tensor.backward}  # fmt: skip

    def spanned(name, fn):
        def wrapped(*args, **kwargs):
            with record_function(f"phase::{name}"):
                return fn(*args, **kwargs)

        return wrapped

    step_module.token_logprobs = spanned("forward", phases["forward"])
    step_critic.token_values = spanned("critic fwd", phases["critic fwd"])
    torch.optim.AdamW.step = spanned("optimizer", phases["optimizer"])
    torch.Tensor.backward = spanned("backward", phases["backward"])
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for i in range(5):
                with record_function("phase::step"):
                    trainer.train_step(batches[i % 4], policy_version=i)
    finally:
        step_module.token_logprobs = phases["forward"]
        step_critic.token_values = phases["critic fwd"]
        torch.optim.AdamW.step = phases["optimizer"]
        torch.Tensor.backward = phases["backward"]
    events = {e.key: e.cpu_time_total / 1e3 / 5 for e in prof.key_averages() if e.key.startswith("phase::")}
    total = events.pop("phase::step")
    print(
        f"{preset}: trainer step {total:.1f} ms (under the profiler, 1 thread), of which ('forward' is the "
        "actor's, 'backward' both models'):"
    )
    for key, ms in sorted(events.items(), key=lambda kv: -kv[1]):
        print(f"  {key.removeprefix('phase::'):10s} {ms:6.1f} ms  {ms / total:5.1%}")
    rest = total - sum(events.values())
    print(f"  {'rest':10s} {rest:6.1f} ms  {rest / total:5.1%}  (advantages, loss, metrics, host syncs)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="grpo,sao")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--before", default=None, help="a commit to compare the current step against")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--steps", type=int, default=8, help="timed steps per measurement")
    p.add_argument("--measure", default=None, help=argparse.SUPPRESS)  # internal: MODEL:PRESET
    args = p.parse_args()
    import torch
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    if args.measure:
        model, preset = args.measure.rsplit(":", 1)
        print(json.dumps({"step_s": measure(Path(model), preset, args.steps)}))
        return
    from harness import LoadWatch, Spread, interleaved, ratio

    with tempfile.TemporaryDirectory(prefix="step_profile_") as tmp:
        model = Path(tmp) / "model"
        subprocess.run([sys.executable, "-m", "sao", "init-model", "--arch", "qwen3_moe", "--size", "small",
                        "--out", str(model)], check=True, capture_output=True)  # fmt: skip
        presets = args.presets.split(",")
        if args.profile:
            for preset in presets:
                profile(model, preset)
        if args.before:
            base = Path(tmp) / "before"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.before],
                           check=True, capture_output=True)  # fmt: skip
            try:
                watch = LoadWatch()

                def run(src: Path, preset: str) -> float:
                    env = {**os.environ, "PYTHONPATH": str(src / "src")}
                    out = subprocess.run(
                        [sys.executable, str(HERE / "step_profile.py"), "--measure", f"{model}:{preset}",
                         "--steps", str(args.steps)], env=env, check=True, capture_output=True, text=True,
                    )  # fmt: skip
                    return json.loads(out.stdout.strip().splitlines()[-1])["step_s"]

                arms = {}
                for preset in presets:
                    arms[f"{preset} before"] = lambda rep, pr=preset: run(base, pr)
                    arms[f"{preset} after"] = lambda rep, pr=preset: run(ROOT, pr)
                res = interleaved(arms, args.reps)
                print(f"trainer step, median of {args.steps} steps per process, {args.reps} processes per "
                      f"arm (before = {args.before}):")  # fmt: skip
                for preset in presets:
                    b, a = res[f"{preset} before"], res[f"{preset} after"]
                    mid, spread = ratio(a, b)
                    print(
                        f"  {preset}: before {Spread(tuple(b)).fmt('.3f', ' s')}, after "
                        f"{Spread(tuple(a)).fmt('.3f', ' s')}; after / before {mid:.2f}x {spread.fmt('.2f')}"
                    )
                print("  " + watch.report())
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                               capture_output=True)  # fmt: skip


if __name__ == "__main__":
    main()
