"""Benchmark: the distributed runtime on one machine — engine replicas, trainer ranks, weight-sync paths.

One private Ray cluster (`sao.runtime.ray_cluster.RayCluster`) holds every arm at once, so the arms can be
interleaved (A, B, A, B, …) in the same conditions; only the arm being timed does any work.

1. Generation throughput, 1 vs 2 engine replicas (`EnginePool` of `LocalEngine` actors, 1 torch thread
   and 1 logical CPU each), in steady state as a run's producer keeps episodes in flight: agents, each an
   asyncio task (so the pool keeps it on one replica), request one completion after another from the
   long-tailed workload of ``benchmarks/engine.py`` (prompts of 16–64 tokens, ``max_new_tokens`` lognormal
   with median 48 and max 8x median, no stop token); tokens/s = the replicas' generated-token counters
   over an 8 s window. Arms: 1 replica with 64 agents; 2 replicas with 128 (the same load per replica:
   the scaling figure, target >= 1.7x); 2 replicas with 64 (the same total load, so half the batch per
   replica: on these tiny models a decode step costs about the same at any batch size, so this arm shows
   what splitting a fixed load costs). Timing one burst of requests to its last completion instead would
   measure the longest request's sequential decode, the same with any number of replicas.
2. Trainer step time, W = 1 vs W = 2 FSDP2 ranks (gloo, 1 thread each) of the `sao` preset on one batch of
   long-tailed trajectories. On 2 contended cores with gloo the 2-rank step is not expected to be faster:
   both ranks share the cores with the collectives (the figure is reported as measured).
3. Weight sync per path for the model: ``object_store``, ``broadcast`` (gloo), ``disk``, to 2 replicas;
   seconds per `WeightSync.push`.

Each figure: median and range over ``--repeats`` interleaved rounds (after one warm-up round), and the load
average before and after.

    python benchmarks/scaling.py                 # the "small" tiny Qwen3-MoE, 5 rounds, ~4 min on 2 cores
    python benchmarks/scaling.py --size test --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from sao.config import ClusterConfig, load_config
from sao.engine.local_weights import load_checkpoint_state
from sao.engine.types import SamplingParams
from sao.models.tiny import tiny_checkpoint
from sao.runtime.build import FACTORIES
from sao.runtime.engine_guard import SupervisedEngine
from sao.runtime.engine_pool import EnginePool
from sao.runtime.ray_backend import replica_starter
from sao.runtime.ray_cluster import RayCluster
from sao.runtime.trainer_group import TrainerGroup, TrainerGroupArgs
from sao.runtime.weight_sync import make_weight_sync
from sao.types import Batch, Trajectory
from workloads import long_tailed_lengths


def _summary(values: list[float]) -> str:
    return f"median {statistics.median(values):.3f}  range [{min(values):.3f}, {max(values):.3f}]"


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def _requests(args: argparse.Namespace) -> tuple[list[list[int]], list[int]]:
    gen = torch.Generator().manual_seed(args.seed)
    lengths = torch.randint(16, 65, (args.requests,), generator=gen).tolist()
    prompts = [torch.randint(3, 250, (n,), generator=gen).tolist() for n in lengths]
    return prompts, long_tailed_lengths(args.requests, args.median, args.tail, args.seed)


async def _generated(pool: EnginePool) -> float:
    """Tokens the pool's replicas have generated so far (their own counters)."""
    stats = await asyncio.gather(*(r.engine.actor.stats.remote() for r in pool.replicas))
    return sum(s["tokens_generated"] for s in stats)


async def _generate(pool: EnginePool, prompts: list[list[int]], new_tokens: list[int], concurrency: int,
                    seconds: float) -> float:  # fmt: skip
    """Steady-state tokens/s: ``concurrency`` agents (tasks, so each keeps its replica) request one
    long-tailed completion after another; the replicas' token counters are read at the start and the end
    of a ``seconds`` window, then the requests in flight drain (outside the window)."""
    counter = iter(range(10**9))
    stop = asyncio.Event()

    async def agent() -> None:
        while not stop.is_set():
            k = next(counter)
            i = k % len(prompts)
            await pool.generate(prompts[i], SamplingParams(max_new_tokens=new_tokens[i], seed=k))

    agents = [asyncio.create_task(agent()) for _ in range(concurrency)]
    await asyncio.sleep(1.0)  # every agent has its replica and the batches are full
    start, t0 = await _generated(pool), time.perf_counter()
    await asyncio.sleep(seconds)
    end, t1 = await _generated(pool), time.perf_counter()
    stop.set()
    await asyncio.gather(*agents)
    return (end - start) / (t1 - t0)


def _batch(n: int, seed: int, vocab: int = 250) -> Batch:
    """``n`` two-turn trajectories of long-tailed lengths (prompt, action, observation, action)."""
    gen = torch.Generator().manual_seed(seed)
    trajs = []
    for i, length in enumerate(long_tailed_lengths(n, 96, 6.0, seed, minimum=12)):
        p, o = 8, 4
        a1 = (length - p - o) // 2
        a2 = length - p - o - a1
        ids = torch.randint(3, vocab, (length,), generator=gen).tolist()
        action = [0] * p + [1] * a1 + [0] * o + [1] * a2
        turns = [-1] * p + [0] * (a1 + o) + [1] * a2
        trajs.append(Trajectory(
            traj_id=f"t{i}", prompt_id=f"p{i}", group_id=f"g{i}", token_ids=ids, action_mask=action,
            turn_ids=turns, rollout_logprobs=[-1.0 if a else 0.0 for a in action],
            versions=[0 if a else -1 for a in action], rewards=[float(i % 2)],
        ))  # fmt: skip
    return Batch.from_trajectories(trajs)


