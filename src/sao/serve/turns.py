"""One recorded request of a session, and closing sessions: the gateway's logic without HTTP.

`SessionTurns.chat` serves one chat request of a named session: admission (`SessionHooks.admit`, first
request only), the in-flight gate, the session's lock (its requests run one at a time, in arrival order),
the rules of `SessionRules` (turn limit, token budget, fixed sampling), the prompt plan, generation, and
recording only once generation succeeded. `SessionTurns.reward` closes a session with a reward — given, or
computed by the run's verifier — and emits its trajectories. Sessions the rules close (the token budget)
are emitted as truncated, with reward 0.

Every refusal is an `HTTPException` or `LimitExceededError` with a reason, and leaves every other session
untouched. Owns: that logic. Does not own: HTTP parsing and responses (`sao.serve.gateway`), recording
(`sao.serve.sessions`), admission policy (the hooks).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException

from sao.engine.types import Generation, SamplingParams
from sao.types import Trajectory

from .hooks import SessionHooks, SessionRules, Verifier, VerifierError
from .limits import LimitExceededError, PendingGate
from .registry import SessionEntry, SessionRegistry
from .sessions import ChatSession

__all__ = ["SessionTurns", "TurnResult"]


@dataclass
class TurnResult:
    """A served request: the prompt it generated from, the generation, the assistant message the client
    gets, and ``closed`` (why the gateway closed the session after it, e.g. ``"truncated"``; None: open)."""

    prompt_ids: Sequence[int]  # the plan's tuple, not copied again (it may be long)
    gen: Generation
    message: dict[str, Any]
    closed: str | None = None


class SessionTurns:
    """The session logic of one gateway (see the module docstring).

    Args:
        registry: the open sessions.
        gate: the in-flight request bound.
        generate: ``generate(prompt_ids, params)``, the engine call with the context cap applied.
        hooks: admission and where closed sessions go.
        rules: what recorded sessions must respect.
        verifier: scores a conversation when a reward request gives no reward (None: rewards must be given).
        emit: called with every closed session's trajectories (after the hooks).
        model_name: copied into the trajectories' metadata.
    """

    def __init__(
        self,
        registry: SessionRegistry,
        gate: PendingGate,
        generate: Callable[[Sequence[int], SamplingParams], Awaitable[Generation]],
        hooks: SessionHooks,
        rules: SessionRules,
        verifier: Verifier | None,
        emit: Callable[[list[Trajectory]], None],
        model_name: str,
    ) -> None:
        self.registry, self.gate, self.generate, self.hooks = registry, gate, generate, hooks
        self.rules, self.verifier, self.emit, self.model_name = rules, verifier, emit, model_name

    # ---- a request -----------------------------------------------------------------------------------

    async def chat(
        self,
        named: str,
        messages: list[dict[str, Any]],
        tools: list[Any] | None,
        params: SamplingParams,
        *,
        group_id: str | None,
        task_id: str | None,
        reply: Callable[[str], dict[str, Any]],
    ) -> TurnResult:
        """Serve one request of session ``named``; ``reply(text)`` builds the assistant message the client
        gets from the generated text (remembered so an echo of it renders as generated)."""
        self.registry.sweep()
        entry = self.registry.open(named)
        try:
            session = entry.session
            if not session.branches and session.group_id is None:
                session.group_id = group_id
            if session.task_id is None:
                session.task_id = task_id
            await self._admit(entry)
            with self.gate.slot():
                result, closed, refusal = await self._turn(entry, named, messages, tools, params, reply)
        finally:
            self.registry.release(entry)
        if closed:
            await self._closed(entry.session, closed)
        if refusal is not None:
            raise refusal
        assert result is not None
        return result

    async def _admit(self, entry: SessionEntry) -> None:
        """The session's admission, started by its first request and shared by concurrent ones."""
        if entry.admission is None:
            session = entry.session
            entry.admission = asyncio.ensure_future(self.hooks.admit(session.session_id, session.group_id))
        await asyncio.shield(entry.admission)

    def discard(self, entry: SessionEntry) -> None:
        """The registry dropped a session that recorded nothing: give its admission back."""
        adm = entry.admission
        if adm is None:
            return
        if not adm.done():
            adm.cancel()  # still waiting: the hooks' admit sees the cancellation and gives back what it got
            return
        if not adm.cancelled() and adm.exception() is None:
            self.hooks.discarded(entry.session.session_id, entry.session.group_id)

    def abandoned(self, entry: SessionEntry) -> None:
        """The registry closed an idle session without a reward: tell the hooks (if it was admitted)."""
        adm = entry.admission
        if adm is not None and adm.done() and not adm.cancelled() and adm.exception() is None:
            self.hooks.abandoned(entry.session.session_id, entry.session.group_id)

    async def _turn(
        self,
        entry: SessionEntry,
        named: str,
        messages: list[dict[str, Any]],
        tools: list[Any] | None,
        params: SamplingParams,
        reply: Callable[[str], dict[str, Any]],
    ) -> tuple[TurnResult | None, list[Trajectory], LimitExceededError | None]:
        """The request under the session's lock: (its result, the trajectories of a session it closed, a
        refusal to raise once those are emitted)."""
        rules = self.rules
        async with entry.lock:
            if self.registry.get(named) is not entry:
                raise HTTPException(409, f"session {named!r} was closed while this request waited")
            session = entry.session
            if rules.max_turns is not None and session.num_turns >= rules.max_turns:
                raise LimitExceededError(
                    409,
                    f"session {named!r} has {session.num_turns} turns, the limit (data.max_turns); post its "
                    "reward to close it",
                    "turn_limit",
                )
            try:
                plan = session.plan(messages, tools)
            except Exception as err:  # the template rejected the conversation: the client's input
                raise HTTPException(400, f"cannot render messages with the chat template: {err}") from None
            prompt_ids = plan.prompt_ids
            budget = rules.max_session_tokens
            if budget is not None:
                left = budget - len(prompt_ids)
                if left < 1:
                    return self._over_budget(entry, named, len(prompt_ids), budget)
                params = dataclasses.replace(params, max_new_tokens=min(params.max_new_tokens, left))
            gen = await self.generate(prompt_ids, params)
            session.commit(plan)
            text = session.record_generation(gen.token_ids, gen.logprobs, gen.versions, gen.finish_reason)
            message = reply(text)
            session.note_reply(message)
            session.messages = [*messages, message]
            closed: list[Trajectory] = []
            result = TurnResult(prompt_ids, gen, message)
            if budget is not None and gen.finish_reason == "length" and session.num_tokens >= budget:
                closed = self._truncate(entry, budget)
                result.closed = "truncated"
        return result, closed, None

    def _over_budget(
        self, entry: SessionEntry, named: str, prompt_tokens: int, budget: int
    ) -> tuple[None, list[Trajectory], LimitExceededError]:
        """A prompt that leaves no room in the budget gets 400; a session with recorded turns is closed
        first (as truncated: what it recorded is trained); a first request records nothing."""
        why = (
            f"the prompt has {prompt_tokens} tokens and leaves no room in the session's token budget of "
            f"{budget} (data.max_total_tokens)"
        )
        if not entry.session.branches:
            raise LimitExceededError(400, why, "context_length_exceeded")
        trajs = self._truncate(entry, budget)
        refusal = LimitExceededError(
            400, f"{why}: session {named!r} was closed as truncated (reward 0)", "context_length_exceeded"
        )
        return None, trajs, refusal

    def _truncate(self, entry: SessionEntry, budget: int) -> list[Trajectory]:
        session = entry.session
        why = f"truncated by the token budget of {budget} tokens (data.max_total_tokens)"
        self.registry.close(entry, why)
        meta = {"model": self.model_name, "truncated": True}
        trajs = session.trajectories([0.0], meta, finish_reason="length")
        for traj in trajs:
            traj.validate()
        return trajs

    async def _closed(self, session: ChatSession, trajs: list[Trajectory]) -> None:
        await self.hooks.closed(session.session_id, session.group_id, trajs)
        self.emit(trajs)

    # ---- closing with a reward -----------------------------------------------------------------------

    async def reward(
        self,
        session_id: str,
        rewards: list[float] | None,
        task_id: str | None,
        metadata: dict[str, Any],
    ) -> list[Trajectory]:
        """Close ``session_id`` with ``rewards`` (None: the verifier scores it) and emit its trajectories.
        A reward that cannot be applied (invalid, the verifier failed) leaves the session open."""
        registry = self.registry
        registry.sweep()
        entry = registry.get(session_id)
        if entry is None:
            raise self._not_open(session_id)
        registry.hold(entry)
        try:
            async with entry.lock:
                if registry.get(session_id) is not entry:
                    raise HTTPException(404, f"session {session_id!r} was closed while this reward waited")
                session = entry.session
                if rewards is None:
                    rewards = [await self._verify(session, task_id)]
                if not registry.pop(entry):
                    raise HTTPException(404, f"session {session_id!r} was closed while this reward waited")
                named_task = session.task_id
                session.task_id = session.task_id or task_id  # the trajectories' prompt id and task_id
                try:
                    trajs = session.trajectories(rewards, {"model": self.model_name, **metadata})
                    for traj in trajs:
                        traj.validate()
                except ValueError as err:
                    session.task_id = named_task
                    registry.restore(entry)  # keep it: the client can retry with a valid reward
                    raise HTTPException(400, f"cannot close session {session_id!r}: {err}") from None
        finally:
            registry.release(entry)
        await self._closed(entry.session, trajs)
        return trajs

    async def _verify(self, session: ChatSession, task_id: str | None) -> float:
        sid = session.session_id
        task = session.task_id or task_id
        if self.verifier is None:
            raise HTTPException(
                400, f"session {sid!r}: give 'reward' or 'rewards' (this gateway has no verifier)"
            )
        if task is None:
            raise HTTPException(
                400, f"session {sid!r}: give 'reward', 'rewards', or the 'task_id' the run's verifier scores"
            )
        if session.task_id is not None and task_id is not None and task_id != session.task_id:
            raise HTTPException(400, f"session {sid!r} plays task {session.task_id!r}, not {task_id!r}")
        try:
            return float(await self.verifier(task, session.messages))
        except VerifierError as err:
            raise HTTPException(400, f"session {sid!r}: cannot verify: {err}") from None

    def _not_open(self, session_id: str) -> HTTPException:
        registry = self.registry
        if registry.was_abandoned(session_id):
            return HTTPException(
                404,
                f"session {session_id!r} was closed as abandoned after {registry.idle_timeout_s:g} s idle; "
                "its turns were dropped, not emitted",
            )
        why = registry.closed_why(session_id)
        if why is not None:
            return HTTPException(409, f"session {session_id!r} was already closed: {why}")
        return HTTPException(404, f"unknown or already closed session {session_id!r}")
