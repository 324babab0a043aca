"""``style_shift``: the paper's online-learning study — the preferred writing style changes during training.

One turn. The user asks ``Write one sentence about <topic>.``; the reply earns ``quality × style`` ∈ {0, 1}
from a judge (`sao.envs.judges`: the deterministic `RuleJudge` by default, or an `LLMJudge`). The preferred
style is *not* in the prompt: the policy must track it from rewards alone, which is what the study measures
(how fast a method recovers after each shift).

The style follows a schedule over episode indices, cute → chuunibyou → classical by default: either
``schedule=[(0, "cute"), (300, "chuunibyou"), (600, "classical")]`` (start episode, style; the last style
stays) or ``shift_every=k`` (the three styles in that order, k episodes each). Which episode index an
episode has, in order of precedence (the *clock*, recorded as ``info["clock"]``):

1. ``"training"`` — `StyleShiftEnv.set_training_progress` (the training-progress hook of `sao.envs.Env`,
   which a training run calls on every fresh env right before ``reset``): the index is
   ``progress.trained_trajectories``, so ``shift_every=k`` switches the preferred style of new episodes
   after k trained trajectories (and schedule starts count trained trajectories). It applies to the next
   `reset` only;
2. ``"episode_index"`` — `StyleShiftEnv.set_episode` (a caller driving the schedule with its own episode
   counter); the env counts on from there (k, k + 1, ...) on later resets of the same instance;
3. ``"task_metadata"`` — ``task.metadata["episode"]``: `make_tasks` numbers its tasks 0, 1, 2, ..., so a
   task stream consumed in order follows the schedule with no plumbing, even with one env per episode;
4. ``"reset_count"`` — otherwise the number of earlier resets of this instance.

``StepResult.info`` carries ``style`` (the preferred style), ``episode``, ``clock``, ``training_step``
(on the training clock), ``quality``, ``style_ok``, and ``judge_error`` when the judge failed (reward 0).
Optimal score 1.0 (the rule judge is satisfiable in every style, e.g. ``The cat is fluffy~`` /
``The cat of darkness awakens!`` / ``Thy cat doth sleep.``).
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .base import Message, StepResult, Task, TrainingProgress, initial_messages, register_env
from .judges import STYLES, Judge, make_judge

__all__ = [
    "CLOCKS",
    "DEFAULT_SHIFT_EVERY",
    "OPTIMAL_SCORE",
    "TOPICS",
    "StyleSchedule",
    "StyleShiftEnv",
    "make_tasks",
]

OPTIMAL_SCORE = 1.0
DEFAULT_SHIFT_EVERY = 200
TOPICS = (
    "cat", "dog", "rain", "moon", "sea", "tea", "fire", "snow",
    "star", "tree", "wind", "cake", "bird", "book", "night", "sun",
)  # fmt: skip
CLOCKS = ("training", "episode_index", "task_metadata", "reset_count")  # see the module docstring
_TOPIC = re.compile(r"about (.+?)\.?$")


@dataclass(frozen=True)
class StyleSchedule:
    """``entries``: (start episode, style) pairs, starts strictly increasing from 0."""

    entries: tuple[tuple[int, str], ...]

    def __post_init__(self) -> None:
        if not self.entries:
            raise ValueError("a style schedule needs at least one (start_episode, style) entry")
        starts = [start for start, _ in self.entries]
        if starts[0] != 0:
            raise ValueError(f"the schedule must start at episode 0, got {starts[0]}")
        if any(b <= a for a, b in itertools.pairwise(starts)):
            raise ValueError(f"schedule start episodes must be strictly increasing, got {starts}")
        for _, style in self.entries:
            if style not in STYLES:
                raise ValueError(f"unknown style {style!r} in the schedule; known: {', '.join(STYLES)}")

    @classmethod
    def from_pairs(cls, pairs: Sequence[Sequence[Any]]) -> StyleSchedule:
        """From ``[(start, style), ...]`` (lists from YAML work too)."""
        try:
            entries = tuple((int(start), str(style)) for start, style in pairs)
        except (TypeError, ValueError):
            raise ValueError(
                f"schedule must be a list of (start_episode, style) pairs, got {pairs!r}"
            ) from None
        return cls(entries)

    @classmethod
    def every(cls, shift_every: int, styles: Sequence[str] = STYLES) -> StyleSchedule:
        """``styles`` in order, ``shift_every`` episodes each (the last one stays)."""
        if shift_every < 1:
            raise ValueError(f"shift_every must be >= 1, got {shift_every}")
        return cls(tuple((i * shift_every, style) for i, style in enumerate(styles)))

    def style_at(self, episode: int) -> str:
        """The preferred style at ``episode`` (episodes before 0 get the first style)."""
        current = self.entries[0][1]
        for start, style in self.entries:
            if episode < start:
                break
            current = style
        return current


def make_tasks(n: int, seed: int = 0, topics: Sequence[str] = TOPICS) -> list[Task]:
    """``n`` deterministic tasks, metadata ``{"topic", "episode": i}``; longer lists extend shorter ones."""
    rng = random.Random(f"style_shift-{seed}")
    tasks = []
    for i in range(n):
        topic = rng.choice(list(topics))
        tasks.append(
            Task(
                id=f"style_shift-{seed}-{i}",
                prompt=f"Write one sentence about {topic}.",
                metadata={"topic": topic, "episode": i},
            )
        )
    return tasks


@register_env("style_shift", tasks=make_tasks)
class StyleShiftEnv:
    """See the module docstring.

    Args:
        schedule: (start_episode, style) pairs; exclusive with ``shift_every``.
        shift_every: episodes per style (default `DEFAULT_SHIFT_EVERY` when neither is given).
        judge: ``"rule"``, ``"llm"`` or any object with ``async grade(topic, style, text) -> Verdict``.
        judge_options: keyword arguments of `LLMJudge` (``base_url``, ``model``, ...) for ``judge="llm"``.
        system_prompt: an optional system message.
    """

    max_turns = 1

    def __init__(
        self,
        schedule: Sequence[Sequence[Any]] | None = None,
        shift_every: int | None = None,
        judge: str | Judge = "rule",
        judge_options: Mapping[str, Any] | None = None,
        system_prompt: str | None = None,
    ) -> None:
        if schedule is not None and shift_every is not None:
            raise ValueError("give either schedule or shift_every, not both")
        self.schedule = (
            StyleSchedule.from_pairs(schedule)
            if schedule is not None
            else StyleSchedule.every(shift_every or DEFAULT_SHIFT_EVERY)
        )
        self.judge: Judge = make_judge(judge, **(judge_options or {})) if isinstance(judge, str) else judge
        self.system_prompt = system_prompt
        self._progress: TrainingProgress | None = None
        self._next_episode: int | None = None
        self._resets = 0
        self._episode = 0
        self._clock = "reset_count"
        self._training_step: int | None = None
        self._topic = ""
        self._done = True

    def set_training_progress(self, progress: TrainingProgress) -> None:
        """The training-progress hook: the next `reset` plays episode ``progress.trained_trajectories``
        (takes precedence over `set_episode` and the task's episode number; the next reset only)."""
        self._progress = progress

    def set_episode(self, episode: int) -> None:
        """Make the next `reset` play episode ``episode`` (later resets count on from it)."""
        self._next_episode = int(episode)

    @property
    def clock(self) -> str:
        """Which clock gave the current (or last) episode its index (one of `CLOCKS`)."""
        return self._clock

    @property
    def episode(self) -> int:
        """The index of the current (or last) episode."""
        return self._episode

    @property
    def current_style(self) -> str:
        """The preferred style of the current (or last) episode."""
        return self.schedule.style_at(self._episode)

    async def reset(self, task: Task) -> list[Message]:
        self._training_step = None
        if self._progress is not None:
            self._episode, self._clock = int(self._progress.trained_trajectories), "training"
            self._training_step = int(self._progress.step)
            self._progress = None
        elif self._next_episode is not None:
            self._episode, self._clock = self._next_episode, "episode_index"
            self._next_episode += 1
        elif "episode" in task.metadata:
            self._episode, self._clock = int(task.metadata["episode"]), "task_metadata"
        else:
            self._episode, self._clock = self._resets, "reset_count"
        self._resets += 1
        self._done = False
        self._topic = str(task.metadata.get("topic") or _topic_from(task.prompt))
        return initial_messages(task, self.system_prompt)

    async def step(self, assistant_text: str) -> StepResult:
        style = self.current_style
        info: dict[str, Any] = {"style": style, "episode": self._episode, "clock": self._clock}
        if self._training_step is not None:
            info["training_step"] = self._training_step
        if self._done:
            info["error"] = "step() called outside an episode"
            return StepResult([], 0.0, True, info)
        self._done = True
        try:
            verdict = await self.judge.grade(self._topic, style, assistant_text)
        except Exception as err:  # a user judge that raises costs this episode's reward, not the run
            info.update(quality=False, style_ok=False, judge_error=f"{type(err).__name__}: {err}"[:300])
            return StepResult([], 0.0, True, info)
        info.update(quality=verdict.quality, style_ok=verdict.style)
        if verdict.error is not None:
            info["judge_error"] = verdict.error
        if verdict.details:
            info["judge_details"] = verdict.details
        return StepResult([], verdict.reward, True, info)

    async def close(self) -> None:
        self._done = True


def _topic_from(prompt: str | list[Message]) -> str:
    text = (
        prompt
        if isinstance(prompt, str)
        else next((m.get("content", "") for m in prompt if m.get("role") == "user"), "")
    )
    match = _TOPIC.search(text.strip())
    return match.group(1) if match else ""
