"""`verifiers` environments (Prime Intellect's library, 0.4: ``verifiers.v1``) as sao envs, played under
sao's own agent loop.

``data.env: verifiers`` with ``data.env_kwargs: {env_id: <taskset package>, env_args: {...}}`` loads the
environment as ``vf-eval <env_id>`` does (``vf.resolve_env_config`` then ``vf.load_environment``: the
package's exported ``Taskset`` with its config from ``env_args``, and its own ``Env`` when it exports
one, else the library's single-agent env), once per process. Tasks are the taskset's rows
(`VerifiersEnv.make_tasks`). An episode runs the env's own control flow (``Env.setup``, ``run``,
``finalize``) in a background task whose one agent is sao's policy (`sao.envs.verifiers_seat`): each
model request the env makes is one sao turn, so generation stays sao's (token-in/token-out, log-probs,
policy versions) and the library never calls a model for the policy. The reward is the trace's
(``trace.reward``: the task's ``@vf.reward`` functions and judges, plus what the env's ``run`` or
``finalize`` recorded, weighted and summed); each reward and metric is in the last step's ``info``.

An exception in the env's hooks, a reward that was not scored or is not finite, or an episode with no
reward raises from ``step``: the agent loop drops the episode (``env_error``), never inventing a reward.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import threading
from dataclasses import dataclass
from typing import Any

from sao.envs.base import EnvError, Message, StepResult, Task, register_env
from sao.envs.extras import install_command, require_library
from sao.envs.verifiers_seat import PolicyChannel, PolicySeat
from sao.envs.verifiers_tools import ToolBox
from sao.envs.verifiers_trace import (
    chat_message,
    check_playable,
    commit,
    finish_rollout,
    new_trace,
    prompt_messages,
)

__all__ = ["VerifiersEnv", "load_verifiers_env"]

INSTALL_HINT = install_command("verifiers")
NO_TURN_LIMIT = (
    1_000_000  # ``max_turns`` when neither the config nor the env sets one: the agent loop's own bounds
)


@dataclass(frozen=True)
class LoadedEnv:
    """A loaded verifiers environment (shared by every episode of the process): the ``vf.Env``, its one
    agent (``seat`` name and ``vf.AgentConfig``), its tools' OpenAI schemas, and whether its reward is
    the task's own scoring alone (then `VerifiersEnv.score` can verify a conversation it did not play)."""

    env_id: str
    env: Any
    seat: str
    seat_config: Any
    tool_schemas: list[dict[str, Any]]
    scores_alone: bool

    def toolsets(self, task: Any) -> tuple[list[Any], list[Any]]:
        """Fresh ``vf.Toolset`` instances for a rollout of ``task``: the task's own, and the taskset's
        shared ones (built per episode here; the library shares them across a run)."""
        taskset = self.env.taskset
        return type(task).toolsets(task.config), type(taskset).toolsets(taskset.config)

    def task(self, task: Task) -> Any:
        """The ``vf.Task`` of a sao task: its row's data (``metadata["data"]``, as `VerifiersEnv.make_tasks`
        writes it), else one built from its prompt and answer."""
        taskset = self.env.taskset
        task_cls = type(taskset).task_type()
        data = task.metadata.get("data")
        if data is None:
            data = {"prompt": task.prompt, **({} if task.answer is None else {"answer": task.answer})}
        try:
            row = task_cls.data_type().model_validate(data)
        except Exception as err:
            raise EnvError(
                f"task {task.id!r} is not a row of verifiers environment {self.env_id!r}: {err}"
            ) from err
        if taskset.system_prompt is not None:  # the taskset config's override, as iterating it applies
            row = row.model_copy(update={"system_prompt": taskset.system_prompt})
        return task_cls(row, taskset.config.task)


_LOADED: dict[str, LoadedEnv] = {}
_LOADED_LOCK = threading.Lock()


def load_verifiers_env(env_id: str, env_args: dict[str, Any] | None = None) -> LoadedEnv:
    """The environment ``env_id`` (a taskset package's module name, or a hub id ``owner/name[@version]``
    of an installed package) with taskset config ``env_args``, loaded once per process (the run builds
    a fresh sao env per episode). Raises `EnvError` with what is wrong (library or package missing,
    unknown config key, more than one agent, a task sao cannot play)."""
    env_args = {} if env_args is None else env_args
    if not isinstance(env_id, str) or not env_id.strip():
        raise EnvError(f"data.env_kwargs.env_id must name a verifiers environment package, got {env_id!r}")
    if not isinstance(env_args, dict):
        raise EnvError(f"data.env_kwargs.env_args must be a mapping (the taskset's config), got {env_args!r}")
    try:
        key = json.dumps([env_id, env_args], sort_keys=True)
    except TypeError as err:
        raise EnvError(f"data.env_kwargs.env_args must be plain data (JSON): {err}") from err
    with _LOADED_LOCK:
        if key not in _LOADED:
            _LOADED[key] = _load(env_id, env_args)
        return _LOADED[key]


