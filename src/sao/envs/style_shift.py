"""``style_shift``: the paper's online-learning study — the preferred writing style changes during training.

One turn. The user asks ``Write one sentence about <topic>.``; the reply earns ``quality × style`` ∈ {0, 1}
from a judge: the deterministic `sao.envs.judges.RuleJudge` by default, or `LLMJudge`. The preferred
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
(on the training clock), ``quality`` and ``style_ok``. A judge that cannot grade (a failed or unparseable
LLM answer, a `Verdict` with ``error``) raises `sao.envs.base.JudgeError`: the agent loop drops the
episode as ``judge_error`` instead of training on a made-up reward. Optimal score 1.0 (the rule judge is
satisfiable in every style, e.g. ``The cat is fluffy~`` / ``The cat of darkness awakens!`` /
``Thy cat doth sleep.``). The LLM judge can also grade any env's episodes: `sao.envs.judged.JudgedEnv`.
"""

from __future__ import annotations

import itertools
import random
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import httpx

from .base import JudgeError, Message, StepResult, Task, TrainingProgress, initial_messages, register_env
from .judge_client import JudgeClient, JudgeSettings
from .judges import (
    STYLE_DESCRIPTIONS,
    STYLES,
    Judge,
    RuleJudge,
    Verdict,
    check_style,
    parse_judge_answer,
    strip_think,
)

__all__ = [
    "CLOCKS",
    "DEFAULT_SHIFT_EVERY",
    "OPTIMAL_SCORE",
    "TOPICS",
    "LLMJudge",
    "StyleSchedule",
    "StyleShiftEnv",
    "make_judge",
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
        judge_options: keyword arguments of `LLMJudge` (``base_url``, ``model``, ``timeout_s``, ...) for
            ``judge="llm"``.
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
        verdict = await self.judge.grade(self._topic, style, assistant_text)  # JudgeError propagates
        if verdict.error is not None:
            raise JudgeError(f"the style judge could not grade: {verdict.error}")
        info.update(quality=verdict.quality, style_ok=verdict.style)
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


_LLM_SYSTEM = "You are a strict grader. Reply exactly: QUALITY: yes|no STYLE: yes|no"
_LLM_DEFAULTS = {"timeout_s": 30.0, "max_tokens": 32, "retries": 2, "backoff_s": 0.5}
_LLM_FIXED = {"base_url", "model", "prompt", "system_prompt", "score_min", "score_max"}
# Envs are built per episode: one client per distinct judge in the process shares connections, the
# concurrency bound, the cache and the counters.
_SHARED_CLIENTS: dict[JudgeSettings, JudgeClient] = {}
_SHARED_LOCK = threading.Lock()


def _shared_client(settings: JudgeSettings) -> JudgeClient:
    with _SHARED_LOCK:
        if (client := _SHARED_CLIENTS.get(settings)) is None:
            client = _SHARED_CLIENTS[settings] = JudgeClient(settings)
        return client


def _verdict_value(answer: str) -> float | None:
    parsed = parse_judge_answer(strip_think(answer))
    return None if parsed is None else float(parsed[0] and parsed[1])


class LLMJudge:
    """An LLM behind an OpenAI-compatible chat endpoint grades quality and style, through a
    `sao.envs.judge_client.JudgeClient` (timeout, retries, concurrency bound, cache). The answer must be
    exactly ``QUALITY: yes|no STYLE: yes|no`` (`parse_judge_answer`, after any ``<think>`` block); a failed
    request or any other answer raises `JudgeError`.

    Args:
        base_url: the server, with or without the trailing ``/v1``.
        model: the model name to request.
        transport: an httpx transport (tests, custom routing); default: the network, through the process's
            one client per distinct settings.
        **options: other `JudgeSettings` fields: ``api_key_env``, ``timeout_s`` (30), ``max_tokens`` (32),
            ``retries`` (2), ``backoff_s`` (0.5), ``backoff_max_s``, ``concurrency``, ``cache_size``,
            ``temperature``.
    """

    def __init__(
        self, base_url: str, model: str, transport: httpx.AsyncBaseTransport | None = None, **options: Any
    ) -> None:
        known = {f.name for f in fields(JudgeSettings)} - _LLM_FIXED
        if unknown := sorted(set(options) - known):
            raise ValueError(f"unknown LLM judge option(s) {unknown}; known: {sorted(known)}")
        settings = JudgeSettings(
            base_url=base_url,
            model=model,
            system_prompt=_LLM_SYSTEM,
            score_min=0.0,
            score_max=1.0,
            **(_LLM_DEFAULTS | options),
        )
        self.client = JudgeClient(settings, transport) if transport is not None else _shared_client(settings)

    @property
    def url(self) -> str:
        return self.client.settings.chat_url

    def request_messages(self, topic: str, style: str, text: str) -> list[Message]:
        prompt = (
            f"Task: write one sentence about {topic}.\n"
            f"Wanted style: {style} ({STYLE_DESCRIPTIONS[style]}).\n"
            f"QUALITY is yes if the text is one fluent, sensible sentence about {topic}.\n"
            "STYLE is yes if it is clearly in the wanted style.\n"
            f"Text: {text}"
        )
        return [{"role": "system", "content": _LLM_SYSTEM}, {"role": "user", "content": prompt}]

    async def grade(self, topic: str, style: str, text: str) -> Verdict:
        check_style(style)
        grade = await self.client.grade_messages(self.request_messages(topic, style, text), _verdict_value)
        quality, style_ok = parse_judge_answer(strip_think(grade.raw_text)) or (False, False)
        return Verdict(quality, style_ok, details=grade.raw_text)


def make_judge(kind: str = "rule", **kwargs: Any) -> Judge:
    """``"rule"`` → `RuleJudge()`; ``"llm"`` → `LLMJudge(**kwargs)` (``base_url``, ``model``, ...)."""
    if kind == "rule":
        if kwargs:
            raise ValueError(f"the rule judge takes no options, got {sorted(kwargs)}")
        return RuleJudge()
    if kind == "llm":
        return LLMJudge(**kwargs)
    raise ValueError(f"unknown judge {kind!r}; known: rule, llm")
