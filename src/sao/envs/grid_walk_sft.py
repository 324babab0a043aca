"""SFT warm-start conversations for the ``grid_walk`` env (JSONL, one ``{"messages": [...]}`` per line, the
format ``sao sft --data`` reads).

Each conversation is an episode played against `GridWalkEnv` (same kwargs as the run's, so its messages are
byte for byte what the env produces in RL) by a *deliberately imperfect* scripted walker: each turn it takes
the shortest hole-free path's next move (`grid_walk.shortest_move`) with probability ``skill`` (default 0.6)
and a uniformly random move otherwise. Every played episode is written, wins and losses alike (as the other
warm starts in `sao.envs.sft_data`), so the warm-started policy walks toward the goal but leaves RL room.
With the defaults the walker wins 36-37 % of its episodes (size 8: 25 %); the shortest-path walker (skill 1)
78 % (size 8: 64-67 %), a random one 2-3 % (size 8: under 1 %). The generator prints the rate it played.

The layouts come from `grid_walk.make_tasks` in the ``grid_walk-sft`` namespace, so for the same seed they
are not the training ones; the env's slips are seeded (``GridWalkEnv(seed=seed)``), so the output is the
same for the same arguments.

    python -m sao.envs.grid_walk_sft --n 4000 --seed 0 --out runs/grid/chats.jsonl
    python -m sao.envs.grid_walk_sft --n 2000 --size 8 --view map --skill 0.5 --out runs/grid/map.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import random
from pathlib import Path

from . import grid_walk
from .base import Message
from .sft_data import play_episode, write_jsonl

__all__ = ["SFT_NAMESPACE", "grid_walk_conversations", "main", "skilled_policy"]

SFT_NAMESPACE = "grid_walk-sft"


def skilled_policy(layout: grid_walk.Layout, skill: float, rng: random.Random):
    """Messages so far → ``move: <dir>``: the shortest-path move with probability ``skill``, else a uniformly
    random one (``rng`` draws both)."""

    def policy(messages: list[Message]) -> str:
        best = grid_walk.shortest_move(layout, grid_walk.position(messages))
        if best is not None and rng.random() < skill:
            return grid_walk.move_text(best)
        return grid_walk.move_text(rng.choice(list(grid_walk.DIRECTIONS)))

    return policy


def grid_walk_conversations(
    n: int,
    seed: int = 0,
    skill: float = 0.6,
    size: int = 6,
    holes: float = 0.15,
    min_dist: int = 4,
    slack: int = 6,
    slip: float = 0.2,
    view: str = "local",
) -> tuple[list[list[Message]], list[float]]:
    """``n`` episodes (see the module docstring) and their rewards (1 goal, 0 otherwise). ValueError names
    a bad argument."""
    if isinstance(skill, bool) or not isinstance(skill, (int, float)) or not 0.0 <= skill <= 1.0:
        raise ValueError(f"skill must be a probability in [0, 1], got {skill!r}")
    env = grid_walk.GridWalkEnv(size, holes, min_dist, slack, slip, view, seed=seed)
    tasks = grid_walk.make_tasks(n, seed, size, holes, min_dist, namespace=SFT_NAMESPACE)
    rng = random.Random(f"sft-grid_walk-{seed}")

    async def run() -> tuple[list[list[Message]], list[float]]:
        chats, rewards = [], []
        for task in tasks:
            policy = skilled_policy(grid_walk.Layout.from_metadata(task.metadata), skill, rng)
            messages, reward = await play_episode(env, task, policy)
            chats.append(messages)
            rewards.append(reward)
        return chats, rewards

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=4000, help="number of conversations (episodes)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skill", type=float, default=0.6, help="probability of the shortest-path move")
    parser.add_argument("--size", type=int, default=6)
    parser.add_argument("--holes", type=float, default=0.15, help="fraction of the cells that are holes")
    parser.add_argument("--min-dist", type=int, default=4, help="least Manhattan distance start-goal")
    parser.add_argument("--slack", type=int, default=6, help="turns beyond the shortest path")
    parser.add_argument("--slip", type=float, default=0.2, help="probability a move goes sideways")
    parser.add_argument("--view", choices=grid_walk.VIEWS, default="local")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.n < 0:
        parser.error(f"--n must be >= 0, got {args.n}")
    try:
        chats, rewards = grid_walk_conversations(
            args.n, args.seed, args.skill, args.size, args.holes, args.min_dist, args.slack, args.slip,
            args.view,
        )  # fmt: skip
    except ValueError as err:
        parser.error(str(err))
    count = write_jsonl(chats, args.out)
    rate = sum(rewards) / len(rewards) if rewards else 0.0
    print(f"wrote {count} grid_walk conversations to {args.out} (skill {args.skill} walker won {rate:.1%})")


if __name__ == "__main__":
    main()
