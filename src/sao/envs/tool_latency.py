"""``tool_latency``: an agentic benchmark workload whose tool calls take wall time on a remote service.

Each assistant turn is a tool call to a simulated remote service: the env awaits the service's latency
(``asyncio.sleep``: wall time that costs no local CPU, as a call to a sandbox cluster or a web API does)
and returns a short tool result. Both sources of the long tail are heavy-tailed and seeded:

- **latency** per call: lognormal with median ``latency_median_s`` (default 0.3 s) and log-space sigma
  ``latency_sigma`` (default 1.0: mean 0.49 s, p90 1.1 s, p99 3.1 s), capped at ``latency_max_s``
  (default 8 s);
- **turns** per episode: ``P(k) ∝ k^-turns_alpha`` for ``k = 1 .. max_turns`` (defaults 1.6 and 50: mean
  4.7 turns, 63 % of episodes take 1-2 turns, 2.8 % take 30 or more).

Both draws are deterministic in the task id and the replies: the turn count is drawn at the first reply
(so samples of one prompt differ in length, as agentic episodes do), each latency from the task id, the
turn index and the reply. ``latency_median_s=0`` makes the tool instant.

- prompt:  ``Call the tool with a short word containing the letter 'e' until it stops answering.``
- reward:  at the end only, the fraction of calls whose argument contains the target letter (case-free),
           as `long_tail` scores; optimal 1.0.

The point: in a synchronous batch the slowest episode (most turns × longest calls) sets the pace and the
engine idles while it waits on the tool; an asynchronous runner keeps enough episodes in flight that the
engine always has work. ``data.max_turns`` must be >= ``max_turns``.
"""

from __future__ import annotations

import asyncio
import math
import random
from typing import Any

from .base import Message, StepResult, Task, initial_messages, register_env

__all__ = ["ToolLatencyEnv", "draw_latency", "draw_turns", "make_tasks", "optimal_policy", "turn_weights"]

_LETTERS = "aeiost"


def turn_weights(max_turns: int, alpha: float) -> list[float]:
    """Unnormalised ``P(k) ∝ k^-alpha``, ``k = 1 .. max_turns``."""
    return [k**-alpha for k in range(1, max_turns + 1)]


def draw_turns(rng: random.Random, max_turns: int, alpha: float) -> int:
    """One turn count from the truncated power law."""
    return rng.choices(range(1, max_turns + 1), turn_weights(max_turns, alpha))[0]


def draw_latency(rng: random.Random, median_s: float, sigma: float, max_s: float) -> float:
    """One call latency (seconds): lognormal(median, sigma) capped at ``max_s``; 0 when ``median_s`` is 0."""
    if median_s <= 0:
        return 0.0
    return min(max_s, median_s * math.exp(sigma * rng.gauss(0.0, 1.0)))


def make_tasks(n: int, seed: int = 0) -> list[Task]:
    """``n`` deterministic tasks (a target letter each); a longer list extends a shorter one."""
    rng = random.Random(f"tool_latency-{seed}")
    tasks = []
    for i in range(n):
        letter = rng.choice(_LETTERS)
        prompt = f"Call the tool with a short word containing the letter '{letter}' until it stops answering."
        tasks.append(Task(id=f"tool_latency-{seed}-{i}", prompt=prompt, answer=letter))
    return tasks


def optimal_policy(messages: list[Message], task: Task) -> str:
    """Call the tool with the target letter: every call scores."""
    return str(task.answer)


@register_env("tool_latency", tasks=make_tasks)
class ToolLatencyEnv:
    """See the module docstring."""

    def __init__(
        self,
        system_prompt: str | None = None,
        latency_median_s: float = 0.3,
        latency_sigma: float = 1.0,
        latency_max_s: float = 8.0,
        max_turns: int = 50,
        turns_alpha: float = 1.6,
    ) -> None:
        if latency_median_s < 0 or latency_sigma < 0 or latency_max_s < 0:
            raise ValueError("latency_median_s, latency_sigma and latency_max_s must be >= 0")
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if turns_alpha < 0:
            raise ValueError(f"turns_alpha must be >= 0, got {turns_alpha}")
        self.system_prompt = system_prompt
        self.latency = (latency_median_s, latency_sigma, latency_max_s)
        self.max_turns = max_turns
        self.turns_alpha = turns_alpha
        self._limit = max_turns
        self._task_id = ""
        self._letter = ""
        self._turns = 0
        self._hits = 0
        self._done = True

    async def reset(self, task: Task) -> list[Message]:
        self._task_id = task.id
        self._letter = str(task.answer).lower()
        self._limit = self.max_turns  # the real count is drawn at the first reply
        self._turns, self._hits, self._done = 0, 0, False
        return initial_messages(task, self.system_prompt)

    async def step(self, assistant_text: str) -> StepResult:
        if self._done:
            return StepResult([], 0.0, True, {"error": "step() called outside an episode"})
        self._turns += 1
        seed = f"{self._task_id}\x00{self._turns}\x00{assistant_text}"
        if self._turns == 1:
            self._limit = draw_turns(random.Random(seed), self.max_turns, self.turns_alpha)
        latency = draw_latency(random.Random(seed + "\x00latency"), *self.latency)
        await asyncio.sleep(latency)  # the remote service: wall time, no local CPU
        hit = self._letter in assistant_text.lower()
        self._hits += int(hit)
        info: dict[str, Any] = {"turn": self._turns, "hit": hit, "latency_s": latency}
        if self._turns >= self._limit:
            self._done = True
            return StepResult([], self._hits / self._turns, True, info)
        return StepResult([{"role": "tool", "content": f"ok {self._turns}"}], 0.0, False, info)

    async def close(self) -> None:
        self._done = True
