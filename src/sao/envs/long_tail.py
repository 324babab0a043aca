"""``long_tail``: a synthetic multi-turn task whose turn count is heavy-tailed (a runtime benchmark workload).

Each task draws a number of turns from a fixed heavy-tailed distribution (`TURN_WEIGHTS`: most tasks take
1-2 turns, a few take 6-8) and names a target letter. Every assistant turn is answered ``next`` until the
drawn number of turns is reached; the episode then ends. The prompt asks for short replies.

- prompt:  ``Reply with one short word containing the letter 'e'. Turns: 3.``
- reward:  at the end only, the fraction of assistant turns that contain the target letter (case-free);
           deterministic in the replies. Optimal score 1.0 (`optimal_policy` replies the letter itself).

Where the turn count comes from (``LongTailEnv(turns=...)``, in a run ``data.env_kwargs={turns: episode}``):

- ``"task"`` (default): the task's own draw (``metadata["turns"]``, also named in its prompt), so every
  sample of a prompt runs equally long;
- ``"episode"``: a fresh draw from `TURN_WEIGHTS` per episode, seeded by the task id and the first reply,
  so samples of one prompt differ in length as agentic episodes do (the model's choices decide how many
  tool calls it makes), yet the count stays deterministic in the replies. The prompt's count is then only
  the task's nominal one.

The point is the tail: in a synchronous batch the longest episode sets the pace, while an asynchronous
runner keeps the generator busy with the short ones. ``data.max_turns`` should be >= `MAX_TURNS`.
"""

from __future__ import annotations

import random
from typing import Any, Literal

from .base import Message, StepResult, Task, initial_messages, register_env

__all__ = [
    "MAX_TURNS",
    "NEXT",
    "OPTIMAL_SCORE",
    "TURN_WEIGHTS",
    "LongTailEnv",
    "draw_turns",
    "make_tasks",
    "optimal_policy",
]

OPTIMAL_SCORE = 1.0
NEXT = "next"
# turns -> weight: P(1..2) = 0.75, P(6..8) = 0.10; mean ~2.3 turns, max 8.
TURN_WEIGHTS: dict[int, float] = {1: 0.45, 2: 0.30, 3: 0.10, 4: 0.05, 6: 0.04, 7: 0.03, 8: 0.03}
MAX_TURNS = max(TURN_WEIGHTS)
_LETTERS = "aeiost"


def draw_turns(rng: random.Random) -> int:
    """One turn count from `TURN_WEIGHTS`."""
    return rng.choices(list(TURN_WEIGHTS), list(TURN_WEIGHTS.values()))[0]


def make_tasks(n: int, seed: int = 0) -> list[Task]:
    """``n`` deterministic tasks; a longer list extends a shorter one with the same seed."""
    rng = random.Random(f"long_tail-{seed}")
    tasks = []
    for i in range(n):
        k = draw_turns(rng)
        letter = rng.choice(_LETTERS)
        tasks.append(
            Task(
                id=f"long_tail-{seed}-{i}",
                prompt=f"Reply with one short word containing the letter '{letter}'. Turns: {k}.",
                answer=letter,
                metadata={"turns": k},
            )
        )
    return tasks


def optimal_policy(messages: list[Message], task: Task) -> str:
    """Reply the target letter: every turn scores."""
    return str(task.answer)


@register_env("long_tail", tasks=make_tasks)
class LongTailEnv:
    """See the module docstring. ``system_prompt`` is optional; ``turns``: ``"task"`` or ``"episode"``."""

    def __init__(self, system_prompt: str | None = None, turns: Literal["task", "episode"] = "task") -> None:
        if turns not in ("task", "episode"):
            raise ValueError(f"turns must be 'task' or 'episode', got {turns!r}")
        self.system_prompt = system_prompt
        self.turns = turns
        self.max_turns = MAX_TURNS
        self._task_id = ""
        self._letter = ""
        self._turns = 0
        self._hits = 0
        self._done = True

    async def reset(self, task: Task) -> list[Message]:
        self._task_id = task.id
        if self.turns == "episode":
            self.max_turns = MAX_TURNS  # the real count is drawn at the first reply
        else:
            self.max_turns = int(task.metadata.get("turns", 1))
            if self.max_turns < 1:
                raise ValueError(f"turns must be >= 1, got {self.max_turns}")
        self._letter = str(task.answer).lower()
        self._turns, self._hits, self._done = 0, 0, False
        return initial_messages(task, self.system_prompt)

    async def step(self, assistant_text: str) -> StepResult:
        if self._done:
            return StepResult([], 0.0, True, {"error": "step() called outside an episode"})
        self._turns += 1
        if self.turns == "episode" and self._turns == 1:
            self.max_turns = draw_turns(random.Random(f"{self._task_id}\x00{assistant_text}"))
        hit = self._letter in assistant_text.lower()
        self._hits += int(hit)
        info: dict[str, Any] = {"turn": self._turns, "hit": hit}
        if self._turns >= self.max_turns:
            self._done = True
            return StepResult([], self._hits / self._turns, True, info)
        return StepResult([{"role": "user", "content": NEXT}], 0.0, False, info)

    async def close(self) -> None:
        self._done = True
