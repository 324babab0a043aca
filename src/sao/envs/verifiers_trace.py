"""`verifiers` messages and traces for sao (`sao.envs.verifiers_env`, `sao.envs.verifiers_seat`): ``vf``
messages as sao chat messages, the messages a rollout opens with, minting a ``vf.Trace`` and recording
messages on it, and finishing a rollout (the task's ``finalize`` and scoring) as the library does.

Task hooks that take a ``runtime`` get `NO_RUNTIME`, which refuses any use (`EnvError`): sao runs
verifiers tasks without a sandbox. `check_playable` refuses task classes sao cannot play.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from sao.envs.base import EnvError, Message

__all__ = [
    "NO_RUNTIME",
    "call_hook",
    "chat_message",
    "check_playable",
    "commit",
    "finish_rollout",
    "new_trace",
    "prompt_messages",
]


class _NoRuntime:
    """The ``runtime`` that task hooks get: any use is refused, naming what was asked."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # protocol lookups (copy, pickle) see a plain object
            raise AttributeError(name)
        raise EnvError(
            f"this verifiers task uses its runtime (runtime.{name}); sao runs tasks without a sandbox"
        )

    def __repr__(self) -> str:
        return "NO_RUNTIME"


NO_RUNTIME = _NoRuntime()


def check_playable(task_cls: type) -> None:
    """Refuse (`EnvError`) task classes sao cannot play: those needing a container, or rewriting the
    model's messages with ``@vf.intercept`` hooks (the policy's tokens must stay what the env saw)."""
    name = task_cls.__name__
    if getattr(task_cls, "NEEDS_CONTAINER", False):
        raise EnvError(f"verifiers task {name} needs a container runtime, which sao does not provide")
    hooks = sorted({n for k in task_cls.__mro__ for n, fn in vars(k).items() if hasattr(fn, "intercept")})
    if hooks:
        raise EnvError(
            f"verifiers task {name} rewrites messages with @vf.intercept hooks {hooks}; not supported"
        )


def _text(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if any(getattr(part, "type", "text") != "text" for part in content):
        raise EnvError("a verifiers message with image content; sao's verifiers adapter is text-only")
    return "\n".join(part.text for part in content)


def chat_message(message: Any) -> Message:
    """A ``vf`` message as a sao (OpenAI chat) message: text content; an assistant message's structured
    ``tool_calls``; a tool message's ``tool_call_id`` and ``name``."""
    out: Message = {"role": message.role, "content": _text(message.content)}
    if message.role == "assistant" and message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    elif message.role == "tool":
        out["tool_call_id"] = message.tool_call_id
        if message.name:
            out["name"] = message.name
    return out


def prompt_messages(data: Any) -> list[Any]:
    """The ``vf`` messages a rollout of ``data`` (a ``vf.TaskData``) opens with, as the ``null`` harness
    sends them: the system prompt as its own message, then the prompt (a string as one user message,
    messages as they are, few-shot turns included). None of the prompt when it is None (the env opens)."""
    import verifiers.v1 as vf

    messages: list[Any] = [vf.SystemMessage(content=data.system_prompt)] if data.system_prompt else []
    if isinstance(data.prompt, str):
        messages.append(vf.UserMessage(content=data.prompt))
    elif data.prompt:
        messages.extend(data.prompt)
    return messages


def new_trace(task: Any, agent_config: Any) -> Any:
    """An empty ``vf.Trace`` of ``task`` played by the agent of ``agent_config``, as a rollout mints it."""
    import verifiers.v1 as vf
    from verifiers.v1.state import state_cls  # 0.4.0 exports no public name for a class's State type

    record = vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash)
    return vf.Trace(task=record, state=state_cls(type(task))(), agent=vf.AgentInfo(config=agent_config))


def commit(trace: Any, message: Any, sampled: bool = False) -> int:
    """Append ``message`` to the trace's (linear) message graph; ``sampled``: the model produced it."""
    import verifiers.v1 as vf

    parent = len(trace.nodes) - 1 if trace.nodes else None
    tools = list(trace.tools) if parent is None else []
    trace.nodes.append(vf.MessageNode(parent=parent, message=message, sampled=sampled, tools=tools))
    return len(trace.nodes) - 1


async def call_hook(fn: Callable[..., Any], **available: Any) -> Any:
    """Call a task hook with the values it declares by name (the library's convention), awaited."""
    params = inspect.signature(fn).parameters
    result = fn(**{name: value for name, value in available.items() if name in params})
    return await result if inspect.isawaitable(result) else result


async def finish_rollout(task: Any, trace: Any) -> None:
    """End a rollout as the library does: the task's ``finalize``, then its scoring, on ``trace``."""
    await call_hook(task.finalize, trace=trace, runtime=NO_RUNTIME)
    await task.score(trace, NO_RUNTIME)
    trace.is_completed, trace.ok = True, True