async def main(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="sao-scaling-"))
    model_dir = tiny_checkpoint(work / "model", "qwen3_moe", args.size, seed=0)
    cfg = load_config(None, ["model.tiny_arch=qwen3_moe", "model.dtype=float32", "model.device=cpu",
                             "trainer.lr=1e-4", "critic.lr=1e-4", f"trainer.batch_size={args.batch}",
                             "trainer.micro_batch_tokens=4096"])  # fmt: skip
    # bundles: trainer ranks 0 (W=1), 1-2 (W=2); engine replicas 3 (alone), 4-5 (the pair)
    cluster_cfg = ClusterConfig(num_cpus=6, trainer_workers=3, engine_replicas=3)
    print(
        f"load average at start: {_load()}  (2 cores; Ray cluster of 6 logical CPUs, one arm busy at a time)"
    )
    cluster = RayCluster.open(cluster_cfg)
    try:
        engine = FACTORIES["engine"](cfg)
        replicas = []
        for i in range(3):
            start = replica_starter(cluster, i, engine, model_dir, model_dir)

            async def latest():  # never called: nothing is restarted here
                raise RuntimeError("no restarts in the benchmark")

            replicas.append(SupervisedEngine(await start(), start, latest, max_restarts=0))
        one, two = EnginePool(replicas[:1]), EnginePool(replicas[1:])
        prompts, new_tokens = _requests(args)
        c = args.concurrency
        arms = {  # name: (pool, agents in flight)
            f"1 replica, {c} agents": (one, c),
            f"2 replicas, {2 * c} agents": (two, 2 * c),  # the same load per replica
            f"2 replicas, {c} agents": (two, c),  # the same total load, halved per replica
        }
        for pool, agents in arms.values():  # warm-up
            await _generate(pool, prompts, new_tokens, agents, 2.0)
        rates: dict[str, list[float]] = {name: [] for name in arms}
        for _ in range(args.repeats):
            for name, (pool, agents) in arms.items():
                rates[name].append(await _generate(pool, prompts, new_tokens, agents, args.window))
        base, weak, strong = rates.values()
        ratios = [b / a for a, b in zip(base, weak, strict=True)]
        strong_ratios = [b / a for a, b in zip(base, strong, strict=True)]
        print(f"\n1. generation, long-tailed requests (median {args.median} new tokens, tail {args.tail}x), "
              f"tokens/s in {args.window:g} s windows:")  # fmt: skip
        for name, values in rates.items():
            print(f"   {name:<22} {_summary(values)}")
        print(f"   2 replicas / 1 replica at {c} agents per replica: {_summary(ratios)}  (target >= 1.7)")
        print(f"   2 replicas / 1 replica at {c} agents in all:      {_summary(strong_ratios)}")

        group_args = TrainerGroupArgs(
            actor_dir=str(model_dir), critic_dir=str(model_dir), trainer=FACTORIES["trainer"](cfg),
            dtype="float32", device="cpu", threads=1, head_init="zero",
        )  # fmt: skip
        g1 = await asyncio.to_thread(TrainerGroup.create, cluster, group_args, [0])
        g2 = await asyncio.to_thread(TrainerGroup.create, cluster, group_args, [1, 2])
        batch = _batch(args.batch, args.seed)
        times: dict[str, list[float]] = {"W=1": [], "W=2": []}
        for round_ in range(args.repeats + 1):  # round 0 warms up
            for name, group in (("W=1", g1), ("W=2", g2)):
                t0 = time.perf_counter()
                await asyncio.to_thread(group.train_step, batch, policy_version=round_)
                if round_:
                    times[name].append(time.perf_counter() - t0)
        step_ratio = [b / a for a, b in zip(times["W=1"], times["W=2"], strict=True)]
        print(
            f"\n2. trainer step (sao preset, K=2, {args.batch} trajectories, {batch.num_tokens} tokens), s:"
        )
        for name, values in times.items():
            print(f"   {name:<11} {_summary(values)}")
        print(f"   W=2 / W=1 step time: {_summary(step_ratio)}  (2 ranks on 2 shared cores with gloo: "
              "no speed-up expected here)")  # fmt: skip

        pair = two
        names = ("object_store", "broadcast", "disk")
        paths = {p: make_weight_sync(p, g2, pair, work / "run", "gloo") for p in names}
        version = 100
        for sync in paths.values():  # warm-up (forms the broadcast group)
            version += 1
            await sync.push(version)
        push: dict[str, list[float]] = {p: [] for p in paths}
        for _ in range(args.repeats):
            for name, sync in paths.items():
                version += 1
                t0 = time.perf_counter()
                await sync.push(version)
                push[name].append(time.perf_counter() - t0)
        want = await asyncio.to_thread(g2.checksum)
        same = [await r.engine.actor.checksum.remote() == want for r in pair.replicas]
        params = sum(t.numel() for t in load_checkpoint_state(model_dir).values())
        print(f"\n3. weight sync to 2 replicas from W=2 ranks (model '{args.size}', {params} parameters, "
              "fp32), s per push:")  # fmt: skip
        for name, values in push.items():
            print(f"   {name:<13} {_summary(values)}")
        print(f"   replicas equal to the trainer after the last push: {same}")
    finally:
        cluster.close()
    print(f"\nload average at end: {_load()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="small", choices=["test", "small"])
    parser.add_argument("--requests", type=int, default=64, help="distinct prompts / lengths, cycled")
    parser.add_argument(
        "--concurrency", type=int, default=64, help="agents per replica (engine.max_concurrent 64)"
    )
    parser.add_argument("--window", type=float, default=8.0, help="seconds each generation figure is timed")
    parser.add_argument("--median", type=int, default=48)
    parser.add_argument("--tail", type=float, default=8.0)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    asyncio.run(main(parser.parse_args()))
