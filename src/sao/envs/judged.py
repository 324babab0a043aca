"""LLM-judged rewards for any environment: `JudgedEnv` wraps an env and grades each finished episode.

The wrapper forwards ``reset``/``step``/``close``, ``tools``, ``name``, ``sandbox_mode``, ``max_turns`` and
``set_training_progress`` to the env it wraps and records the conversation (the reset messages, each
assistant text, each observation). The episode ends at the step that returns ``done=True`` or the step
that reaches ``max_turns`` (the agent loop's bound: the smaller of the run's and the env's own); there
the episode is graded by the judge (`sao.envs.judge_client.JudgeClient`, template fields from
`episode_fields`) and that step's reward becomes ``combine(env_reward, judge_score)`` (`COMBINES`):
``product`` (the paper's quality × style), ``sum``, ``mean`` or ``judge`` (the judge's score alone). Its
info gains ``judge_score``, ``env_reward``, ``judge_latency_s`` and ``judge_cached``; earlier steps pass
through unchanged. An episode cut by the token budget has no last step, so no grade (the agent loop gives
it reward 0, as for any env).

``score(task, messages)`` (the gateway's verifier path) combines the wrapped env's own ``score`` (when it
has one; otherwise the judge's score alone) with a grade of those messages.

A judge that fails raises `sao.envs.base.JudgeError` out of ``step``/``score``: the agent loop drops the
episode as ``judge_error``; no reward is made up. The client is shared (one per run: its concurrency
bound, cache and counters span every episode), so ``close`` does not close it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .base import (
    Env,
    Message,
    StepResult,
    Task,
    TrainingProgress,
    has_scorer,
    message_text,
    notify_training_progress,
    score_conversation,
)
from .judge_client import JudgeClient, JudgeFields

__all__ = ["COMBINES", "JudgedEnv", "episode_fields", "transcript"]

# combine(env_reward, judge_score) -> the step's reward; judge_score is in [0, 1]
COMBINES: dict[str, Callable[[float, float], float]] = {
    "product": lambda env, judge: env * judge,
    "sum": lambda env, judge: env + judge,
    "mean": lambda env, judge: (env + judge) / 2,
    "judge": lambda env, judge: judge,
}


def transcript(messages: list[Message]) -> str:
    """A plain ``role: text`` transcript, one message a line (texts keep their own newlines); a structured
    tool call shows as ``assistant: [tool call] name(arguments)``."""
    lines = []
    for m in messages:
        role, text = str(m.get("role", "?")), message_text(m)
        if text or not m.get("tool_calls"):
            lines.append(f"{role}: {text}")
        for call in m.get("tool_calls") or ():
            fn = call.get("function") if isinstance(call, Mapping) else None
            fn = fn if isinstance(fn, Mapping) else {}
            lines.append(f"{role}: [tool call] {fn.get('name', '?')}({fn.get('arguments', '')})")
    return "\n".join(lines)


def episode_fields(
    messages: list[Message],
    answer: Any = None,
    reward: float | None = None,
    info: Mapping[str, Any] | None = None,
) -> JudgeFields:
    """The judge template's fields of an episode's chat messages: ``prompt`` the first user message,
    ``conversation`` its `transcript`, ``response`` the last assistant message's text."""
    first = next((m for m in messages if m.get("role") == "user"), None)
    last = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
    return JudgeFields(
        prompt=message_text(first) if first else "",
        conversation=transcript(messages),
        response=message_text(last) if last else "",
        answer=answer,
        reward=reward,
        info=dict(info or {}),
    )


class JudgedEnv:
    """``inner_env`` with its episodes graded by ``client`` (see the module docstring).

    Args:
        inner_env: any `sao.envs.base.Env`.
        client: the judge; share one across the run's envs.
        combine: a key of `COMBINES`.
        max_turns: the run's turn bound (None: the env's own); the wrapper's ``max_turns`` is the smaller.
    """

    def __init__(
        self, inner_env: Env, client: JudgeClient, combine: str = "product", max_turns: int | None = None
    ) -> None:
        if combine not in COMBINES:
            raise ValueError(f"unknown judge combine {combine!r}; known: {', '.join(COMBINES)}")
        if max_turns is not None and (isinstance(max_turns, bool) or not isinstance(max_turns, int)):
            raise ValueError(f"max_turns must be an integer, got {max_turns!r}")
        own = getattr(inner_env, "max_turns", None)
        bounds = [int(b) for b in (own, max_turns) if b is not None]
        if not bounds or min(bounds) < 1:
            raise ValueError(
                f"a judged env needs max_turns >= 1 (the env's {own!r}, the run's {max_turns!r})"
            )
        self.inner, self.client, self.combine = inner_env, client, combine
        self.max_turns = min(bounds)
        self._task: Task | None = None
        self._messages: list[Message] = []
        self._turns = 0

    @property
    def name(self) -> str:
        name = getattr(self.inner, "name", None)
        return name if isinstance(name, str) and name else type(self.inner).__name__

    @property
    def tools(self) -> Any:
        return getattr(self.inner, "tools", None)

    @property
    def sandbox_mode(self) -> Any:  # recorded in the trajectory for envs that run model code
        return getattr(self.inner, "sandbox_mode", None)

    def set_training_progress(self, progress: TrainingProgress) -> None:
        notify_training_progress(self.inner, progress)

    async def reset(self, task: Task) -> list[Message]:
        messages = await self.inner.reset(task)
        self._task, self._turns = task, 0
        self._messages = [dict(m) for m in messages]
        return messages

    async def step(self, assistant_text: str) -> StepResult:
        result = await self.inner.step(assistant_text)
        if self._task is None:  # outside an episode (after its end): the env's answer as is
            return result
        self._turns += 1
        self._messages.append({"role": "assistant", "content": assistant_text})
        if not result.done and self._turns < self.max_turns:
            self._messages.extend(dict(m) for m in result.observation)
            return result
        task, self._task = self._task, None
        env_reward = float(result.reward)
        fields = episode_fields(self._messages, task.answer, env_reward, result.info)
        grade = await self.client.grade(fields)
        info = dict(result.info) | {
            "judge_score": grade.score,
            "env_reward": env_reward,
            "judge_latency_s": grade.latency_s,
            "judge_cached": grade.cached,
        }
        reward = COMBINES[self.combine](env_reward, grade.score)
        return StepResult(result.observation, reward, result.done, info)

    async def score(self, task: Task, messages: list[Message]) -> float:
        """The reward of a conversation this env did not play: the wrapped env's ``score`` (through
        `score_conversation`) combined with a judge grade, or the grade alone when it has none."""
        env_reward = await score_conversation(self.inner, task, messages) if has_scorer(self.inner) else None
        grade = await self.client.grade(episode_fields(messages, task.answer, env_reward))
        return grade.score if env_reward is None else COMBINES[self.combine](env_reward, grade.score)

    async def close(self) -> None:
        self._task = None
        await self.inner.close()
