"""Benchmark: sao side by side with TRL's `GRPOTrainer` on the same job, arms interleaved and repeated.

Jobs (``--job``; both sides load the same model directory; 32 completions per step, 4 prompts x 8 for the
GRPO arms; constant lr, no KL, float32 on CPU):

- ``charset`` (default): one-turn tasks "Write only characters from: <set>" (`charset_env.py`), rewarded by
  the share of allowed characters; the quickstart-size Qwen3-MoE built from scratch (``sao init-model
  --arch qwen3_moe --size small``, once per benchmark); at most 10 new tokens, lr 3e-3;
- ``calculator``: the multi-turn tool job of the quickstart (sao's ``calculator`` env: call the ``calc``
  tool, then answer; reward 1 for the right answer read off the tool), TRL with ``tools=[calc]``
  (`calculator_job.py`); the model must already call the tool: ``--model`` a warm start such as the
  quickstart's SFT checkpoint (``runs/quickstart/sft`` after ``make demo``); up to 3 turns of 64 tokens,
  lr 1e-4.

Arms (each in a process of its own, the machine's cores for each):

- ``trl``: TRL GRPO (`trl_arm.py`, in TRL's own virtualenv ``.venv-trl``: ``make .venv-trl``), torch
  threads = the cores (its fastest setting here; it generates and trains in turn);
- ``grpo_sync``: ``sao train algo=grpo algo.group_size=8 runtime.mode=sync``;
- ``grpo_dis_async``: ``algo=grpo_dis algo.group_size=8 runtime.mode=async``;
- ``sao_async``: ``algo=sao`` (one rollout per prompt, learned critic, K=2), async; value pretraining off
  (as in async_vs_sync.py), so its critic starts untrained;
- ``grpo_sync_t<N>`` (optional): ``grpo_sync`` with ``engine.threads=N trainer.threads=N`` — the
  thread plan's alternative, to measure the default against.

sao arms run with the defaults a user gets (thread plan, in-process engine, staleness bound), OMP_NUM_THREADS
unset. Measured: the training window (sao: from the first batch wait to the end of the last step and its
weight push, model loading and engine start excluded; TRL: ``trainer.train()``, which starts with the first
generation), wall per step and trajectories/s; per step the batch's mean reward; for sao also the trainer
step alone (``runtime/train_s``). Printed: medians [ranges] over the repetitions, the ratios sao / TRL, the
reward curves summarised (first and last 10 steps, median over repetitions), and the load average.

    make .venv-trl                                        # TRL 1.16 in its own virtualenv (once)
    python benchmarks/vs_trl.py --reps 5                  # ~20 min on 2 cores
    python benchmarks/vs_trl.py --reps 1 --steps 10       # a smoke run
    python benchmarks/vs_trl.py --job calculator --model runs/quickstart/sft   # after make demo
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from harness import LoadWatch, Spread, interleaved, ratio

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BATCH = 32  # completions per step
GROUP = 8
JOBS: dict[str, dict[str, Any]] = {
    "charset": {"lr": 3e-3, "max_new_tokens": 10,
                "sao": [f"data.env={HERE / 'charset_env.py'}:CharsetEnv", "data.max_turns=1",
                        "data.max_total_tokens=128"]},
    "calculator": {"lr": 1e-4, "max_new_tokens": 64,
                   "sao": ["data.env=calculator", "data.max_turns=3", "data.max_total_tokens=355"]},
}  # fmt: skip

SAO_ARMS: dict[str, list[str]] = {
    "grpo_sync": ["algo=grpo", f"algo.group_size={GROUP}", "runtime.mode=sync"],
    "grpo_dis_async": ["algo=grpo_dis", f"algo.group_size={GROUP}", "runtime.mode=async"],
    "sao_async": ["algo=sao", "runtime.mode=async", "critic.pretrain.enabled=false"],
}


def sao_overrides(
    arm: str, model: Path, run_dir: Path, steps: int, seed: int, job: str = "charset"
) -> list[str]:
    """The config overrides of one sao arm on ``job`` (module docstring)."""
    base, _, threads = arm.partition("_t")
    if base not in SAO_ARMS:
        raise ValueError(f"unknown sao arm {arm!r}")
    extra = [f"engine.threads={threads}", f"trainer.threads={threads}"] if threads else []
    return [
        f"model.path={model}", "model.dtype=float32", "model.device=cpu", *JOBS[job]["sao"],
        f"engine.max_new_tokens={JOBS[job]['max_new_tokens']}", "engine.temperature=1.0",
        f"trainer.lr={JOBS[job]['lr']}", f"trainer.batch_size={BATCH}", f"trainer.total_steps={steps}",
        f"trainer.seed={seed}", f"data.seed={seed}",
        f"logging.run_dir={run_dir}", "logging.tensorboard=false", f"logging.checkpoint_every={10**6}",
        *SAO_ARMS[base], *extra,
    ]  # fmt: skip


def run_sao_arm(arm: str, model: Path, steps: int, seed: int, job: str) -> dict[str, Any]:
    """One sao run in this process; the figures from its metrics."""
    from sao.config import load_config
    from sao.jsonl import iter_jsonl
    from sao.runtime.runner import train_sync_entry

    with tempfile.TemporaryDirectory(prefix=f"vs_trl_{arm}_") as tmp:
        run_dir = Path(tmp) / "run"
        train_sync_entry(load_config(None, sao_overrides(arm, model, run_dir, steps, seed, job)))
        rows = [r for _, r in iter_jsonl(run_dir / "metrics.jsonl") if "runtime/train_s" in r]
    first = rows[0]
    window = rows[-1]["time"] - first["time"] + first["runtime/wait_s"] + first["runtime/train_s"]
    window += first.get("runtime/weight_push_s", 0.0)
    return {
        "arm": arm,
        "steps": len(rows),
        "wall_s": window,
        "trajectories": sum(r["batch/trajectories"] for r in rows),
        "reward": [r["reward/mean"] for r in rows],
        "train_s": [r["runtime/train_s"] for r in rows],
        "threads": (rows[-1].get("trainer/threads"), rows[-1].get("runtime/engine_threads")),
        "old_logprob_forward": sum(r.get("actor/old_logprob_forward", 0.0) for r in rows),
    }


def run_arm(arm: str, args: argparse.Namespace, model: Path, rep: int) -> dict[str, Any]:
    """One arm in a fresh process; its JSON result (the last line of its stdout)."""
    seed = args.seed + rep
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if arm == "trl":
        cmd = [args.trl_python, str(HERE / "trl_arm.py"), "--model", str(model), "--steps", str(args.steps),
               "--prompts-per-step", str(BATCH // GROUP), "--generations", str(GROUP),
               "--max-new-tokens", str(JOBS[args.job]["max_new_tokens"]), "--lr", str(JOBS[args.job]["lr"]),
               "--threads", str(args.trl_threads), "--seed", str(seed), "--job", args.job]  # fmt: skip
    else:
        cmd = [sys.executable, __file__, "--sao-arm", arm, "--model", str(model), "--steps", str(args.steps),
               "--seed", str(seed), "--job", args.job]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"arm {arm} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["traj_per_s"] = result["trajectories"] / result["wall_s"]
    result["step_wall_s"] = result["wall_s"] / result["steps"]
    return result


def reward_summary(runs: list[dict[str, Any]]) -> str:
    """Mean reward of the first and last 10 steps: median [range] over the repetitions."""
    first = Spread(tuple(statistics.fmean(r["reward"][:10]) for r in runs))
    last = Spread(tuple(statistics.fmean(r["reward"][-10:]) for r in runs))
    return f"reward first 10 steps {first.fmt('.3f')}, last 10 steps {last.fmt('.3f')}"


def report(res: dict[str, list[dict[str, Any]]], watch: LoadWatch, job: str) -> None:
    print(f"\nvs TRL, job {job}: {BATCH} completions per step, lr {JOBS[job]['lr']:g}, "
          f"{res[next(iter(res))][0]['steps']} steps, "
          f"{len(next(iter(res.values())))} repetitions, {watch.cores} cores")  # fmt: skip
    for arm, runs in res.items():
        walls = Spread(tuple(r["wall_s"] for r in runs))
        step = Spread(tuple(r["step_wall_s"] for r in runs))
        rate = Spread(tuple(r["traj_per_s"] for r in runs))
        line = f"  {arm:16s} wall {walls.fmt('.1f', ' s')}, per step {step.fmt('.3f', ' s')}, "
        line += f"{rate.fmt('.1f')} traj/s; {reward_summary(runs)}"
        if "train_s" in runs[0]:
            trainer = Spread(tuple(statistics.median(r["train_s"]) for r in runs))
            line += (
                f"; trainer step {trainer.fmt('.3f', ' s')}, threads (trainer, engine) {runs[0]['threads']}"
            )
        else:
            parts = [[a - b for a, b in zip(r["step_s"], r["gen_s"], strict=True)] for r in runs]
            train = Spread(tuple(statistics.median(p) for p in parts))
            line += f"; training part of a step {train.fmt('.3f', ' s')}, torch threads {runs[0]['threads']}"
        print(line)
    if "trl" in res:
        trl = [r["wall_s"] for r in res["trl"]]
        for arm in res:
            if arm == "trl":
                continue
            mid, spread = ratio([r["wall_s"] for r in res[arm]], trl)
            target = {"grpo_sync": " (target <= 1.0)", "grpo_dis_async": " (target <= 0.7)"}.get(arm, "")
            print(f"  {arm} / trl wall for the same trajectories: {mid:.2f}x {spread.fmt('.2f')}{target}")
    print("  " + watch.report())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--arms",
        default="trl,grpo_sync,grpo_dis_async,sao_async",
        help="comma-separated: trl, grpo_sync, grpo_dis_async, sao_async, grpo_sync_t<N>",
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trl-python", default=str(ROOT / ".venv-trl" / "bin" / "python"))
    parser.add_argument("--trl-threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", default=None, help="write every run's figures to this JSON file")
    parser.add_argument("--sao-arm", default=None, help=argparse.SUPPRESS)  # internal: one sao run
    parser.add_argument("--job", default="charset", choices=sorted(JOBS))
    parser.add_argument(
        "--model",
        default=None,
        help="the model directory (default for charset: a fresh "
        "small Qwen3-MoE; calculator needs a warm start that calls the tool)",
    )
    args = parser.parse_args()
    if args.sao_arm:
        print(json.dumps(run_sao_arm(args.sao_arm, Path(args.model), args.steps, args.seed, args.job)))
        return
    arms = args.arms.split(",")
    if "trl" in arms and not Path(args.trl_python).is_file():
        raise SystemExit(
            f"no TRL virtualenv at {args.trl_python}: run `make .venv-trl` (or pass --trl-python)"
        )
    with tempfile.TemporaryDirectory(prefix="vs_trl_") as tmp:
        if args.model:
            model = Path(args.model).resolve()
        elif args.job == "charset":
            model = Path(tmp) / "model"
            init = ["init-model", "--arch", "qwen3_moe", "--size", "small", "--out", str(model)]
            subprocess.run([sys.executable, "-m", "sao", *init], check=True, capture_output=True)
        else:
            raise SystemExit(
                "--job calculator needs --model: a warm start that calls the tool "
                "(e.g. runs/quickstart/sft after make demo)"
            )
        watch = LoadWatch()

        def show(arm: str, rep: int, r: dict[str, Any]) -> None:
            print(f"rep {rep} {arm}: wall {r['wall_s']:.1f} s, {r['traj_per_s']:.1f} traj/s, "
                  f"last-10 reward {statistics.fmean(r['reward'][-10:]):.3f}", flush=True)  # fmt: skip

        runners = {arm: (lambda rep, a=arm: run_arm(a, args, model, rep)) for arm in arms}
        res = interleaved(runners, args.reps, show)
    report(res, watch, args.job)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
