"""Benchmark: the cost of one SAO trainer step over one GRPO trainer step, on the same batches, on CPU.

Same tiny Qwen3-MoE (fp32, CPU), same batches of real trajectories, same process and torch threads; only
the preset differs:

- sao:  ``algo=sao``  (critic: K=2 critic steps, then the critic's values again; skip-observation GAE; DIS
        loss against the rollout log-probs, so no old-log-prob forward);
- grpo: ``algo=grpo`` (no critic; group-normalised outcome advantages; PPO clip-higher against the old
        log-probs, so one no-grad actor forward before the actor step).

The batches are generated once, before any timing: a `LocalEngine` on the initial weights plays
``--env`` (default ``long_tail``, turn counts drawn per episode), each task ``algo.group_size`` times with
a shared group id (GRPO needs whole groups; SAO ignores the ids), packed with `Batch.from_trajectories`.
Each arm then gets its own trainer on fresh copies of the same initial actor (and, for SAO, critic with a
zero value head) weights. Steps are interleaved: step i of one arm, step i of the other (which arm goes
first alternates), on batch i (cycled), so load from other processes hits both arms alike. The first
``--warmup`` steps of each arm are untimed; then ``--steps`` timed repeats of
``trainer.train_step(batch, policy_version=i)``. It prints per-arm median / min / max seconds, the
ratio of the medians and the per-repeat ratios' median and range, and the load average.

    python benchmarks/step_cost.py                   # default: small model, 8 repeats x 16 trajectories
    python benchmarks/step_cost.py --size test --steps 20 --threads 2
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import transformers

from sao.config import load_config
from sao.engine.local import LocalEngine
from sao.envs.factory import make_env
from sao.models.attention import enable_packed_attention
from sao.models.critic import load_critic
from sao.models.loading import load_policy, load_tokenizer, model_from_config
from sao.rollout.agent_loop import AgentLoopConfig
from sao.runtime.rollouts import collect_rollouts
from sao.types import Batch, Trajectory

ARMS = ("sao", "grpo")


def make_trainer(cfg, actor, critic):
    try:
        from sao.runtime.build import FACTORIES, build_trainer  # after the refactor
    except ImportError:
        from sao.train.step import Trainer

        return Trainer(actor, critic, cfg)
    return build_trainer(FACTORIES["trainer"](cfg), actor, critic)


def _overrides(args: argparse.Namespace) -> list[str]:
    overrides = [
        "model.tiny_arch=qwen3_moe", f"model.tiny_size={args.size}", "model.dtype=float32",
        "model.device=cpu", "critic.lr=1e-3", "critic.pretrain.enabled=false",
        f"engine.max_new_tokens={args.max_new_tokens}", f"engine.max_concurrent={args.batch_size}",
        f"data.env={args.env}", f"data.max_turns={args.max_turns}",
        f"data.max_total_tokens={args.max_total_tokens}", f"data.seed={args.seed}",
        "trainer.lr=1e-3", f"trainer.batch_size={args.batch_size}",
        f"trainer.total_steps={args.warmup + args.steps}", f"trainer.seed={args.seed}",
        f"algo.group_size={args.group}", "logging.tensorboard=false",
    ]  # fmt: skip
    if args.env == "long_tail":
        overrides.append(f"data.env_kwargs={{turns: {args.turns}}}")
    return overrides


async def _make_batches(args: argparse.Namespace, cfg, base: Path, tokenizer, n_batches: int) -> list[Batch]:
    """``n_batches`` batches of ``batch_size`` trajectories: whole groups of ``group`` plays of one task."""
    groups_per_batch = args.batch_size // args.group
    n_groups = n_batches * groups_per_batch
    tasks = importlib.import_module(f"sao.envs.{args.env}").make_tasks(n_groups, seed=args.seed)
    repeated = [task for task in tasks for _ in range(args.group)]  # each task group-size times in a row
    loop_cfg = AgentLoopConfig(
        max_turns=cfg.data.max_turns,
        max_total_tokens=cfg.data.max_total_tokens,
        max_tokens_per_turn=cfg.engine.max_new_tokens,
        temperature=cfg.engine.temperature,
        top_p=cfg.engine.top_p,
        top_k=cfg.engine.top_k,
    )
    engine = LocalEngine(base, tokenizer, device="cpu", dtype="float32", max_running=args.batch_size,
                         seed=args.seed)  # fmt: skip
    try:
        trajs = await collect_rollouts(
            engine, tokenizer, lambda: make_env(args.env, **cfg.data.env_kwargs), repeated, len(repeated),
            loop_cfg, concurrency=args.batch_size, seed=args.seed,
        )  # fmt: skip
    finally:
        await engine.close()
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for traj in trajs:  # a failed episode is skipped by collect_rollouts: keep only whole groups
        traj.group_id = traj.prompt_id
        by_task[traj.prompt_id].append(traj)
    whole = [g for g in by_task.values() if len(g) == args.group]
    if len(whole) < groups_per_batch:
        raise RuntimeError(f"only {len(whole)} whole groups of {args.group} were played")
    return [
        Batch.from_trajectories([t for g in whole[i : i + groups_per_batch] for t in g])
        for i in range(0, len(whole) - groups_per_batch + 1, groups_per_batch)
    ]


def _trainer(cfg, base: Path):
    """A trainer on fresh copies of the initial weights (the critic: the same backbone, a zero value head)."""
    actor = enable_packed_attention(load_policy(base, dtype=cfg.model.dtype, device=cfg.model.device))
    critic = None
    if cfg.algo.uses_critic:
        critic = load_critic(base, freeze="none", dtype=cfg.model.dtype, device=cfg.model.device)
    return make_trainer(cfg, actor, critic)


def _spread(xs: list[float], fmt: str = ".3f") -> str:
    return f"median {statistics.median(xs):{fmt}} (min {min(xs):{fmt}}, max {max(xs):{fmt}})"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="small", choices=["test", "small"], help="tiny model size")
    parser.add_argument("--batch-size", type=int, default=16, help="trajectories per trainer step")
    parser.add_argument("--group", type=int, default=8, help="GRPO group size (batch = prompts x group)")
    parser.add_argument("--steps", type=int, default=8, help="timed repeats per arm (after the warm-up)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per arm first")
    parser.add_argument("--batches", type=int, default=0, help="distinct batches, cycled (0: warmup+steps)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--env", default="long_tail")
    parser.add_argument(
        "--turns", default="episode", choices=["episode", "task"],
        help="long_tail: turn count per episode or per task",
    )  # fmt: skip
    parser.add_argument("--max-turns", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens per model turn")
    parser.add_argument("--max-total-tokens", type=int, default=600)
    args = parser.parse_args()
    if args.batch_size % args.group:
        parser.error(f"--batch-size ({args.batch_size}) must be a multiple of --group ({args.group})")
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be >= 1 and --warmup >= 0")

    transformers.logging.set_verbosity_error()  # the critic's "new value head" load report
    transformers.logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfgs = {arm: load_config(None, [*_overrides(args), f"algo={arm}"]) for arm in ARMS}
    with tempfile.TemporaryDirectory() as tmp:
        base = model_from_config(cfgs["sao"].model, tmp, seed=args.seed)
        tokenizer = load_tokenizer(base)
        start = time.perf_counter()
        batches = asyncio.run(
            _make_batches(args, cfgs["sao"], base, tokenizer, args.batches or args.warmup + args.steps)
        )
        gen_s = time.perf_counter() - start
        trainers = {arm: _trainer(cfgs[arm], base) for arm in ARMS}

    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    last: dict[str, dict[str, float]] = {}
    load_start = os.getloadavg()
    for i in range(args.warmup + args.steps):
        batch = batches[i % len(batches)]
        for arm in ARMS if i % 2 == 0 else ARMS[::-1]:
            start = time.perf_counter()
            last[arm] = trainers[arm].train_step(batch, policy_version=i)
            seconds = time.perf_counter() - start
            if i >= args.warmup:
                times[arm].append(seconds)

    tokens = [b.num_tokens for b in batches]
    action = [int(b.action_mask.sum()) for b in batches]
    print(
        f"workload: env={args.env}" + (f" (turns per {args.turns})" if args.env == "long_tail" else "")
        + f", tiny qwen3_moe/{args.size} fp32 CPU, torch threads {torch.get_num_threads()}, "
        f"{len(batches)} batches x {args.batch_size} trajectories ({args.batch_size // args.group} groups "
        f"of {args.group}), {statistics.mean(tokens):.0f} tokens/batch ({min(tokens)}-{max(tokens)}), "
        f"{statistics.mean(action):.0f} action tokens/batch; generated in {gen_s:.1f} s"
    )  # fmt: skip
    print(f"{args.warmup} warm-up + {args.steps} timed steps per arm, interleaved; seconds per train_step:")
    for arm in ARMS:
        m = last[arm]
        counts = ", ".join(
            f"{name} {m[key]:.0f}"
            for name, key in (
                ("actor steps", "trainer/actor_steps"),
                ("critic steps", "trainer/critic_steps"),
            )
            if key in m
        )
        print(f"  {arm:<5} {_spread(times[arm])}  [{counts}]")
    ratios = [s / g for s, g in zip(times["sao"], times["grpo"], strict=True)]
    median_ratio = statistics.median(times["sao"]) / statistics.median(times["grpo"])
    print(
        f"SAO / GRPO step time: {median_ratio:.2f}x (ratio of medians); per repeat {_spread(ratios, '.2f')}"
    )
    load = ", ".join(f"{x:.2f}" for x in load_start), ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average (1, 5, 15 min): {load[0]} before the timed loop, {load[1]} after")
    print(
        "reproduce: HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/step_cost.py "
        f"--size {args.size} --batch-size {args.batch_size} --group {args.group} --steps {args.steps} "
        f"--warmup {args.warmup} --batches {len(batches)} --threads {args.threads} --seed {args.seed} "
        f"--env {args.env} --turns {args.turns} --max-turns {args.max_turns} "
        f"--max-new-tokens {args.max_new_tokens} --max-total-tokens {args.max_total_tokens}"
    )


if __name__ == "__main__":
    main()
