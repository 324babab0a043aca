"""The environment contract: tasks, the async `Env` protocol, step results, and the env registry.

An environment plays one episode of a task: ``reset(task)`` returns the initial chat messages; each
``step(assistant_text)`` takes the model's turn and returns the new messages (tool output, user turns),
the turn's reward, and whether the episode is over. Rewards are per turn; the episode's outcome is the
reward of its last turn (outcome-only environments return 0 before that). Environments never see tokens:
the agent loop (`sao.rollout`) owns tokenisation.

Users register environments by name (``@register_env("name")``) or point the config at their own file
or module (``"path/to/my_env.py:MyEnv"`` / ``"package.module:MyEnv"``), so no fork is needed.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "ENV_REGISTRY",
    "Env",
    "EnvError",
    "Message",
    "StepResult",
    "Task",
    "initial_messages",
    "load_env_class",
    "make_env",
    "register_env",
]

Message = dict[str, Any]  # {"role": "system" | "user" | "assistant" | "tool", "content": str, ...}


class EnvError(ValueError):
    """An environment that cannot be found, loaded or built (configuration error, not a model error)."""


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


@runtime_checkable
class Env(Protocol):
    """One episode at a time. ``max_turns`` bounds the episode (the agent loop enforces it).

    Optional attributes the agent loop reads when present: ``name`` (recorded in the trajectory's
    metadata; default the class name) and ``tools`` (OpenAI-style function schemas passed to the chat
    template, which lists them in the system turn).
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


ENV_REGISTRY: dict[str, Callable[..., Env]] = {}


def register_env(name: str) -> Callable[[Callable[..., Env]], Callable[..., Env]]:
    """Decorator: register an env class (or factory) under ``name``; ``make_env(name, **kw)`` builds it."""

    def deco(factory: Callable[..., Env]) -> Callable[..., Env]:
        if name in ENV_REGISTRY and ENV_REGISTRY[name] is not factory:
            raise EnvError(f"environment {name!r} is already registered")
        ENV_REGISTRY[name] = factory
        return factory

    return deco


def load_env_class(source: str) -> Callable[..., Env]:
    """Import ``"path/to/file.py:Name"`` or ``"package.module:Name"`` and return ``Name``."""
    path_or_module, sep, attr = source.rpartition(":")
    if not sep or not path_or_module or not attr:
        raise EnvError(
            f"env source {source!r} must look like 'path/to/env.py:ClassName' or 'module:ClassName'"
        )
    if path_or_module.endswith(".py"):
        file = Path(path_or_module)
        if not file.is_file():
            raise EnvError(f"env source file {str(file)!r} does not exist")
        module_name = f"sao_user_env_{abs(hash(file.resolve()))}"
        spec = importlib.util.spec_from_file_location(module_name, file)
        if spec is None or spec.loader is None:
            raise EnvError(f"cannot import {str(file)!r}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as err:
            raise EnvError(f"importing {str(file)!r} failed: {type(err).__name__}: {err}") from err
    else:
        try:
            module = importlib.import_module(path_or_module)
        except ImportError as err:
            raise EnvError(f"cannot import module {path_or_module!r}: {err}") from err
    try:
        return getattr(module, attr)
    except AttributeError:
        raise EnvError(f"{path_or_module!r} has no attribute {attr!r}") from None


def make_env(name_or_source: str, **kwargs: Any) -> Env:
    """Build an environment from a registered name or a ``file.py:Class`` / ``module:Class`` source."""
    if ":" in name_or_source:
        factory = load_env_class(name_or_source)
    else:
        _load_builtins()
        try:
            factory = ENV_REGISTRY[name_or_source]
        except KeyError:
            known = ", ".join(sorted(ENV_REGISTRY)) or "none"
            raise EnvError(f"unknown environment {name_or_source!r}; registered: {known}") from None
    try:
        env = factory(**kwargs)
    except (TypeError, ValueError) as err:  # wrong or invalid constructor arguments
        raise EnvError(f"cannot build environment {name_or_source!r}: {err}") from err
    for attr in ("reset", "step", "close"):
        if not callable(getattr(env, attr, None)):
            raise EnvError(f"environment {name_or_source!r} has no {attr}() method")
    if getattr(env, "name", None) is None:
        with contextlib.suppress(AttributeError):  # the name trajectories report as metadata["env"]
            env.name = name_or_source  # type: ignore[attr-defined]
    return env


def _load_builtins() -> None:
    """Import the built-in environments so they register themselves."""
    importlib.import_module("sao.envs.builtin")
