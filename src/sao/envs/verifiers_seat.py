"""The seat sao's policy plays in a `verifiers` environment (``verifiers.v1``, the library's 0.4 API): a
stand-in for the library's ``vf.Agent`` that hands each model request to sao's agent loop instead of
launching a harness program against an OpenAI endpoint (`sao.envs.verifiers_env` drives it).

`PolicySeat` is the one agent the env's control flow (``Env.run``) gets: ``run(task)`` plays a whole
rollout; ``interaction(task)`` holds it open turn by turn, the env being the user (a game engine
answering each move, a scripted user). Each model request crosses a `PolicyChannel`: the env side awaits
``generate(new_messages)``; sao's ``step`` answers with the policy's text.

A rollout is played as the library's tool-less ``null`` harness plays it (its bundled chat loop), with
the task's toolsets served in-process (`sao.envs.verifiers_tools`): the system prompt as its own
message, then the prompt; a reply with tool calls gets the tools' results and another model call; a
reply without ends the segment. Before each model call the rollout is refused (stopped) by the turn
limit or by the task's ``@vf.stop`` hooks on the trace or the request; after it, by those on the
response. At its end the task's ``finalize`` and ``score`` (``@vf.reward``, ``@vf.metric``, judges) run
on the trace, as the library's rollout does (`sao.envs.verifiers_trace`).

Departures from the library: tool calls are read from the reply text (Hermes/Qwen ``<tool_call>``
blocks, `sao.envs.tools.parse_tool_calls`), and a malformed one is answered with an error tool message
(the model gets another call) instead of ending the segment; ``<think>...</think>`` is split off into
the reply's ``reasoning_content``; the seat's token caps and stage timeouts are not applied (sao's agent
loop has its own token budget and env timeout); request ``@vf.stop`` hooks see each request, not each
proposed tool call.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import time
import typing
from collections.abc import AsyncIterator, Callable
from typing import Any

from sao.envs.base import EnvError, Message
from sao.envs.tools import parse_tool_calls
from sao.envs.verifiers_tools import ToolBox
from sao.envs.verifiers_trace import (
    NO_RUNTIME,
    call_hook,
    chat_message,
    commit,
    finish_rollout,
    new_trace,
    prompt_messages,
)

__all__ = ["PolicyChannel", "PolicySeat", "SeatInteraction"]


class PolicyChannel:
    """Where the env's control flow (a background task) and sao's ``step`` meet: one model request at a
    time. Events for sao: ``("turn", messages)`` (the messages new to the model; it must reply) and
    ``("end", error_or_None)`` (the env's control flow finished, or raised)."""

    def __init__(self) -> None:
        self._events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._reply: asyncio.Future[str] | None = None

    async def generate(self, messages: list[Message]) -> str:
        """(env side) Show the policy ``messages`` and wait for its reply text."""
        if self._reply is not None and not self._reply.done():
            raise EnvError("two model requests at once; sao plays one conversation per episode")
        self._reply = asyncio.get_running_loop().create_future()
        self._events.put_nowait(("turn", messages))
        return await self._reply

    def reply(self, text: str) -> None:
        """(sao side) The policy's answer to the waiting request."""
        if self._reply is None or self._reply.done():
            raise EnvError("no model request is waiting for a reply")
        self._reply.set_result(text)

    def end(self, error: BaseException | None) -> None:
        """(env side) The env's control flow is over; ``error`` is what it raised, if anything."""
        self._events.put_nowait(("end", error))

    async def next_event(self) -> tuple[str, Any]:
        return await self._events.get()


def _hook_types(fn: Callable[..., Any]) -> dict[str, type]:
    hints = typing.get_type_hints(fn)
    return {
        name: typing.get_origin(hints[name]) or hints[name]
        for name in inspect.signature(fn).parameters
        if name in hints
    }


def _stop_kind(fn: Callable[..., Any]) -> type:
    """Which boundary a ``@vf.stop`` hook watches: the Request, Response or Trace it is annotated with."""
    import verifiers.v1 as vf

    kinds = set(_hook_types(fn).values())
    for kind in (vf.Request, vf.Response, vf.Trace):
        if kind in kinds:
            return kind
    raise EnvError(f"@vf.stop {fn.__name__} must take a vf.Request, vf.Response or vf.Trace parameter")


async def _fires(fn: Callable[..., Any], values: dict[type, Any]) -> bool:
    """Whether the stop hook ``fn`` fires, given the values it takes by annotation."""
    kwargs = {name: values[kind] for name, kind in _hook_types(fn).items() if kind in values}
    result = fn(**kwargs)
    result = await result if inspect.isawaitable(result) else result
    if not isinstance(result, bool):
        raise EnvError(f"@vf.stop {fn.__name__} returned {type(result).__name__}, not bool")
    return result


def _reply_message(text: str, with_tools: bool, turn: int) -> tuple[Any, list[str]]:
    """The policy's reply ``text`` as a ``vf.AssistantMessage`` (reasoning split off, tool calls read from
    ``<tool_call>`` blocks when the episode has tools), and the problems of its malformed tool calls."""
    import verifiers.v1 as vf

    reasoning, body = None, text
    if "</think>" in text:
        head, _, body = text.partition("</think>")
        reasoning = head.replace("<think>", "", 1).strip() or None
    calls: list[Any] = []
    problems: list[str] = []
    if with_tools:
        parsed = parse_tool_calls(body)
        for start, end in reversed(parsed.spans):
            body = body[:start] + body[end:]
        calls = [
            vf.ToolCall(id=f"call_{turn}_{k}", name=call.name, arguments=json.dumps(call.arguments))
            for k, call in enumerate(parsed.calls)
        ]
        problems = parsed.errors
    message = vf.AssistantMessage(
        content=body.strip() or None, reasoning_content=reasoning, tool_calls=calls or None
    )
    return message, problems


class _Rollout:
    """One rollout of the seat: its trace, tools and stop hooks, played segment by segment."""

    def __init__(self, seat: PolicySeat, task: Any, tools: ToolBox) -> None:
        import verifiers.v1 as vf

        self.seat, self.task, self.tools = seat, task, tools
        self.trace = new_trace(task, seat.config)
        self.trace.agent.name, self.trace.agent.trainable = seat.name, seat.trainable
        self.trace.tools = [vf.Tool(**schema["function"]) for schema in tools.schemas]
        self.started = self.over = False
        self.stops: dict[type, list[Callable[..., Any]]] = {vf.Request: [], vf.Response: [], vf.Trace: []}
        for fn in task.hooks("stop"):
            self.stops[_stop_kind(fn)].append(fn)

    async def _refused(self, request: Any) -> bool:
        """Check the turn limit and the trace and request ``@vf.stop`` hooks before a model call; a refusal
        stops the trace (a request stop records the request's new messages, as the library does)."""
        import verifiers.v1 as vf

        trace, limit = self.trace, self.seat.max_turns
        if trace.stop_condition is not None:
            return True
        if limit is not None and trace.num_turns >= limit:
            trace.stop("max_turns")
            return True
        for fn in self.stops[vf.Trace]:
            if await _fires(fn, {vf.Trace: trace}):
                trace.stop(fn.__name__)
                return True
        for fn in self.stops[vf.Request]:
            if await _fires(fn, {vf.Request: request.model_copy(deep=True), vf.Trace: trace}):
                for message in request.messages[len(trace.messages) :]:
                    commit(trace, message)
                trace.stop(fn.__name__)
                return True
        return False

    async def segment(self, incoming: list[Any]) -> list[Any]:
        """Play one segment on the ``incoming`` messages (the opening prompt, or the env's user turn):
        model calls, with the tools' answers between them, until a reply without tool calls or a
        refusal. Returns the segment's replies and tool results (empty: refused at once)."""
        import verifiers.v1 as vf

        pending, produced = list(incoming), []
        while True:
            request = vf.Request(messages=[*self.trace.messages, *pending], tools=self.trace.tools or None)
            if await self._refused(request):
                return produced
            text = await self.seat.channel.generate([chat_message(m) for m in pending])
            for message in pending:
                commit(self.trace, message)
            if produced:  # the tool results this segment's last reply asked for (now on the trace)
                produced.extend(pending)
            reply, problems = _reply_message(text, bool(self.tools.schemas), self.trace.num_turns)
            node = commit(self.trace, reply, sampled=True)
            finish = "tool_calls" if reply.tool_calls else "stop"
            self.trace.calls.append(
                vf.ModelCall(node=node, model=self.seat.config.model, finish_reason=finish)
            )
            produced.append(reply)
            response = vf.Response(
                id=f"sao-{node}", created=int(time.time()), model="sao", message=reply, finish_reason=finish
            )
            for fn in self.stops[vf.Response]:
                if await _fires(fn, {vf.Response: response.model_copy(deep=True), vf.Trace: self.trace}):
                    self.trace.stop(fn.__name__)
                    return produced
            if not reply.tool_calls and not problems:
                return produced
            pending = await self._tool_results(reply, problems)

    async def _tool_results(self, reply: Any, problems: list[str]) -> list[Any]:
        import verifiers.v1 as vf

        results = []
        for call in reply.tool_calls or []:
            content = await self.tools.call(call.name, json.loads(call.arguments))
            results.append(vf.ToolMessage(tool_call_id=call.id, content=content, name=call.name))
        for k, problem in enumerate(problems):
            results.append(
                vf.ToolMessage(
                    tool_call_id=f"invalid_{self.trace.num_turns}_{k}", content=f"error: {problem}"
                )
            )
        return results


class SeatInteraction:
    """``vf.Interaction`` for sao's seat: the env is the rollout's user; each ``turn`` runs one segment."""

    def __init__(self, rollout: _Rollout) -> None:
        self._rollout = rollout

    @property
    def trace(self) -> Any:
        return self._rollout.trace

    async def turn(self, message: Any = None) -> Any:
        """Send one user turn (a string, or messages; none for a prompted task's opening reply), run one
        segment, return its ``vf.Segment`` (``terminated`` when the rollout ended instead)."""
        import verifiers.v1 as vf
        from verifiers.v1.dialects import parse_message

        rollout = self._rollout
        if rollout.over:
            raise RuntimeError("the exchange is over (the run ended); read interaction.trace")
        prompted = not rollout.started and rollout.task.data.prompt is not None
        if (message is None) != prompted:
            raise ValueError("a prompted task's first turn() takes no message; every other turn takes one")
        if message is None:
            incoming: list[Any] = []
        elif isinstance(message, str):
            incoming = [vf.UserMessage(content=message)]
        else:
            incoming = [parse_message(m) if isinstance(m, dict) else m for m in message]
        if not rollout.started:
            incoming = [*prompt_messages(rollout.task.data), *incoming]
        rollout.started = True
        produced = await rollout.segment(incoming)
        if produced:
            return vf.Segment(messages=produced)
        rollout.over = True
        return vf.Segment(messages=[], terminated=True)

    async def send(self, *args: Any, **kwargs: Any) -> dict:
        raise EnvError("sending (steering) messages into a running turn is not supported by sao")

    steer = send


class PolicySeat:
    """The env's one agent, played by sao's policy (what the env's ``run`` uses of ``vf.Agent``: ``run``,
    ``interaction``, ``trainable``, ``config``). One rollout per episode; its finished trace joins
    ``completed`` (the episode's traces). ``toolsets(task)``: fresh ``vf.Toolset`` instances for a rollout,
    the task's own and the taskset's shared ones."""

    def __init__(
        self,
        name: str,
        config: Any,
        channel: PolicyChannel,
        max_turns: int | None,
        toolsets: Callable[[Any], tuple[list[Any], list[Any]]],
        completed: list[Any],
    ) -> None:
        self.name, self.config, self.channel, self.max_turns = name, config, channel, max_turns
        self._toolsets, self._completed = toolsets, completed
        self.trainable = True
        self._rollout: _Rollout | None = None

    async def _open(self, task: Any, on_trace: Callable[[Any], None] | None, **resources: Any) -> _Rollout:
        if any(resources.values()):
            raise EnvError("borrowed runtimes, tool servers and artifact collection are not supported by sao")
        if self._rollout is not None:
            raise EnvError(f"the env started a second rollout of {self.name!r}; sao plays one per episode")
        own, shared = self._toolsets(task)
        tools = await ToolBox.open(own, shared, task.data)
        rollout = self._rollout = _Rollout(self, task, tools)
        if on_trace is not None:
            on_trace(rollout.trace)
        await call_hook(task.setup, trace=rollout.trace, runtime=NO_RUNTIME)
        return rollout

    async def _close(self, rollout: _Rollout) -> Any:
        await finish_rollout(rollout.task, rollout.trace)
        self._completed.append(rollout.trace)
        return rollout.trace

    async def run(
        self,
        task: Any,
        *,
        runtime: Any = None,
        tools: Any = None,
        on_trace: Any = None,
        collect_artifacts: bool = False,
    ) -> Any:
        """One whole rollout of ``task``: one segment on its prompt; returns the finished, scored trace."""
        if task.data.prompt is None:
            raise EnvError("the task has no prompt and no user to open the conversation")
        rollout = await self._open(task, on_trace, runtime=runtime, tools=tools, artifacts=collect_artifacts)
        rollout.started = True
        await rollout.segment(prompt_messages(task.data))
        rollout.trace.stop("agent_completed")  # the first stop condition wins
        return await self._close(rollout)

    @contextlib.asynccontextmanager
    async def interaction(
        self, task: Any, *, runtime: Any = None, tools: Any = None, on_trace: Any = None
    ) -> AsyncIterator[SeatInteraction]:
        """A rollout of ``task`` held open turn by turn; leaving the context finishes and scores it (an
        exception inside leaves it unscored and propagates: the episode is dropped)."""
        rollout = await self._open(task, on_trace, runtime=runtime, tools=tools)
        yield SeatInteraction(rollout)
        rollout.trace.stop("user_closed")
        await self._close(rollout)
