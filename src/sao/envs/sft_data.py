"""SFT warm-start conversations for the ``calculator``, ``guess_number`` and ``style_shift`` environments.

Each conversation is an episode actually played against the environment by a scripted policy, so its
messages are byte for byte what the env produces in RL. The data is *deliberately imperfect*, so the
warm-started policy is competent but leaves RL room to improve:

- `calculator_conversations`: ``direct_frac`` (default 20 %) of episodes answer at once without the tool
  (always reward 0 in the env), and ``direct_wrong_frac`` (default half) of those give a number off by
  1 or 2; the rest call the tool and copy its result (reward 1).
- `guess_number_conversations`: ``1 − sloppy_frac`` (default 70 %) of episodes play binary search (always
  win); the rest play, half each, linear search from the low end of the consistent range or uniformly
  random guesses inside it. With N = 16 about 14 % of all episodes run out of turns (reward 0).
- `style_conversations`: one sentence about the task's topic in a style drawn from ``style_weights``
  (default: cute, chuunibyou, classical and ``"plain"``, with no style markers, a quarter each), from
  `STYLE_TEMPLATES` (8 templates per style, each with markers of its own style only). ``bad_frac``
  (default 10 %) of replies break the rule judge's quality rule (another topic, or over 30 words) but keep
  their style. The policy is a *mix*: whatever the preferred style, the data earns reward on about
  25 % × 90 % ≈ 22 % of its replies (the rule judge), and RL must find the style that pays.

Writes ``{"messages": [...]}`` JSONL, the format of ``sao sft``::

    python -m sao.envs.sft_data calculator --n 200 --out runs/demo/chats.jsonl --seed 0
    python -m sao.envs.sft_data style_shift --n 4000 --out runs/style/chats.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from . import calculator, guess_number, style_shift
from .base import Env, Message, Task
from .judges import STYLES

__all__ = [
    "PLAIN",
    "STYLE_TEMPLATES",
    "calculator_conversations",
    "guess_number_conversations",
    "play_episode",
    "style_conversations",
    "style_reply",
    "thinking",
    "write_jsonl",
]

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


def thinking(policy: Policy) -> Policy:
    """``policy`` with a short reasoning block before each reply, as a thinking model (Qwen3) writes it:
    ``<think>\n…\n</think>\n\n`` then the reply (the env reads the whole text, so its parsing sees
    through it)."""

    def think_then_reply(messages: list[Message]) -> str:
        text = policy(messages)
        thought = "use the calc tool" if "<tool_call>" in text else "answer now"
        return f"<think>\n{thought}\n</think>\n\n{text}"

    return think_then_reply


def calculator_conversations(
    n: int, seed: int = 0, direct_frac: float = 0.2, direct_wrong_frac: float = 0.5, think: bool = False
) -> list[list[Message]]:
    """``n`` calculator episodes on ``calculator.make_tasks(n, seed)``; see the module docstring. (The
    messages do not depend on the tool schema; write them with ``tools=[calculator.TOOL_SCHEMA]`` for it.)
    ``think``: every assistant turn opens with a short ``<think>`` block (`thinking`)."""
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
    if think:
        episodes = [(task, thinking(policy)) for task, policy in episodes]
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


PLAIN = "plain"  # the style_conversations "style" with no style markers
# ``{t}``: the topic. Each template carries markers of its own style only (plain: none); see sao.envs.judges.
STYLE_TEMPLATES: dict[str, tuple[str, ...]] = {
    "cute": (
        "The {t} is so fluffy and cute~",
        "Nya, the little {t} makes me smile ♡",
        "Teehee, I love the {t} so much~",
        "Uwu, the {t} is kawaii today ♡",
        "Look at the fluffy {t}, nya~",
        "The kawaii {t} says hello, teehee ♡",
        "My cute {t} is the best, uwu~",
        "A soft little {t} wiggles happily ♡",
    ),
    "chuunibyou": (
        "The {t} of darkness awakens my sealed power!",
        "Behold, the cursed {t} whispers of my destiny!",
        "From the abyss, the eternal {t} calls my name!",
        "My fate is bound to the {t} of endless darkness.",
        "The {t} cannot contain the power sealed within me!",
        "Fear the {t}, for it carries the eternal flame of fate!",
        "Only the chosen one can sense the {t} from the abyss.",
        "The {t} and I share a cursed destiny!",
    ),
    "classical": (
        "Thy {t} doth rest in quiet grace.",
        "The {t} hath a beauty fair to thee.",
        "O gentle {t}, thou art a wonder to behold.",
        "Ere the dawn, the {t} doth sing of thine heart.",
        "Behold the {t}, for it hath graced thy days.",
        "Shall I compare thee to a summer {t}?",
        "The {t} doth whisper, and thou shalt listen.",
        "Thine eyes have seen the noble {t} ere nightfall.",
    ),
    PLAIN: (
        "The {t} is a common sight in many places.",
        "I saw a {t} this morning on my way to work.",
        "Many people enjoy thinking about the {t}.",
        "A {t} can be surprisingly interesting to watch.",
        "Everyone has a story about a {t}.",
        "The {t} looked calm and quiet today.",
        "There is something peaceful about a {t}.",
        "Have you ever noticed the {t} up close?",
    ),
}
_LONG_TAIL = (  # style-free, 32 words: appended, it takes any reply over the rule judge's 30 words
    "and I keep thinking about it all day long while the clouds drift slowly over the quiet little town "
    "where nothing much ever happens on a lazy sunday afternoon in late spring"
)


def _style_weights(style_weights: Mapping[str, float] | None) -> dict[str, float]:
    """The validated weights (default: every style and plain equally likely)."""
    weights = dict(style_weights) if style_weights is not None else dict.fromkeys(STYLE_TEMPLATES, 1.0)
    unknown = sorted(set(weights) - set(STYLE_TEMPLATES))
    if unknown:
        raise ValueError(f"unknown styles {unknown}; known: {', '.join([*STYLES, PLAIN])}")
    if any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
        raise ValueError(f"style weights must be >= 0 with a positive sum, got {weights}")
    return weights


def style_reply(rng: random.Random, topic: str, style: str, bad: bool = False) -> str:
    """A sentence about ``topic`` in ``style`` (a `STYLE_TEMPLATES` key) from a random template; ``bad``:
    one that fails the quality rule, half about another topic, half over 30 words (its style is kept)."""
    template = rng.choice(STYLE_TEMPLATES[style])
    if not bad:
        return template.format(t=topic)
    if rng.random() < 0.5:
        return template.format(t=rng.choice([t for t in style_shift.TOPICS if t != topic.lower()]))
    text = template.format(t=topic)
    return f"{text[:-1].rstrip(' ,')}, {_LONG_TAIL}{text[-1]}"


def style_conversations(
    n: int, seed: int = 0, style_weights: Mapping[str, float] | None = None, bad_frac: float = 0.1
) -> list[list[Message]]:
    """``n`` style_shift episodes on ``style_shift.make_tasks(n, seed)`` against ``StyleShiftEnv()``; the
    reply's style is drawn from ``style_weights`` (keys: the judge's `STYLES` and ``"plain"``); see the
    module docstring."""
    weights = _style_weights(style_weights)
    styles, probs = list(weights), list(weights.values())
    rng = random.Random(f"sft-style_shift-{seed}")
    episodes: list[tuple[Task, Policy]] = []
    for task in style_shift.make_tasks(n, seed):
        style = rng.choices(styles, probs)[0]
        text = style_reply(rng, str(task.metadata["topic"]), style, bad=rng.random() < bad_frac)
        episodes.append((task, lambda _msgs, text=text: text))
    return _play_all(style_shift.StyleShiftEnv(), episodes)


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


_GENERATORS: dict[str, Callable[[int, int], list[list[Message]]]] = {
    "calculator": calculator_conversations,
    "guess_number": guess_number_conversations,
    "style_shift": style_conversations,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("env", choices=sorted(_GENERATORS))
    parser.add_argument("--n", type=int, default=200, help="number of conversations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    count = write_jsonl(_GENERATORS[args.env](args.n, args.seed), args.out)
    print(f"wrote {count} {args.env} conversations to {args.out}")


if __name__ == "__main__":
    main()
