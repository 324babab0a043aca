"""Benchmark: asynchronous SAO vs synchronous GRPO vs synchronous single-rollout, end to end on CPU.

Same tiny Qwen3-MoE (fp32, CPU), same environment, same batch of trajectories per trainer step, same number
of trainer steps, 2 cores for every mode. Cores: the async run puts the engine in its own process
(``engine.backend=process``, 1 torch thread) and trains in this one (1 thread): one core each, the split
the issue suggests. The sync runs keep the engine in this process (``--sync-engine process`` measured the
same) at 1 torch thread, their fastest setting: on these tiny models 2 intra-op threads make every mode
slower, the sync ones about 2x (``--threads 2``), so "each phase on both cores" would handicap them.
``--engine local`` runs the async engine as a thread of this process instead (it then shares the
interpreter lock with the trainer).
The environment is ``long_tail`` (`sao.envs.long_tail`): turn counts drawn from a heavy tail (75 % of
episodes take 1-2 turns, 10 % take 6-8), short replies, a deterministic letter rule as reward.
By default (``--turns episode``) each episode draws its own turn count, so the 8 samples of a GRPO group
differ in length as agentic episodes do; ``--turns task`` fixes the count per prompt (every sample of a
group equally long, which favours group sampling: a batch of 2 prompts x 8 rarely holds a long prompt).

1. async SAO:   ``algo=sao runtime.mode=async runtime.max_staleness=S runtime.max_in_flight=2*batch
                  engine.backend=process engine.threads=1``
2. sync GRPO:   ``algo=grpo algo.group_size=8 runtime.mode=sync`` (batch 16 = 2 prompts x 8)
3. sync single: ``algo=sao runtime.mode=sync`` (one rollout per prompt, one-batch barrier)

Value pretraining is disabled (``critic.pretrain.enabled=false``) and model building happens before the
loop, so the timing is the training loop only: from the start of the first batch wait to the last step's
log line (checkpoint writes are skipped until the final step). Per run it reports trained trajectories/s
(trained / loop wall time), the trainer idle fraction (time waiting for a batch / loop time) and the engine
idle fraction (engine loop with nothing to run / engine uptime), both from the last metrics line; for
every run the per-token policy lag histogram (trainer version − version that generated the token) and the
per-trajectory version span, captured from the batches the trainer sees.

    python benchmarks/async_vs_sync.py      # default: 30 steps x 16 trajectories, ~50 s on 2 cores
    python benchmarks/async_vs_sync.py --steps 30 --size small --max-new-tokens 64 --max-total-tokens 1200
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

import sao.train.step as step_mod
from sao.config import load_config
from sao.runtime.runner import train_sync_entry
from sao.train.step_metrics import _version_span

_LAG: Counter[int] = Counter()
_SPAN: Counter[int] = Counter()
_original_batch_metrics = step_mod.batch_metrics


def _recording_batch_metrics(batch, policy_version):
    """`batch_metrics`, plus the per-token lag and per-trajectory span histograms of this batch."""
    action = batch.action_mask.bool()
    lag = (policy_version - batch.versions.long())[action]
    _LAG.update(lag.tolist())
    _SPAN.update(_version_span(batch).tolist())
    return _original_batch_metrics(batch, policy_version)


def _overrides(args: argparse.Namespace, run_dir: Path, mode: str) -> list[str]:
    common = [
        "model.tiny_arch=qwen3_moe", f"model.tiny_size={args.size}", "model.dtype=float32",
        "model.device=cpu", "critic.lr=1e-3", "critic.pretrain.enabled=false",
        f"engine.max_new_tokens={args.max_new_tokens}",
        f"engine.max_concurrent={max(2 * args.batch, args.in_flight)}",
        f"data.env={args.env}", "data.max_turns=8", f"data.max_total_tokens={args.max_total_tokens}",
        "trainer.lr=1e-3", f"trainer.batch_size={args.batch}", f"trainer.total_steps={args.steps}",
        f"trainer.seed={args.seed}", f"data.seed={args.seed}",
        f"logging.run_dir={run_dir}", "logging.tensorboard=false", f"logging.checkpoint_every={10**6}",
    ]  # fmt: skip
    engine = args.engine if mode == "async" else args.sync_engine
    common.append(f"engine.backend={engine}")
    if engine == "process":
        common.append(f"engine.threads={args.threads}")
    if args.env == "long_tail":
        common.append(f"data.env_kwargs={{turns: {args.turns}}}")
    if mode == "async":
        return [*common, "algo=sao", "runtime.mode=async", f"runtime.max_staleness={args.staleness}",
                f"runtime.max_in_flight={args.in_flight or 2 * args.batch}"]  # fmt: skip
    if mode == "grpo":
        return [*common, "algo=grpo", f"algo.group_size={args.group}", "runtime.mode=sync"]
    return [*common, "algo=sao", "runtime.mode=sync"]


def _run(args: argparse.Namespace, root: Path, mode: str) -> dict[str, float | str]:
    _LAG.clear()
    _SPAN.clear()
    run_dir = root / mode
    cfg = load_config(None, _overrides(args, run_dir, mode))
    start = time.monotonic()
    result = train_sync_entry(cfg)
    total_s = time.monotonic() - start
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "throughput/trajectories_per_s" in r]
    first = steps[0]
    first_s = (
        first["batch/trajectories"] / first["throughput/trajectories_per_s"] + first["runtime/weight_push_s"]
    )
    loop_s = steps[-1]["time"] - first["time"] + first_s
    trained = sum(r["batch/trajectories"] for r in steps)
    n_lag = sum(_LAG.values()) or 1
    return {
        "mode": mode,
        "steps": result.steps,
        "trained": trained,
        "loop_s": loop_s,
        "total_s": total_s,
        "traj_per_s": trained / loop_s,
        "trainer_idle": steps[-1]["runtime/trainer_idle_frac"],
        "engine_idle": steps[-1]["runtime/engine_idle_frac"],
        "lag_mean": sum(k * v for k, v in _LAG.items()) / n_lag,
        "lag_max": max(_LAG, default=0),
        "lag_hist": " ".join(f"{k}:{v / n_lag:.0%}" for k, v in sorted(_LAG.items())),
        "span_hist": " ".join(f"{k}:{v}" for k, v in sorted(_SPAN.items())),
        "turns_mean": statistics.fmean(r["batch/turns_mean"] for r in steps),
        "dropped": result.counters.get("dropped", 0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=30, help="trainer steps per run (same for all)")
    parser.add_argument("--batch", type=int, default=16, help="trajectories per trainer step")
    parser.add_argument("--group", type=int, default=8, help="GRPO group size (batch = prompts x group)")
    parser.add_argument("--staleness", type=int, default=2, help="async runtime.max_staleness")
    parser.add_argument("--in-flight", type=int, default=0, help="async max_in_flight (0: 2 x batch)")
    parser.add_argument("--size", default="test", choices=["test", "small"], help="tiny model size")
    parser.add_argument("--env", default="long_tail")
    parser.add_argument(
        "--turns",
        default="episode",
        choices=["episode", "task"],
        help="long_tail: turn count per episode or per task",
    )
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens per model turn")
    parser.add_argument("--max-total-tokens", type=int, default=600)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads, all runs (1: fastest for every mode)"
    )
    parser.add_argument(
        "--engine", default="process", choices=["process", "local"],
        help="async run's engine: its own process (default) or a thread of the trainer's process",
    )  # fmt: skip
    parser.add_argument(
        "--sync-engine", default="local", choices=["process", "local"], help="sync runs' engine"
    )
    parser.add_argument("--modes", default="async,grpo,single", help="comma-separated subset, in run order")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-warmup", dest="warmup", action="store_false", help="skip the untimed warm-up")
    parser.add_argument("--run-root", default=None, help="keep run directories here (default: a temp dir)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    step_mod.batch_metrics = _recording_batch_metrics
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.run_root or tmp)
        if args.warmup:  # one untimed 1-step run: one-time costs (allocator, kernels, imports) land here
            _run(argparse.Namespace(**{**vars(args), "steps": 1}), root / "warmup", "single")
        results = {m: _run(args, root, m) for m in args.modes.split(",")}

    print(
        f"workload: env={args.env} (turns per {args.turns}), tiny qwen3_moe/{args.size} fp32 CPU, "
        f"torch threads {torch.get_num_threads()} per process (async engine: {args.engine}, "
        f"sync engine: {args.sync_engine}), {args.steps} steps x {args.batch} "
        f"trajectories, {args.max_new_tokens} tokens/turn, value pretraining off"
    )
    head = f"{'run':<8}{'trained':>8}{'loop s':>8}{'traj/s':>8}{'trainer idle':>13}{'engine idle':>12}"
    print(head + f"{'turns':>7}{'lag mean':>9}{'lag max':>8}{'dropped':>8}")
    for r in results.values():
        print(
            f"{r['mode']:<8}{r['trained']:>8.0f}{r['loop_s']:>8.1f}{r['traj_per_s']:>8.2f}"
            f"{r['trainer_idle']:>13.1%}{r['engine_idle']:>12.1%}{r['turns_mean']:>7.2f}"
            f"{r['lag_mean']:>9.2f}{r['lag_max']:>8}{r['dropped']:>8}"
        )
    for r in results.values():
        print(
            f"{r['mode']}: per-token lag histogram {r['lag_hist']}; "
            f"per-trajectory version span {r['span_hist']}"
        )
    if "async" in results:
        for other in ("grpo", "single"):
            if other in results:
                ratio = results["async"]["traj_per_s"] / results[other]["traj_per_s"]
                print(f"async / sync-{other}: {ratio:.2f}x trajectories/s (target >= 2x)")
    print(
        "reproduce: HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/async_vs_sync.py "
        f"--steps {args.steps} --batch {args.batch} --group {args.group} --staleness {args.staleness} "
        f"--turns {args.turns} "
        f"--size {args.size} --max-new-tokens {args.max_new_tokens} --engine {args.engine} "
        f"--sync-engine {args.sync_engine} "
        f"--max-total-tokens {args.max_total_tokens} --threads {args.threads} --seed {args.seed}"
    )


if __name__ == "__main__":
    main()