def _load(env_id: str, env_args: dict[str, Any]) -> LoadedEnv:
    vf = require_library("verifiers", "verifiers.v1")
    if "id" in env_args:
        raise EnvError("data.env_kwargs.env_args is the taskset's config; its id is data.env_kwargs.env_id")
    try:
        env = vf.load_environment(vf.resolve_env_config({"taskset": {**env_args, "id": env_id}}))
    except Exception as err:
        raise EnvError(f"cannot load verifiers environment {env_id!r}: {type(err).__name__}: {err}") from err
    seats = {name: value for name, value in env.config if isinstance(value, vf.AgentConfig)}
    if len(seats) != 1:
        raise EnvError(
            f"verifiers environment {env_id!r} ({type(env).__name__}) has agents {sorted(seats)}; "
            "sao plays environments with exactly one agent (its policy)"
        )
    [(seat, seat_config)] = seats.items()
    taskset = env.taskset
    task_cls = type(taskset).task_type()
    check_playable(task_cls)
    toolsets = [*task_cls.toolsets(taskset.config.task), *type(taskset).toolsets(taskset.config)]
    try:
        schemas = ToolBox.describe(toolsets)
    except EnvError:
        raise
    except Exception as err:
        raise EnvError(
            f"listing the tools of verifiers environment {env_id!r}: {type(err).__name__}: {err}"
        ) from err
    scores_alone = type(env).run is vf.SingleAgentEnv.run and type(env).finalize is vf.Env.finalize
    return LoadedEnv(env_id, env, seat, seat_config, schemas, scores_alone)


def episode_outcome(trace: Any) -> tuple[float, dict[str, Any]]:
    """The reward of a finished ``vf.Trace`` (``trace.reward``) and the step ``info``: each reward's
    ``rewards``/``reward_weights``, the finite ``metrics``, the ``stop_condition`` and the ``turns``.
    Raises RuntimeError for a reward that was not scored or is not finite, and for no reward at all."""
    if not trace.rewards:
        raise RuntimeError("the verifiers environment recorded no reward for the episode")
    for name, reward in trace.rewards.items():
        if reward is None:
            raise RuntimeError(f"verifiers reward {name!r} was not scored")
        if not (math.isfinite(reward.score) and math.isfinite(reward.weight)):
            raise RuntimeError(
                f"verifiers reward {name!r} is {reward.score!r} x weight {reward.weight!r}: not finite"
            )
    value = float(trace.reward)
    if not math.isfinite(value):
        raise RuntimeError(f"the verifiers reward is {value!r}, not finite")
    info = {
        "rewards": {name: r.score for name, r in trace.rewards.items()},
        "reward_weights": {name: r.weight for name, r in trace.rewards.items()},
        "metrics": {n: v for n, v in trace.metrics.items() if v is not None and math.isfinite(v)},
        "stop_condition": trace.stop_condition,
        "turns": trace.num_turns,
    }
    return value, info


async def _play(env: Any, task: Any, agents: Any, episode: Any, channel: PolicyChannel) -> None:
    """The env's control flow for one episode, as ``vf.Env.run_episode`` runs it (without its error
    capture: what the hooks raise goes to sao), ending the channel either way."""
    try:
        await env.setup(agents)
        await env.run(task, agents)
        if not episode.traces:
            raise RuntimeError(f"{type(env).__name__}.run() ran no agent")
        await env.finalize(task, episode)
    except Exception as err:
        channel.end(err)
    else:
        channel.end(None)


