"""The environment contract: tasks, the async `Env` protocol, step results, and the env registry.

An environment plays one episode of a task: ``reset(task)`` returns the initial chat messages; each
``step(assistant_text)`` takes the model's turn and returns the new messages (tool output, user turns),
the turn's reward, and whether the episode is over. Rewards are per turn; the episode's outcome is the
reward of its last turn (outcome-only environments return 0 before that). Environments never see tokens:
the agent loop (`sao.rollout`) owns tokenisation.

Users register environments by name (``@register_env("name")``, into the table here) or point the config
at their own file or module (``"path/to/my_env.py:MyEnv"`` / ``"package.module:MyEnv"``), so no fork is
needed. An env that generates its own tasks says so (``@register_env("name", tasks=make_tasks)``, or a
``make_tasks(n, seed)`` static/class method on the class). Building one by name or source is
`sao.envs.factory` (``make_env``, ``make_env_tasks``), which reads this table; this module imports no other
part of sao, so env modules (built-in or a user's) depend on it and never the other way round.

Envs whose behaviour depends on where training stands may implement the optional
``set_training_progress(TrainingProgress)`` (see `Env`); `notify_training_progress` calls it when present.
Envs that can grade a finished conversation they did not play themselves (an external agent's, sent to
the gateway with its task id) implement the optional ``score(task, messages) -> float`` (see `Env`);
`score_conversation` calls it, checks its input and result, and `has_scorer` says whether an env has one.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "ENV_REGISTRY",
    "ENV_TASKS",
    "Env",
    "EnvError",
    "JudgeError",
    "Message",
    "StepResult",
    "Task",
    "TaskSource",
    "TrainingProgress",
    "has_scorer",
    "initial_messages",
    "message_text",
    "notify_training_progress",
    "register_env",
    "score_conversation",
]

Message = dict[str, Any]  # {"role": "system" | "user" | "assistant" | "tool", "content": str, ...}


class EnvError(ValueError):
    """An environment that cannot be found, loaded or built (configuration error, not a model error)."""


class JudgeError(RuntimeError):
    """A reward that could not be obtained from a judge (an LLM grader that failed, timed out or answered
    unparseably after its retries). Raised from ``step`` (or ``score``), it drops the episode with reason
    ``judge_error`` instead of training on a made-up reward; the run goes on."""


@dataclass(frozen=True)
class Task:
    """One problem: ``prompt`` (text of the first user message, or full initial messages), the reference
    ``answer`` and hidden ``tests`` where the family has them, and free-form ``metadata``."""

    id: str
    prompt: str | list[Message]
    answer: Any = None
    tests: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepResult:
    """What the environment answers to one assistant turn."""

    observation: list[Message]  # messages appended after the assistant turn (may be empty when done)
    reward: float = 0.0  # this turn's reward; the last turn's is the episode outcome
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TrainingProgress:
    """Where training stands when an episode starts: plain data, so envs need to know nothing of training.

    ``step``: the trainer's completed optimizer steps; ``trained_trajectories``: the number of trajectories
    trained on so far (both 0 before the first step).
    """

    step: int
    trained_trajectories: int

    def __post_init__(self) -> None:
        if self.step < 0 or self.trained_trajectories < 0:
            raise ValueError(f"training progress cannot be negative, got {self}")


@runtime_checkable
class Env(Protocol):
    """One episode at a time. ``max_turns`` bounds the episode (the agent loop enforces it).

    Optional attributes the agent loop reads when present: ``name`` (recorded in the trajectory's
    metadata; default the class name) and ``tools`` (OpenAI-style function schemas passed to the chat
    template, which lists them in the system turn).

    Optional method ``set_training_progress(progress: TrainingProgress) -> None``: for envs whose
    behaviour depends on where training stands (a curriculum, a preference that shifts during training,
    e.g. `sao.envs.style_shift`). A training run calls it (through `notify_training_progress`) on the
    fresh env right before ``reset`` of every training episode, with the progress at that moment, and of
    every episode of its held-out evaluations, with the progress when the evaluation started; `sao eval`
    never calls it, so an env must behave sensibly without it.

    Optional method ``score(task: Task, messages: list[Message]) -> float`` (plain or ``async def``): the
    outcome reward this env gives the finished conversation ``messages`` of ``task`` when it did not play
    it itself (an external agent talking to the gateway asks sao to verify its episode instead of posting
    its own reward). ``messages`` are OpenAI chat-format messages (``system``/``user``/``assistant``/
    ``tool``), the last one the final assistant message; an assistant message may carry structured
    ``tool_calls`` (``[{"id", "type": "function", "function": {"name", "arguments": "<json>"}}]``) with
    ``content`` None, and ``tool`` messages carry the agent's own tool results in ``content``. It should
    reward a conversation as ``step`` would have rewarded the same final turn, must not depend on (or
    disturb) an episode in progress, and should return 0.0, not raise, for a conversation that is merely
    wrong or malformed. Callers go through `score_conversation`, which checks the input and the result.
    """

    max_turns: int

    async def reset(self, task: Task) -> list[Message]:
        """Start an episode; returns the initial messages (system and/or user)."""
        ...

    async def step(self, assistant_text: str) -> StepResult:
        """Play one assistant turn (its text without the end-of-turn token)."""
        ...

    async def close(self) -> None:
        """Release resources (sandboxes, files). Called once per episode by the agent loop."""
        ...


def initial_messages(
    task: Task, system_prompt: str | None = None, user_text: str | None = None
) -> list[Message]:
    """The usual ``reset`` answer: a task given as messages is used as is (copied); otherwise an optional
    system message and one user message with ``user_text`` (default: the task's prompt)."""
    if isinstance(task.prompt, list):
        return [dict(m) for m in task.prompt]
    messages: list[Message] = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": str(task.prompt) if user_text is None else user_text})
    return messages


def notify_training_progress(env: Any, progress: TrainingProgress) -> None:
    """Call ``env.set_training_progress(progress)`` when the env has that method; otherwise do nothing."""
    hook = getattr(env, "set_training_progress", None)
    if callable(hook):
        hook(progress)


def has_scorer(env: Any) -> bool:
    """Whether ``env`` implements the optional ``score(task, messages)`` method (see `Env`)."""
    return callable(getattr(env, "score", None))


def message_text(message: Message) -> str:
    """The text of a chat message's ``content``: a string as is, None as ``""``, and a list of OpenAI
    content parts as its ``text`` parts joined (other parts, e.g. images, are skipped)."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type", "text") == "text"
        )
    return str(content)


def _env_label(env: Any) -> str:
    name = getattr(env, "name", None)
    return repr(name) if isinstance(name, str) and name else type(env).__name__


async def score_conversation(env: Any, task: Task, messages: list[Message]) -> float:
    """The outcome reward ``env`` gives the finished conversation ``messages`` of ``task``: its ``score``
    method (see `Env`), awaited when it is a coroutine, as a float.

    Raises `EnvError` when the env has no ``score`` method (the caller must then post an explicit reward),
    when ``messages`` is not a non-empty list whose last message is an assistant message, and when the
    score is not a finite real number (a bool is refused too). Errors raised by ``score`` itself propagate.
    """
    label = _env_label(env)
    scorer = getattr(env, "score", None)
    if not callable(scorer):
        raise EnvError(
            f"environment {label} has no score() method, so it cannot verify a conversation; "
            "post an explicit reward instead"
        )
    if not isinstance(messages, list) or not messages:
        raise EnvError("scoring needs a non-empty list of messages ending with the final assistant message")
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "assistant":
        role = last.get("role") if isinstance(last, dict) else type(last).__name__
        raise EnvError(f"the last message of a scored conversation must be an assistant one, got {role!r}")
    result = scorer(task, messages)
    if inspect.isawaitable(result):
        result = await result
    if isinstance(result, bool) or not isinstance(result, numbers.Real):
        raise EnvError(f"environment {label} score() returned {result!r}, not a real number")
    value = float(result)
    if not math.isfinite(value):
        raise EnvError(f"environment {label} score() returned {value!r}, not a finite number")
    return value


TaskSource = Callable[[int, int], list[Task]]  # tasks(n, seed) -> n deterministic tasks

ENV_REGISTRY: dict[str, Callable[..., Env]] = {}
ENV_TASKS: dict[str, TaskSource] = {}  # registered name -> its task generator, for envs that have one


def register_env(
    name: str, *, tasks: TaskSource | None = None
) -> Callable[[Callable[..., Env]], Callable[..., Env]]:
    """Decorator: register an env class (or factory) under ``name``; ``make_env(name, **kw)`` builds it.

    ``tasks``: the env's own task generator, ``tasks(n, seed) -> list[Task]`` (``n`` tasks, the same for
    the same arguments); `make_env_tasks(name, n, seed)` calls it, so training needs no task file.
    """

    def deco(factory: Callable[..., Env]) -> Callable[..., Env]:
        if name in ENV_REGISTRY and ENV_REGISTRY[name] is not factory:
            raise EnvError(f"environment {name!r} is already registered")
        if tasks is not None and ENV_TASKS.get(name, tasks) is not tasks:
            raise EnvError(f"environment {name!r} already has another task generator")
        ENV_REGISTRY[name] = factory
        if tasks is not None:
            ENV_TASKS[name] = tasks
        return factory

    return deco
