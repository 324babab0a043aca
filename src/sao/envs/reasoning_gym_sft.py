"""SFT warm-start chats for the ``reasoning_gym`` env from the library's own answers (JSONL, one
``{"messages": [...]}`` per line, the format ``sao sft --data`` reads).

Each chat is the system and user messages `ReasoningGymEnv.reset` returns for the task (byte for byte, for
the same ``system_prompt`` and ``answer_tag``), then one assistant message: a short worked solution where
the family's entry carries what one needs (`SOLVERS`: ``chain_sum`` running sums, ``basic_arithmetic``
the same where the expression has only ``+`` and ``-`` and no parentheses, ``products`` running products,
``leg_counting`` legs per animal then the total, from the entry's metadata and the library's table of
legs), then ``<answer>{answer}</answer>`` with the library's answer. Other families get the tag
alone. Every chat is played through the env and kept only if it earns reward 1 (the count of others is
reported; a family whose own answer scores less, by partial credit, would lose its rows).

The tasks come from `generate_tasks` in the ``"sft"`` namespace: the mix and the dataset seeds hash
``("sft", seed, family)``, where training and evaluation tasks (`ReasoningGymEnv.make_tasks`, and the
stream's chunks) hash ``("rg", seed, family)``, so for the same ``--seed`` the SFT tasks are not the
training or held-out ones. With small difficulty configs a family has few distinct questions, so the same
question text can still recur in both: that is the family's size, not a shared seed.

    python -m sao.envs.reasoning_gym_sft --datasets chain_sum,products,leg_counting --n 4000 --seed 0 \\
        --config '{"chain_sum": {"config": {"max_terms": 3, "max_digits": 2}}}' --out chats.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .base import EnvError, Message, Task
from .reasoning_gym_env import ReasoningGymEnv, generate_tasks
from .sft_data import write_jsonl

__all__ = [
    "SFT_NAMESPACE",
    "SOLVERS",
    "answer_reply",
    "datasets_arg",
    "main",
    "sft_conversations",
]

SFT_NAMESPACE = "sft"
_TERM = re.compile(r"\s*(-?\d+)\s*([-+*]?)")


def _running(expression: str, ops: str) -> list[str] | None:
    """``a op b = c`` lines evaluating ``expression`` left to right (only the ``ops`` operators)."""
    terms = _TERM.findall(expression)
    if not terms or "".join(t[0] + t[1] for t in terms).replace(" ", "") != expression.replace(" ", ""):
        return None
    value, op, lines = int(terms[0][0]), terms[0][1], []
    for number, next_op in terms[1:]:
        if op not in ops:
            return None
        new = value + int(number) if op == "+" else value - int(number) if op == "-" else value * int(number)
        lines.append(f"{value} {op} {number} = {new}")
        value, op = new, next_op
    return lines


def _legs(meta: Mapping[str, Any]) -> list[str] | None:
    from reasoning_gym.arithmetic.leg_counting import ANIMALS

    animals = meta.get("animals")
    if not isinstance(animals, Mapping) or not animals or any(a not in ANIMALS for a in animals):
        return None
    lines = [
        f"{animal}: {count} * {ANIMALS[animal]} = {count * ANIMALS[animal]}"
        for animal, count in animals.items()
    ]
    totals = [str(count * ANIMALS[animal]) for animal, count in animals.items()]
    if len(totals) > 1:
        lines.append(f"{' + '.join(totals)} = {sum(map(int, totals))}")
    return lines


# family -> (entry metadata -> solution lines, or None where the entry does not support one)
SOLVERS: dict[str, Callable[[Mapping[str, Any]], list[str] | None]] = {
    "chain_sum": lambda meta: _running(str(meta.get("expression", "")), "+-"),
    "basic_arithmetic": lambda meta: _running(str(meta.get("expression", "")), "+-"),  # with + and - only
    "products": lambda meta: _running(str(meta.get("expression", "")), "*"),
    "leg_counting": _legs,
}


def answer_reply(task: Task, answer_tag: str = "answer", solution: bool = True) -> str:
    """The assistant reply for ``task``: its solution lines (see `SOLVERS`) when ``solution`` and the
    family has them (and they end at the library's answer), then ``<answer_tag>answer</answer_tag>``."""
    answer = task.answer if isinstance(task.answer, str) else json.dumps(task.answer)
    reply = f"<{answer_tag}>{answer}</{answer_tag}>"
    solver = SOLVERS.get(str(task.metadata.get("dataset"))) if solution else None
    lines = solver(json.loads(task.metadata["entry_metadata"])) if solver else None
    if not lines or not lines[-1].endswith(f"= {answer}"):  # a solution must end at the library's answer
        return reply
    return "\n".join([*lines, reply])


def sft_conversations(
    n: int,
    seed: int,
    datasets: Sequence[str] | Mapping[str, Any],
    system_prompt: str | None = "default",
    answer_tag: str = "answer",
    solution: bool = True,
    direct_frac: float = 0.0,
    direct_wrong_frac: float = 0.0,
) -> tuple[list[list[Message]], int]:
    """``n`` tasks of the ``datasets`` mix in the SFT namespace, answered by `answer_reply` and played
    through ``ReasoningGymEnv(datasets, system_prompt, answer_tag)``; returns the chats that earned reward
    1 and how many did not.

    ``direct_frac``: the share of tasks (drawn per task, seeded) answered with the tag alone, without the
    worked solution (``solution=False``: all); ``direct_wrong_frac`` of those (integer answers only) give a
    number off by 1 or 2 and are kept although they score 0. Deliberately imperfect data, as the
    quickstart's: the warm-started policy sometimes answers directly and is then often wrong, and RL must
    learn that working it out pays."""
    for name, frac in (("direct_frac", direct_frac), ("direct_wrong_frac", direct_wrong_frac)):
        if not 0.0 <= frac <= 1.0:
            raise EnvError(f"{name} must be in [0, 1], got {frac!r}")
    rng = random.Random(f"sft-direct-{seed}")
    env = ReasoningGymEnv(datasets=datasets, system_prompt=system_prompt, answer_tag=answer_tag)
    tasks = generate_tasks(n, seed, env.families, namespace=SFT_NAMESPACE)

    async def play() -> tuple[list[list[Message]], int]:
        chats, failed = [], 0
        for task in tasks:
            messages = await env.reset(task)
            direct = not solution or rng.random() < direct_frac
            reply = answer_reply(task, answer_tag, not direct)
            wrong = direct and rng.random() < direct_wrong_frac and _is_int(task.answer)
            if wrong:
                off = int(str(task.answer)) + rng.choice((-2, -1, 1, 2))
                reply = f"<{answer_tag}>{off}</{answer_tag}>"
            result = await env.step(reply)
            await env.close()
            if result.reward == 1.0 or wrong:
                chats.append([*messages, {"role": "assistant", "content": reply}])
            else:
                failed += 1
        return chats, failed

    return asyncio.run(play())


def _is_int(answer: Any) -> bool:
    return re.fullmatch(r"-?\d+", str(answer).strip()) is not None


def datasets_arg(names: str | None, config: str | None) -> list[str] | dict[str, Any]:
    """The ``datasets`` value from ``--datasets a,b`` and ``--config`` (a JSON mapping name -> {weight,
    config}; families it names are added, those of ``--datasets`` it does not name keep the defaults)."""
    listed = [n.strip() for n in (names or "").split(",") if n.strip()]
    if config is None:
        if not listed:
            raise EnvError("give --datasets and/or --config")
        return listed
    try:
        mapping = json.loads(config)
    except json.JSONDecodeError as err:
        raise EnvError(f"--config is not JSON: {err}") from None
    if not isinstance(mapping, dict):
        raise EnvError("--config must be a JSON object: name -> {weight, config}")
    return {**{name: {} for name in listed}, **mapping}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--datasets", help="comma-separated reasoning-gym dataset names")
    parser.add_argument(
        "--config", help="JSON object: name -> {weight, config} (as data.env_kwargs.datasets)"
    )
    parser.add_argument("--n", type=int, default=4000, help="number of tasks")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--system-prompt", default="default", help="as the env's system_prompt ('' for none)")
    parser.add_argument("--answer-tag", default="answer")
    parser.add_argument("--no-solution", action="store_true", help="the answer tag only, no solution lines")
    parser.add_argument(
        "--direct-frac", type=float, default=0.0,
        help="share of tasks answered with the tag alone (the rest with their worked solution)",
    )  # fmt: skip
    parser.add_argument(
        "--direct-wrong-frac", type=float, default=0.0,
        help="share of the direct answers that give a number off by 1 or 2 (kept; they score 0)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        datasets = datasets_arg(args.datasets, args.config)
        chats, failed = sft_conversations(
            args.n, args.seed, datasets, args.system_prompt, args.answer_tag, not args.no_solution,
            args.direct_frac, args.direct_wrong_frac,
        )  # fmt: skip
    except EnvError as err:
        parser.error(str(err))
    count = write_jsonl(chats, args.out)
    print(f"wrote {count} reasoning_gym chats to {args.out} ({failed} left out: their answer scored < 1)")


if __name__ == "__main__":
    main()
