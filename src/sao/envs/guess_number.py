"""``guess_number``: find a secret number in [1, N] from higher/lower hints.

Formats (short: every byte is a token):

- prompt:   ``Guess my number from 1 to 16.``
- a guess:  ``guess: 8`` (the last ``guess: <integer>`` of the turn counts; case and spaces are free);
- replies:  a ``user`` message ``higher`` / ``lower``; a correct guess ends the episode (``info["feedback"]``
  is ``"correct"``, no observation). A guess outside [1, N] is legal and answered ``higher``/``lower``.
- a turn without a guess: ``invalid, reply guess: <number>`` (it uses up the turn).

``max_turns`` = ceil(log2 N) + 1 (5 for N = 16), set from the task at `reset`. Reward: 1 for a correct guess
within the budget, 0 otherwise; with ``shaping`` > 0 a correct guess on turn t earns
``max(0, 1 − shaping·(t − 1))`` instead (default 0: unshaped). Binary search needs at most
ceil(log2(N + 1)) ≤ max_turns guesses, so `optimal_policy` always wins: optimal score 1.0.

Scoring a conversation the env did not play (`GuessNumberEnv.score`, used through
`sao.envs.base.score_conversation`, e.g. for an external agent's episode): the reward ``step`` gives a
correct guess, applied to the final assistant message — 1 (shaped by the number t of assistant turns when
``shaping`` > 0) when its last ``guess: <integer>`` is the secret ``task.answer`` and t is within the turn
budget, else 0. The hints in the conversation are the agent's own; the reward does not depend on them.
"""

from __future__ import annotations

import math
import random
import re
from typing import Any

from .base import Message, StepResult, Task, initial_messages, message_text, register_env

__all__ = [
    "DEFAULT_MAX_NUMBER",
    "INVALID",
    "OPTIMAL_SCORE",
    "SYSTEM_PROMPT",
    "GuessNumberEnv",
    "candidate_range",
    "guess_budget",
    "guess_text",
    "make_tasks",
    "optimal_policy",
]

OPTIMAL_SCORE = 1.0
DEFAULT_MAX_NUMBER = 16
SYSTEM_PROMPT = "Reply guess: <number>; I answer higher, lower or correct."  # optional instructions

_GUESS = re.compile(r"guess\s*:\s*(-?\d+)", re.IGNORECASE)
_RANGE = re.compile(r"from 1 to (\d+)")
INVALID = "invalid, reply guess: <number>"


def guess_budget(max_number: int) -> int:
    """Turns allowed for [1, max_number]: ceil(log2 N) + 1."""
    return math.ceil(math.log2(max_number)) + 1


def guess_text(value: int) -> str:
    """The canonical guess turn."""
    return f"guess: {value}"


def make_tasks(n: int, seed: int = 0, max_number: int = DEFAULT_MAX_NUMBER) -> list[Task]:
    """``n`` deterministic tasks (secret uniform in [1, max_number]); a longer list extends a shorter."""
    if max_number < 2:
        raise ValueError(f"max_number must be >= 2, got {max_number}")
    rng = random.Random(f"guess_number-{seed}-{max_number}")
    return [
        Task(
            id=f"guess_number-{seed}-{i}",
            prompt=f"Guess my number from 1 to {max_number}.",
            answer=rng.randint(1, max_number),
            metadata={"max_number": max_number},
        )
        for i in range(n)
    ]


def candidate_range(messages: list[Message], max_number: int | None = None) -> tuple[int, int]:
    """The (low, high) range still consistent with the hints in ``messages`` (the episode so far).

    ``max_number`` defaults to the N named in the first user message (``from 1 to N``).
    """
    if max_number is None:
        first = next((m["content"] for m in messages if m.get("role") == "user"), "")
        match = _RANGE.search(first if isinstance(first, str) else "")
        max_number = int(match.group(1)) if match else DEFAULT_MAX_NUMBER
    low, high = 1, max_number
    last_guess: int | None = None
    for msg in messages:
        if msg.get("role") == "assistant":
            found = _GUESS.findall(msg.get("content") or "")
            last_guess = int(found[-1]) if found else None
        elif msg.get("role") == "user" and last_guess is not None:
            if msg["content"] == "higher":
                low = max(low, last_guess + 1)
            elif msg["content"] == "lower":
                high = min(high, last_guess - 1)
            last_guess = None
    return low, high


def optimal_policy(messages: list[Message], max_number: int | None = None) -> str:
    """Binary search: guess the middle of the range still consistent with the hints."""
    low, high = candidate_range(messages, max_number)
    return guess_text((low + high) // 2)


@register_env("guess_number", tasks=make_tasks)
class GuessNumberEnv:
    """See the module docstring. ``max_turns`` (None: from the task's N) and ``shaping`` are options."""

    def __init__(
        self, max_turns: int | None = None, shaping: float = 0.0, system_prompt: str | None = None
    ) -> None:
        if max_turns is not None and max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if not 0.0 <= shaping <= 1.0:
            raise ValueError(f"shaping must be in [0, 1], got {shaping}")
        self._fixed_turns = max_turns
        self.max_turns = max_turns or guess_budget(DEFAULT_MAX_NUMBER)
        self.shaping = shaping
        self.system_prompt = system_prompt
        self._secret = 0
        self._turns = 0
        self._done = True

    async def reset(self, task: Task) -> list[Message]:
        max_number = int(task.metadata.get("max_number", DEFAULT_MAX_NUMBER))
        self.max_turns = self._fixed_turns or guess_budget(max_number)
        self._secret, self._turns, self._done = int(task.answer), 0, False
        return initial_messages(task, self.system_prompt)

    async def step(self, assistant_text: str) -> StepResult:
        if self._done:
            return StepResult([], 0.0, True, {"error": "step() called outside an episode"})
        self._turns += 1
        info: dict[str, Any] = {"turn": self._turns}
        found = _GUESS.findall(assistant_text)
        if not found:
            info["error"] = "no guess in the turn"
            feedback = INVALID
        else:
            guess = int(found[-1])
            info["guess"] = guess
            if guess == self._secret:
                self._done = True
                info.update(feedback="correct", solved=True)
                return StepResult([], max(0.0, 1.0 - self.shaping * (self._turns - 1)), True, info)
            feedback = "higher" if guess < self._secret else "lower"
        info["feedback"] = feedback
        if self._turns >= self.max_turns:
            self._done = True
            info.update(solved=False, truncated=True)
            return StepResult([], 0.0, True, info)
        return StepResult([{"role": "user", "content": feedback}], 0.0, False, info)

    def score(self, task: Task, messages: list[Message]) -> float:
        """The outcome reward of a conversation this env did not play (see the module docstring); the
        episode in progress, if any, is not touched."""
        final = messages[-1] if isinstance(messages, list) and messages else None
        if not isinstance(final, dict) or final.get("role") != "assistant":
            return 0.0
        turns = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
        budget = self._fixed_turns or guess_budget(int(task.metadata.get("max_number", DEFAULT_MAX_NUMBER)))
        found = _GUESS.findall(message_text(final))
        if turns > budget or not found:
            return 0.0
        try:
            guess = int(found[-1])
        except ValueError:  # an integer too long for int()
            return 0.0
        if guess != int(task.answer):
            return 0.0
        return max(0.0, 1.0 - self.shaping * (turns - 1))

    async def close(self) -> None:
        self._done = True
