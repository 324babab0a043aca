"""The job of `benchmarks/vs_trl.py`: one-turn "write only characters from: <set>" tasks, for sao and TRL.

- prompt:  ``Write only characters from: 3aqx`` (a set of 4-8 distinct lowercase letters and digits);
- reward:  the share of the reply's characters that are in the set (surrounding whitespace ignored; an
           empty reply scores 0.0). Optimal score 1.0.

The pure functions (`make_prompts`, `charset_reward`) need nothing but the standard library, so the TRL
virtualenv (which has no sao) imports this file too; `CharsetEnv`, the sao environment
(``data.env=benchmarks/charset_env.py:CharsetEnv``), needs sao only when it is built. Both sides draw the
same prompts from the same seed: ``CharsetEnv.make_tasks(n, seed)`` wraps ``make_prompts(n, seed)``.
"""

from __future__ import annotations

import random
from typing import Any

try:
    from sao.envs.base import Message, StepResult, Task, initial_messages, message_text
except ImportError:  # the TRL virtualenv: the pure functions below still work
    HAVE_SAO = False
else:
    HAVE_SAO = True

__all__ = ["ALPHABET", "MAX_SET", "MIN_SET", "CharsetEnv", "charset_reward", "make_prompts"]

ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
MIN_SET, MAX_SET = 4, 8  # distinct characters per task's allowed set
PROMPT = "Write only characters from: {allowed}"


def make_prompts(n: int, seed: int = 0) -> list[dict[str, str]]:
    """``n`` deterministic prompts ``{"id", "text", "allowed"}``; a longer list extends a shorter one.

    ``allowed``: 4-8 distinct characters of `ALPHABET`, sorted; ``text``: the user message naming them.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"the number of prompts must be a non-negative integer, got {n!r}")
    rng = random.Random(f"charset-{seed}")
    prompts = []
    for i in range(n):
        allowed = "".join(sorted(rng.sample(ALPHABET, rng.randint(MIN_SET, MAX_SET))))
        text = PROMPT.format(allowed=allowed)
        prompts.append({"id": f"charset-{seed}-{i}", "text": text, "allowed": allowed})
    return prompts


def charset_reward(text: str, allowed: str) -> float:
    """Share in [0, 1] of ``text``'s characters (surrounding whitespace stripped) that are in ``allowed``;
    0.0 for an empty reply. Inner whitespace counts as a character outside the set."""
    body = text.strip()
    if not body:
        return 0.0
    allowed_set = set(allowed)
    return sum(ch in allowed_set for ch in body) / len(body)


class CharsetEnv:
    """One turn: the user names the set, the reply earns `charset_reward`, the episode ends.

    ``system_prompt`` is optional. ``StepResult.info`` carries ``allowed``.
    """

    max_turns = 1

    def __init__(self, system_prompt: str | None = None) -> None:
        if not HAVE_SAO:
            raise ImportError("CharsetEnv needs sao installed; the TRL side uses make_prompts/charset_reward")
        self.system_prompt = system_prompt
        self._allowed: str | None = None

    @staticmethod
    def make_tasks(n: int, seed: int = 0) -> list[Task]:
        """The tasks of ``make_prompts(n, seed)``: answer and ``metadata["allowed"]`` hold the set."""
        return [
            Task(id=p["id"], prompt=p["text"], answer=p["allowed"], metadata={"allowed": p["allowed"]})
            for p in make_prompts(n, seed)
        ]

    async def reset(self, task: Task) -> list[Message]:
        self._allowed = _allowed_of(task)
        return initial_messages(task, self.system_prompt)

    async def step(self, assistant_text: str) -> StepResult:
        if self._allowed is None:
            return StepResult([], 0.0, True, {"error": "step() called outside an episode"})
        allowed, self._allowed = self._allowed, None
        return StepResult([], charset_reward(assistant_text, allowed), True, {"allowed": allowed})

    def score(self, task: Task, messages: list[Message]) -> float:
        """The reward of a finished conversation's last (assistant) message, as `step` would give it."""
        return charset_reward(message_text(messages[-1]), _allowed_of(task))

    async def close(self) -> None:
        self._allowed = None


def _allowed_of(task: Any) -> str:
    allowed = task.metadata.get("allowed", task.answer)
    if not isinstance(allowed, str) or not allowed:
        raise ValueError(f"task {task.id!r} names no allowed character set (metadata['allowed'] or answer)")
    return allowed