@register_env("verifiers")
class VerifiersEnv:
    """One episode of a verifiers environment (see the module docstring).

    ``env_id``: the environment package (module name as ``vf-eval`` takes it; hub ids
    ``owner/name[@version]`` import as ``name``). ``env_args``: its taskset config (the fields of its
    ``vf.TasksetConfig``, e.g. ``num_tasks``; ``task`` for the ``vf.TaskConfig``). ``max_turns``: model
    turns before the env stops the rollout (which is still scored, as in the library); default the
    agent's own ``max_turns``, else none (then only the agent loop's limit, which scores nothing).
    """

    def __init__(
        self, env_id: str, env_args: dict[str, Any] | None = None, max_turns: int | None = None
    ) -> None:
        self._loaded = load_verifiers_env(env_id, env_args)
        limit = self._loaded.seat_config.max_turns if max_turns is None else max_turns
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise EnvError(f"data.env_kwargs.max_turns must be a positive integer, got {limit!r}")
        self._turn_limit: int | None = limit
        self.max_turns = NO_TURN_LIMIT if limit is None else limit
        self.tools = self._loaded.tool_schemas or None
        self.name = f"verifiers:{env_id}"
        self._channel: PolicyChannel | None = None
        self._play: asyncio.Task[None] | None = None
        self._episode: Any = None
        self._done = False

    @staticmethod
    def make_tasks(
        n: int, seed: int = 0, env_id: str = "", env_args: dict[str, Any] | None = None
    ) -> list[Task]:
        """``n`` tasks from the environment's taskset, deterministic in ``seed``: a finite taskset's rows
        shuffled with ``seed`` (cycled, reshuffled per pass, when ``n`` exceeds them; ids get ``-r<pass>``),
        an infinite one's positions ``[seed*n, seed*n + n)``. ``Task.prompt``: the messages the model is
        first shown (system prompt and few-shot turns included); ``answer``: the row's ``answer`` field
        if it has one; ``metadata``: ``row`` (its index) and ``data`` (the row, JSON) for `reset`."""
        loaded = load_verifiers_env(env_id, env_args)
        taskset = loaded.env.taskset
        if not taskset.bounded:
            return [_task(loaded, t, 0) for t in taskset.skip(seed * n).take(n)]
        rows = list(taskset)
        if not rows and n:
            raise EnvError(f"verifiers environment {env_id!r} has no tasks")
        tasks: list[Task] = []
        for cycle in range(-(-n // max(len(rows), 1))):
            order = list(rows)
            random.Random(f"{seed}/{cycle}").shuffle(order)
            tasks.extend(_task(loaded, t, cycle) for t in order[: n - len(tasks)])
        return tasks

    async def reset(self, task: Task) -> list[Message]:
        """Start the env's control flow on ``task``; returns the messages of the model's first request."""
        import verifiers.v1 as vf

        if self._channel is not None:
            raise EnvError("a VerifiersEnv plays one episode; build a new one per episode")
        loaded = self._loaded
        vf_task = loaded.task(task)
        channel = self._channel = PolicyChannel()
        record = vf.TraceTask(
            type=type(vf_task).__name__, data=vf_task.data, key=vf_task.key, hash=vf_task.hash
        )
        episode = self._episode = vf.Episode(env=vf.EnvInfo(id=loaded.env.config.env_id), task=record)
        seat = PolicySeat(
            loaded.seat, loaded.seat_config, channel, self._turn_limit, loaded.toolsets, episode.traces
        )
        agents = vf.Agents(loaded.env.config, lambda name, spec: seat)
        self._play = asyncio.create_task(_play(loaded.env, vf_task, agents, episode, channel))
        kind, payload = await channel.next_event()
        if kind == "turn":
            return payload
        self._done = True
        if payload is not None:
            raise payload
        raise RuntimeError("the verifiers environment ended the episode before the model's first turn")

    async def step(self, assistant_text: str) -> StepResult:
        """Answer the env's waiting model request with ``assistant_text``; the messages of its next request
        (tool results, its user turn), or, when its control flow ends, the scored outcome (done)."""
        if self._channel is None or self._done:
            raise EnvError("step() before reset() or after the episode ended")
        self._channel.reply(assistant_text)
        kind, payload = await self._channel.next_event()
        if kind == "turn":
            return StepResult(observation=payload)
        self._done = True
        if payload is not None:
            raise payload
        reward, info = episode_outcome(self._episode.traces[0])
        return StepResult(observation=[], reward=reward, done=True, info=info)

    async def close(self) -> None:
        """Cancel the env's control flow if the episode was cut short (it is then never scored)."""
        play = self._play
        if play is not None and not play.done():
            play.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await play

    async def score(self, task: Task, messages: list[Message]) -> float:
        """The reward the task's scoring gives the finished conversation ``messages`` (OpenAI chat
        messages, e.g. from the gateway). Raises `EnvError` for an env whose reward comes from its own
        control flow (its ``run``/``finalize``: only an episode it plays can be scored)."""
        from verifiers.v1.dialects import parse_message

        loaded = self._loaded
        if not loaded.scores_alone:
            kind = type(loaded.env).__name__
            raise EnvError(
                f"verifiers env {kind} rewards in its own run()/finalize(); it scores only episodes it plays"
            )
        vf_task = loaded.task(task)
        trace = new_trace(vf_task, loaded.seat_config)
        for i, message in enumerate(messages):
            try:
                parsed = parse_message(dict(message))
            except (KeyError, TypeError, ValueError) as err:
                raise EnvError(
                    f"message {i} is not an OpenAI chat message: {type(err).__name__}: {err}"
                ) from err
            commit(trace, parsed, sampled=parsed.role == "assistant")
        await finish_rollout(vf_task, trace)
        return episode_outcome(trace)[0]


def _task(loaded: LoadedEnv, vf_task: Any, cycle: int) -> Task:
    """A taskset row as a sao `Task` (see `VerifiersEnv.make_tasks`)."""
    row = vf_task.data
    # Top-level fields left at their defaults are dropped (nested ones stay: a message's role is one).
    defaults = {
        n
        for n, f in type(row).model_fields.items()
        if not f.is_required() and getattr(row, n) == f.get_default(call_default_factory=True)
    }
    data = row.model_dump(mode="json", exclude_none=True, exclude=defaults)
    idx = row.idx
    prompt = [chat_message(m) for m in prompt_messages(row)]
    if not prompt:
        raise EnvError(
            f"row {idx} of verifiers environment {loaded.env_id!r} has no prompt; the env opens it"
        )
    name = loaded.env_id.rsplit("/", 1)[-1].split("@", 1)[0]
    task_id = f"{name}-{idx}" + (f"-r{cycle}" if cycle else "")
    return Task(id=task_id, prompt=prompt, answer=data.get("answer"), metadata={"row": idx, "data": data})
