"""SFT warm-start conversations for the ``calculator`` and ``guess_number`` environments.

Each conversation is an episode actually played against the environment by a scripted policy, so its
messages are byte for byte what the env produces in RL. The data is *deliberately imperfect*, so the
warm-started policy is competent but leaves RL room to improve:

- `calculator_conversations`: ``direct_frac`` (default 20 %) of episodes answer at once without the tool
  (always reward 0 in the env), and ``direct_wrong_frac`` (default half) of those give a number off by
  1 or 2; the rest call the tool and copy its result (reward 1).
- `guess_number_conversations`: ``1 − sloppy_frac`` (default 70 %) of episodes play binary search (always
  win); the rest play, half each, linear search from the low end of the consistent range or uniformly
  random guesses inside it. With N = 16 about 14 % of all episodes run out of turns (reward 0).

Writes ``{"messages": [...]}`` JSONL, the format of ``sao sft``::

    python -m sao.envs.sft_data calculator --n 200 --out runs/demo/chats.jsonl --seed 0
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from . import calculator, guess_number
from .base import Env, Message, Task

__all__ = ["calculator_conversations", "guess_number_conversations", "play_episode", "write_jsonl"]

Policy = Callable[[list[Message]], str]


async def play_episode(env: Env, task: Task, policy: Policy) -> tuple[list[Message], float]:
    """Play ``task`` with ``policy`` (messages so far → next assistant text); the messages and the reward."""
    messages = await env.reset(task)
    reward = 0.0
    try:
        for _ in range(env.max_turns):
            text = policy(messages)
            messages.append({"role": "assistant", "content": text})
            result = await env.step(text)
            reward = result.reward
            if result.done:
                break
            messages.extend(result.observation)
    finally:
        await env.close()
    return messages, reward


def _play_all(env: Env, episodes: list[tuple[Task, Policy]]) -> list[list[Message]]:
    async def run() -> list[list[Message]]:
        return [(await play_episode(env, task, policy))[0] for task, policy in episodes]

    return asyncio.run(run())


def calculator_conversations(
    n: int, seed: int = 0, direct_frac: float = 0.2, direct_wrong_frac: float = 0.5
) -> list[list[Message]]:
    """``n`` calculator episodes on ``calculator.make_tasks(n, seed)``; see the module docstring. (The
    messages do not depend on the tool schema; write them with ``tools=[calculator.TOOL_SCHEMA]`` for it.)"""
    rng = random.Random(f"sft-calculator-{seed}")
    episodes: list[tuple[Task, Policy]] = []
    for task in calculator.make_tasks(n, seed):
        if rng.random() < direct_frac:
            value = task.answer
            if rng.random() < direct_wrong_frac:
                value += rng.choice((-2, -1, 1, 2))
            episodes.append((task, lambda _msgs, v=value: calculator.answer_text(v)))
        else:
            episodes.append((task, lambda msgs, t=task: calculator.optimal_policy(t, msgs)))
    return _play_all(calculator.CalculatorEnv(), episodes)


def guess_number_conversations(
    n: int, seed: int = 0, max_number: int = guess_number.DEFAULT_MAX_NUMBER, sloppy_frac: float = 0.3
) -> list[list[Message]]:
    """``n`` guess-the-number episodes on ``guess_number.make_tasks(n, seed, max_number)``."""
    rng = random.Random(f"sft-guess_number-{seed}")

    def linear(msgs: list[Message]) -> str:
        return guess_number.guess_text(guess_number.candidate_range(msgs)[0])

    def randomly(msgs: list[Message]) -> str:
        low, high = guess_number.candidate_range(msgs)
        return guess_number.guess_text(rng.randint(low, max(low, high)))

    episodes: list[tuple[Task, Policy]] = []
    for task in guess_number.make_tasks(n, seed, max_number):
        draw = rng.random()
        if draw >= sloppy_frac:
            episodes.append((task, guess_number.optimal_policy))
        else:
            episodes.append((task, linear if draw < sloppy_frac / 2 else randomly))
    return _play_all(guess_number.GuessNumberEnv(), episodes)


def write_jsonl(
    conversations: Iterable[list[Message]], path: str | Path, tools: list[dict[str, Any]] | None = None
) -> int:
    """Write ``{"messages": [...]}`` lines (with ``"tools"``, the schemas the prompt shows, when given);
    returns how many."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w", encoding="utf-8") as f:
        for messages in conversations:
            row: dict[str, Any] = {"messages": messages, **({"tools": tools} if tools else {})}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    return count


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("env", choices=["calculator", "guess_number"])
    parser.add_argument("--n", type=int, default=200, help="number of conversations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    make = calculator_conversations if args.env == "calculator" else guess_number_conversations
    count = write_jsonl(make(args.n, args.seed), args.out)
    print(f"wrote {count} {args.env} conversations to {args.out}")


if __name__ == "__main__":
    main()
