"""Benchmark: engine time per turn of a long agentic episode, with and without the KV kept across turns.

Workload (defaults): the "small" tiny Qwen3-MoE (hidden 128, 3 layers, 8 experts top-2) in a `LocalEngine`;
one episode of 50 turns alone on the engine: a 200-token first prompt, then per turn ``--gen`` (32) sampled
tokens (temperature 1, a seed per turn, no stop token, so both arms generate the same tokens) followed by a
50-token tool observation appended to the context, as the agent loop does. Turn t's prompt is therefore
``200 + (t - 1) x 82`` tokens (4,218 at turn 50). Arms, interleaved (``cached uncached cached ...``,
``--repeats`` 5):

- cached: `LocalEngine` as shipped (a finished turn's KV is kept; the next turn prefills its observation);
- uncached: ``prefix_cache_tokens=0`` (every turn prefills the whole context: the engine before the cache).

Printed: each arm's engine time (the ``generate`` call's wall time) at turns 1, 10, 25 and 50, median and
range over repeats; the growth turn 50 / turn 1 of each arm (target with the cache: <= 1.5x); the whole
episode's engine time uncached / cached (target >= 5x); prefill tokens per episode; the load average.
``--gateway`` adds the gateway's request overhead at the same turns (`multiturn_gateway`).

    python benchmarks/multiturn.py                  # the issue's workload
    python benchmarks/multiturn.py --turns 300 --gen 64 --device cuda
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import torch

from harness import LoadWatch, Spread, interleaved, ratio
from sao.engine.local import LocalEngine
from sao.engine.types import SamplingParams
from sao.models.tiny import tiny_checkpoint

REPORT_TURNS = (1, 10, 25, 50)


def random_tokens(n: int, seed: int, vocab: int) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


async def one_episode(engine: LocalEngine, args: argparse.Namespace, vocab: int, index: int) -> list[float]:
    """Engine seconds of each turn of episode ``index``."""
    context = random_tokens(args.prompt, index, vocab)
    times = []
    for turn in range(args.turns):
        params = SamplingParams(max_new_tokens=args.gen, temperature=1.0, seed=1000 * index + turn)
        started = time.perf_counter()
        gen = await engine.generate(context, params)
        times.append(time.perf_counter() - started)
        context = context + gen.token_ids + random_tokens(args.observation, 100_000 * index + turn, vocab)
    return times


def run_arm(model_dir: Path, args: argparse.Namespace, keep: int | None) -> tuple[list[float], float, dict]:
    """One arm: ``(per-turn engine seconds, the median over episodes; episodes' wall seconds; stats)``."""

    async def main():
        engine = LocalEngine(
            model_dir, device=args.device, max_running=args.episodes, max_model_len=args.max_model_len,
            max_kv_tokens=args.episodes * args.max_model_len, prefix_cache_tokens=keep,
        )  # fmt: skip
        async with engine:
            vocab = engine.vocab_size
            await engine.generate(random_tokens(16, 9, vocab), SamplingParams(max_new_tokens=4))  # warm-up
            started = time.perf_counter()
            runs = await asyncio.gather(*(one_episode(engine, args, vocab, i) for i in range(args.episodes)))
            wall = time.perf_counter() - started
            return [statistics.median(turn) for turn in zip(*runs, strict=True)], wall, engine.stats()

    return asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", type=Path, default=None, help="a checkpoint directory instead of a tiny model"
    )
    parser.add_argument("--arch", default="qwen3_moe")
    parser.add_argument("--size", default="small")
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--episodes", type=int, default=8, help="episodes running at once on the engine")
    parser.add_argument("--prompt", type=int, default=200, help="first prompt tokens")
    parser.add_argument("--gen", type=int, default=32, help="tokens generated per turn")
    parser.add_argument("--observation", type=int, default=50, help="tool observation tokens per turn")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--gateway", action="store_true", help="also the gateway's request overhead")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.max_model_len = args.prompt + args.turns * (args.gen + args.observation) + 64
    turns = [t for t in REPORT_TURNS if t <= args.turns] or [args.turns]
    watch = LoadWatch()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or tiny_checkpoint(Path(tmp) / "model", args.arch, args.size)
        name = str(args.model) if args.model else f"{args.arch}/{args.size}"
        arms = {
            "cached": lambda rep: run_arm(model_dir, args, None),
            "uncached": lambda rep: run_arm(model_dir, args, 0),
        }

        def progress(name: str, rep: int, result) -> None:
            print(f"  rep {rep + 1}/{args.repeats} {name:9s} {result[1]:6.2f} s", flush=True)

        print(
            f"{name}, {args.episodes} episodes at once, {args.turns} turns: prompt {args.prompt}, {args.gen} "
            f"generated + {args.observation} observation tokens per turn; "
            f"torch threads {torch.get_num_threads()}"
        )
        results = interleaved(arms, args.repeats, progress)
    per_turn = {name: [r[0] for r in runs] for name, runs in results.items()}
    print(f"\nengine time per turn (ms), median [range] over {args.repeats} repeats")
    print(f"{'turn':>6} {'cached':>24} {'uncached':>24} {'uncached/cached':>22}")
    for t in turns:
        cached = [1000 * r[t - 1] for r in per_turn["cached"]]
        plain = [1000 * r[t - 1] for r in per_turn["uncached"]]
        med, spread = ratio(plain, cached)
        print(f"{t:>6} {Spread(tuple(cached)).fmt('.1f'):>24} {Spread(tuple(plain)).fmt('.1f'):>24} "
              f"{med:>7.2f}x {spread.fmt('.2f')}")  # fmt: skip
    last = turns[-1]
    for name in ("cached", "uncached"):
        growth, spread = ratio([r[last - 1] for r in per_turn[name]], [r[0] for r in per_turn[name]])
        target = "  (target <= 1.5x)" if name == "cached" else ""
        print(f"turn {last} / turn 1, {name}: {growth:.2f}x {spread.fmt('.2f')}{target}")
    totals = {name: [r[1] for r in runs] for name, runs in results.items()}
    med, spread = ratio(totals["uncached"], totals["cached"])
    print(f"episodes' engine time uncached / cached: {med:.2f}x {spread.fmt('.2f')}  (target >= 5x); "
          f"cached {Spread(tuple(totals['cached'])).fmt('.2f', ' s')}, "
          f"uncached {Spread(tuple(totals['uncached'])).fmt('.2f', ' s')}")  # fmt: skip
    for name, runs in results.items():
        stats = runs[0][2]
        print(f"{name}: prefill tokens {stats['prefill_tokens'] :,.0f}, prefix hits "
              f"{stats['prefix_hits']:.0f}, reused tokens {stats['prefix_reused_tokens']:,.0f}")  # fmt: skip
    if args.gateway:
        import multiturn_gateway

        print("\ngateway request overhead (engine time excluded)")
        print(multiturn_gateway.report(multiturn_gateway.measure(turns=list(turns), reps=args.repeats)))
    print(watch.report())


if __name__ == "__main__":
    main()
