"""Benchmark: asynchronous SAO vs synchronous GRPO (and synchronous single rollout), end to end on CPU, on two
workloads, with the arms interleaved and repeated.

Workloads (``--workload``):

- ``compute``: the compute-bound toy. Env ``long_tail`` (1-8 turns per episode, drawn per episode), an
  instant environment, 32 tokens per turn: the trainer is the bottleneck. Reported beside the ratio: the
  analytic bound from the stage rates measured in the same runs and how close async gets to it.
- ``agentic``: env ``tool_latency``: every turn is a tool call that waits on a simulated remote service
  (lognormal latency, median 0.3 s, p99 3.1 s, capped at 8 s; wall time without local CPU), 1-50 turns per
  episode (power law), 8 tokens per turn. In a synchronous batch the slowest episode sets the pace.

Arms (same model, env, batch of trajectories per step, steps per run, 2 cores each):

1. ``async``: ``algo=sao runtime.mode=async``, the engine in its own process (``engine.backend=process``,
   1 torch thread) and the trainer in this one (1 thread): one core each.
2. ``grpo``: ``algo=grpo algo.group_size=8 runtime.mode=sync`` (batch 16 = 2 prompts x 8), the engine in
   this process at 1 thread (the fastest setting for the sync arms on these tiny models).
3. ``single`` (``--arms async,grpo,single``): ``algo=sao runtime.mode=sync``, one rollout per prompt.

Value pretraining is off and models are built before the loop, so the window is the training loop only:
from the first batch wait to the last step (its weight push included). Every run writes ``episodes.jsonl``
and ``timeline.jsonl`` (``logging.episodes``, ``logging.timeline_every_s``): the per-token lag at training,
episodes in flight and engine occupancy over time, and the inputs of ``sao plan --calibrate``. Per arm it
prints trained trajectories/s (median [range] over the repetitions), the first batch's fill as a share of
the window, the steady trainer idle share (batch waits after the first / rest of the window), the engine's
busy share, mean episodes in flight, mean sequences running in the engine, and the per-token lag.

    python benchmarks/async_vs_sync.py --workload compute --reps 5          # ~4 min on 2 cores
    python benchmarks/async_vs_sync.py --workload agentic --reps 5          # ~20 min
    python benchmarks/async_vs_sync.py --workload agentic --reps 5 --out benchmarks/results/agentic
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from harness import LoadWatch, Spread, interleaved, ratio
from sao.config import load_config
from sao.jsonl import iter_jsonl
from sao.runtime.runner import train_sync_entry

WORKLOADS: dict[str, dict[str, Any]] = {
    "compute": {
        "steps": {"async": 40, "grpo": 40, "single": 40},
        "max_new_tokens": 32, "max_total_tokens": 600, "max_turns": 8, "staleness": 2,
        "in_flight": 32, "size": "test",
        "env": ["data.env=long_tail", "data.env_kwargs={turns: episode}"],
    },
    "agentic": {
        "steps": {"async": 120, "grpo": 12, "single": 12},
        "max_new_tokens": 8, "max_total_tokens": 1400, "max_turns": 50, "staleness": 4,
        "in_flight": 80, "size": "test",
        "env": ["data.env=tool_latency"],
    },
}  # fmt: skip


def overrides(args: argparse.Namespace, run_dir: Path, arm: str) -> list[str]:
    """The config overrides of one arm (see the module docstring)."""
    w = WORKLOADS[args.workload]
    steps = args.steps or w["steps"][arm]
    common = [
        "model.tiny_arch=qwen3_moe", f"model.tiny_size={w['size']}", "model.dtype=float32",
        "model.device=cpu", "critic.lr=1e-3", "critic.pretrain.enabled=false",
        f"engine.max_new_tokens={w['max_new_tokens']}", f"engine.max_concurrent={max(w['in_flight'], 32)}",
        *w["env"], f"data.max_turns={w['max_turns']}", f"data.max_total_tokens={w['max_total_tokens']}",
        "trainer.lr=1e-3", f"trainer.batch_size={args.batch}", f"trainer.total_steps={steps}",
        f"trainer.seed={args.seed}", f"data.seed={args.seed}",
        f"logging.run_dir={run_dir}", "logging.tensorboard=false", f"logging.checkpoint_every={10**6}",
        "logging.episodes=true", f"logging.timeline_every_s={args.timeline_every_s}",
    ]  # fmt: skip
    if arm == "async":
        return [*common, "algo=sao", "runtime.mode=async", f"runtime.max_staleness={w['staleness']}",
                f"runtime.max_in_flight={w['in_flight']}", "engine.backend=process",
                "engine.threads=1"]  # fmt: skip
    if arm == "grpo":
        return [*common, "algo=grpo", f"algo.group_size={args.group}", "runtime.mode=sync",
                "engine.backend=local"]  # fmt: skip
    return [*common, "algo=sao", "runtime.mode=sync", "engine.backend=local"]


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [record for _, record in iter_jsonl(path)]


def measure(run_dir: Path) -> dict[str, Any]:
    """The figures of one finished run, from its metrics, episodes and timeline."""
    steps = [r for r in _jsonl(run_dir / "metrics.jsonl") if "runtime/train_s" in r]
    first = steps[0]
    first_s = first["runtime/wait_s"] + first["runtime/train_s"] + first["runtime/weight_push_s"]
    window = steps[-1]["time"] - first["time"] + first_s
    trained = sum(r["batch/trajectories"] for r in steps)
    steady_wait = sum(r["runtime/wait_s"] for r in steps[1:])
    episodes = _jsonl(run_dir / "episodes.jsonl")
    lag: Counter[int] = Counter()
    for e in episodes:
        lag.update({int(k): v for k, v in e["lag_counts"].items()})
    timeline = _jsonl(run_dir / "timeline.jsonl")
    t0, t1 = timeline[0], timeline[-1]
    dt = max(t1["t"] - t0["t"], 1e-9)
    busy = (t1["engine"]["busy_s"] - t0["engine"]["busy_s"]) / dt
    tokens = sorted(lag.elements())
    train_step = [r["runtime/train_s"] + r["runtime/weight_push_s"] for r in steps]
    return {
        "traj_per_s": trained / window,
        "window_s": window,
        "fill_share": first["runtime/wait_s"] / window,
        "steady_trainer_idle": steady_wait / max(window - first_s, 1e-9),
        "engine_busy": busy,
        "in_flight_mean": statistics.fmean(t["in_flight"] for t in timeline),
        "engine_running_mean": statistics.fmean(t["engine"].get("running", 0.0) for t in timeline),
        "lag_mean": statistics.fmean(tokens) if tokens else 0.0,
        "lag_p99": tokens[int(0.99 * (len(tokens) - 1))] if tokens else 0,
        "lag_max": tokens[-1] if tokens else 0,
        "lag_hist": {k: v / max(len(tokens), 1) for k, v in sorted(lag.items())},
        "turns_mean": statistics.fmean(len(e["turns"]) for e in episodes),
        "train_step_s": statistics.median(train_step),
        "wait_s": statistics.median(r["runtime/wait_s"] for r in steps[1:]) if len(steps) > 1 else 0.0,
        # engine-side generation rate while busy: trajectories finished per engine-busy second
        "gen_traj_per_busy_s": trained / max(t1["engine"]["busy_s"] - t0["engine"]["busy_s"], 1e-9),
        "trained": trained,
    }


def compute_bound(res: dict[str, list[dict[str, Any]]], batch: int) -> list[str]:
    """The analytic bound of async over sync GRPO from the measured stage rates (compute workload).

    Async trains at most min(generation capacity, trainer capacity): generation capacity = trajectories per
    engine-busy second in the async runs (the engine on its own core), trainer capacity = batch / (SAO step
    + push). Sync GRPO spends, per batch, the generation phase plus its own (cheaper) step.
    """
    a, g = res["async"], res["grpo"]
    gen = statistics.median(r["gen_traj_per_busy_s"] for r in a)
    train = statistics.median(batch / r["train_step_s"] for r in a)
    bound = min(gen, train)
    grpo = statistics.median(r["traj_per_s"] for r in g)
    achieved = statistics.median(r["traj_per_s"] for r in a)
    neck = "trainer" if train <= gen else "engine"
    idle = (
        statistics.median(r["steady_trainer_idle"] for r in a)
        if neck == "trainer"
        else 1 - statistics.median(r["engine_busy"] for r in a)
    )
    grpo_gen = statistics.median(r["wait_s"] for r in g)
    grpo_step = statistics.median(r["train_step_s"] for r in g)
    sao_step = statistics.median(r["train_step_s"] for r in a)
    return [
        f"stage rates (medians): async generation capacity {gen:.1f} traj/s of engine-busy time, SAO trainer "
        f"{train:.1f} traj/s (step+push {sao_step:.3f} s per {batch}); "
        f"sync GRPO per batch: generate {grpo_gen:.3f} s + step+push {grpo_step:.3f} s",
        f"analytic bound async <= min(generation, trainer) = {bound:.2f} traj/s: async / sync GRPO <= "
        f"{bound / grpo:.2f}x; measured {achieved / grpo:.2f}x = {achieved / bound:.0%} of the bound "
        f"(target >= 90 %); bottleneck stage: {neck}, its steady idle {idle:.1%} (target <= 5 %)",
    ]


def plot_occupancy(runs: dict[str, Path], path: Path) -> None:
    """Episodes in flight and engine sequences running over time, one panel per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(8, 2.6 * len(runs)), squeeze=False)
    for ax, (arm, run_dir) in zip(axes[:, 0], runs.items(), strict=True):
        tl = _jsonl(run_dir / "timeline.jsonl")
        t = [r["t"] for r in tl]
        ax.plot(t, [r["in_flight"] for r in tl], label="episodes in flight")
        ax.plot(t, [r["engine"].get("running", 0) for r in tl], label="engine: sequences running")
        ax.plot(t, [r["queued"] for r in tl], label="queued for the trainer", alpha=0.6)
        ax.set_title(arm)
        ax.set_ylabel("count")
        ax.legend(loc="upper right", fontsize=7)
    axes[-1, 0].set_xlabel("seconds since the loop started")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", default="compute", choices=sorted(WORKLOADS))
    parser.add_argument("--arms", default="async,grpo", help="comma-separated: async, grpo, single")
    parser.add_argument("--reps", type=int, default=5, help="repetitions of every arm (interleaved)")
    parser.add_argument(
        "--steps", type=int, default=None,
        help="trainer steps per run, every arm (default: the workload's per arm, so that each window is long "
        "against its first batch's fill and, for agentic, against the longest episodes)",
    )  # fmt: skip
    parser.add_argument("--batch", type=int, default=16, help="trajectories per trainer step")
    parser.add_argument("--group", type=int, default=8, help="GRPO group size (batch = prompts x group)")
    parser.add_argument("--timeline-every-s", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write results.json, the occupancy plot, and the last "
                        "repetition's run logs (planner inputs) here")  # fmt: skip
    args = parser.parse_args()
    arms = args.arms.split(",")
    torch.set_num_threads(1)
    watch = LoadWatch()
    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        # Untimed warm-up: one-time costs (allocator, kernels, imports, the tiny model's build) land here.
        warm = argparse.Namespace(**{**vars(args), "steps": 1})
        train_sync_entry(load_config(None, overrides(warm, root / "warmup", "single")))

        def arm_runner(arm: str):
            def run(rep: int) -> dict[str, Any]:
                run_dir = root / f"{arm}-{rep}"
                started = time.monotonic()
                train_sync_entry(load_config(None, overrides(args, run_dir, arm)))
                out = measure(run_dir)
                print(f"  rep {rep} {arm:>6}: {out['traj_per_s']:.2f} traj/s over {out['window_s']:.1f} s "
                      f"(run {time.monotonic() - started:.0f} s)", flush=True)  # fmt: skip
                return out

            return run

        results = interleaved({arm: arm_runner(arm) for arm in arms}, args.reps)
        last = {arm: root / f"{arm}-{args.reps - 1}" for arm in arms}
        if args.out:
            out = Path(args.out)
            plot_occupancy(last, out / "occupancy.png")
            for arm, run_dir in last.items():
                dest = out / "logs" / arm
                shutil.rmtree(dest, ignore_errors=True)
                dest.mkdir(parents=True)
                for name in ("metrics.jsonl", "episodes.jsonl", "timeline.jsonl", "config.yaml"):
                    shutil.copy(run_dir / name, dest / name)

    w = WORKLOADS[args.workload]
    print(
        f"\nworkload {args.workload}: {' '.join(w['env'])}, tiny qwen3_moe/{w['size']} fp32 CPU, "
        f"{w['max_new_tokens']} tokens/turn, <= {w['max_turns']} turns, "
        f"steps {args.steps or w['steps']} x {args.batch} "
        f"trajectories, {args.reps} interleaved repetitions; async: max_staleness {w['staleness']}, "
        f"max_in_flight {w['in_flight']}, engine process + trainer 1 thread each"
    )
    head = f"{'arm':<7}{'traj/s median [range]':>24}{'window s':>10}{'fill':>7}{'trainer idle':>13}"
    print(head + f"{'engine busy':>12}{'in flight':>10}{'running':>9}{'turns':>7}{'lag mean/p99/max':>18}")
    for arm, rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0] if isinstance(rs[0][k], (int, float))}
        print(
            f"{arm:<7}{Spread(tuple(r['traj_per_s'] for r in rs)).fmt():>24}{med['window_s']:>10.1f}"
            f"{med['fill_share']:>7.1%}{med['steady_trainer_idle']:>13.1%}{med['engine_busy']:>12.1%}"
            f"{med['in_flight_mean']:>10.1f}{med['engine_running_mean']:>9.1f}{med['turns_mean']:>7.2f}"
            f"{med['lag_mean']:>8.2f}/{med['lag_p99']:.0f}/{med['lag_max']:.0f}"
        )
    for arm, rs in results.items():
        hist = rs[-1]["lag_hist"]
        print(
            f"{arm}: per-token lag at training (last rep) "
            + " ".join(f"{k}:{v:.1%}" for k, v in hist.items())
        )
    ratios = {}
    for other in [a for a in arms if a != "async"]:
        med, spread = ratio(
            [r["traj_per_s"] for r in results["async"]], [r["traj_per_s"] for r in results[other]]
        )
        ratios[other] = {"median_ratio": med, "per_rep": list(spread.values)}
        target = " (target >= 3x)" if args.workload == "agentic" and other == "grpo" else ""
        print(f"async / sync-{other}: {med:.2f}x trajectories/s (ratio of medians; per-rep "
              f"{spread.low:.2f}-{spread.high:.2f}x){target}")  # fmt: skip
    bound_lines = compute_bound(results, args.batch) if {"async", "grpo"} <= set(arms) else []
    for line in bound_lines:
        print(line)
    print(watch.report())
    if args.out:
        summary = {"workload": args.workload, "args": vars(args), "settings": w, "ratios": ratios,
                   "arms": results, "bound": bound_lines, "load": watch.report()}  # fmt: skip
        (Path(args.out) / "results.json").write_text(json.dumps(summary, indent=1))
        print(f"wrote {args.out}/results.json, occupancy.png, logs/")
    print(
        "reproduce: HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/async_vs_sync.py "
        f"--workload {args.workload} --arms {args.arms} --reps {args.reps} "
        + (f"--steps {args.steps} " if args.steps else "")
        + f"--batch {args.batch} --group {args.group} --seed {args.seed}"
    )


if __name__ == "__main__":
    main()
