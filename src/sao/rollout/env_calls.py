"""Calling an environment from the agent loop: each call bounded by a timeout, each answer checked.

An env is user code: it may raise, hang, or answer with something that is not what the `Env` protocol says.
Each of those ends the episode with an `EpisodeError` carrying a drop reason (``env_error``,
``env_timeout``, or ``judge_error`` when the env raised `sao.envs.base.JudgeError`: its grader failed), so
the caller counts the episode as dropped instead of training on a half-played one or crashing the run.
``env.close()`` gets the same timeout; its failure is reported, never raised.

The timeout cancels the awaited call (``asyncio.wait_for``): it bounds an env that awaits (a subprocess, a
sandbox run in a worker thread, a network call). An env that blocks the event loop itself (a synchronous
``time.sleep`` or a CPU loop inside its coroutine) cannot be interrupted from the same loop; sandboxed
code has its own wall-clock kill (`sao.envs.sandbox`).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

from sao.envs.base import Env, JudgeError, Message, StepResult, Task

__all__ = ["DROP_REASONS", "EpisodeError", "close_env", "reset_env", "step_env"]

# Why an episode yields no trajectory (the producer counts each as ``dropped/<reason>``).
DROP_REASONS = (
    "env_error",
    "env_timeout",
    "template_error",
    "engine_error",
    "engine_crash",
    "prompt_too_long",
    "judge_error",
)

T = TypeVar("T")


class EpisodeError(RuntimeError):
    """An episode that yields no trajectory; ``reason`` is one of `DROP_REASONS`."""

    def __init__(self, message: str, reason: str = "env_error") -> None:
        if reason not in DROP_REASONS:
            raise ValueError(f"unknown drop reason {reason!r}; expected one of {DROP_REASONS}")
        super().__init__(message)
        self.reason = reason


async def _bounded(call: Awaitable[T], what: str, timeout_s: float | None) -> T:
    try:
        return await asyncio.wait_for(call, timeout_s)
    except TimeoutError:
        raise EpisodeError(f"{what} did not return within {timeout_s:g} s", "env_timeout") from None
    except JudgeError as err:  # the env's grader failed: no reward, not an env bug
        raise EpisodeError(f"{what}: judge failed: {err}", "judge_error") from err
    except Exception as err:
        raise EpisodeError(f"{what} failed: {type(err).__name__}: {err}", "env_error") from err


def _check_messages(messages: Any, what: str) -> list[Message]:
    if not isinstance(messages, (list, tuple)):
        raise EpisodeError(f"{what} returned {type(messages).__name__}, not a list of messages")
    for i, m in enumerate(messages):
        if not (isinstance(m, Mapping) and isinstance(m.get("role"), str)):
            raise EpisodeError(f"{what}: message {i} is not a mapping with a string 'role': {m!r:.200}")
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise EpisodeError(f"{what}: message {i} has content of type {type(content).__name__}")
    return [dict(m) for m in messages]


async def reset_env(env: Env, task: Task, timeout_s: float | None) -> list[Message]:
    """``env.reset(task)``, bounded and checked: a non-empty list of messages with string roles."""
    messages = _check_messages(await _bounded(env.reset(task), "env.reset", timeout_s), "env.reset")
    if not messages:
        raise EpisodeError("env.reset returned no messages")
    return messages


async def step_env(env: Env, text: str, timeout_s: float | None) -> StepResult:
    """``env.step(text)``, bounded and checked: a `StepResult`-like answer with a finite real reward, a
    boolean ``done`` (or 0/1), a list of messages and a mapping ``info``; the answer as a `StepResult`."""
    result = await _bounded(env.step(text), "env.step", timeout_s)
    missing = [name for name in ("observation", "reward", "done", "info") if not hasattr(result, name)]
    if missing:
        raise EpisodeError(f"env.step returned {type(result).__name__}, which has no {', '.join(missing)}")
    reward, done, info = _real(result.reward), result.done, result.info
    if reward is None:
        raise EpisodeError(f"env.step returned reward {result.reward!r}: not a finite real number")
    if isinstance(done, str) or done not in (True, False):  # bool, 0/1, numpy or torch booleans
        raise EpisodeError(f"env.step returned done={done!r}: not a bool")
    if not isinstance(info, Mapping):
        raise EpisodeError(f"env.step returned info of type {type(info).__name__}, not a mapping")
    observation = _check_messages(result.observation, "env.step observation")
    return StepResult(observation, reward, bool(done), dict(info))


def _real(value: Any) -> float | None:
    """``value`` as a finite float (ints, numpy and 0-d torch numbers included), or None: a bool, a
    string, NaN, an infinity or anything else is not a reward."""
    if isinstance(value, (bool, str, bytes)):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: a tensor with more than one element
        return None
    return number if math.isfinite(number) else None


async def close_env(env: Env, timeout_s: float | None) -> str | None:
    """``env.close()``, bounded; what went wrong as text, or None."""
    try:
        await _bounded(env.close(), "env.close", timeout_s)
    except EpisodeError as err:
        return str(err)
    return None
