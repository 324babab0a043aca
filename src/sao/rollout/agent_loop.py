"""The agent loop: one episode of an `Env` played by an `InferenceEngine`, recorded token-in/token-out.

Owns: turns, limits (turns, token budget), the token bookkeeping (a `ChatSession` branch), error
handling, and building the `Trajectory`. Does not own: sampling prompts, in-flight bounds, queues (the
producer), rewards (the env), tokens of the env (it sees text only).

Token layout (invariant 1 of docs/concepts.md: the trainer never re-tokenizes; the recorded history is
never re-rendered, so any chat template works, including ones that rewrite earlier turns):

- The prompt is the chat-template rendering of ``env.reset(task)`` with the generation prompt.
- Each assistant turn is exactly the engine's tokens, ending with the end-of-turn token (``<|im_end|>``,
  passed as a stop token id and kept: it was generated). The env gets the text without it.
- The env's observation messages are appended as the template's rendering of those messages alone, as a
  suffix after the turn, with the next generation prompt (`sao.models.chat_delta.observation_delta`;
  when the turn was cut before its end-of-turn token, the suffix starts with it), tokenised on its own
  as observation tokens (action_mask 0).

Template variables (``enable_thinking``) are bound into the tokenizer's template (`sao.runtime.build`).

Finish reasons: ``stop`` (env done), ``max_turns``, ``length`` (token budget exhausted: a turn cut by the
budget gets no env step and reward 0, and a trailing observation past the budget is dropped). An episode
that cannot be played to one of those ends yields no trajectory: `run_episode` raises `EpisodeError` with a
drop reason (`sao.rollout.env_calls`): ``env_error`` (the env raised, or answered with something
malformed), ``env_timeout`` (an env call ran past ``env_timeout_s``), ``template_error`` (the chat
template raised on the env's messages, or rendered them unusably), ``engine_error`` (a generation failed),
``engine_crash`` (the engine died under it), ``prompt_too_long``. A half-played episode is never trained
on: its last reward is not an outcome. ``env.close()`` is awaited in every case, under the same timeout
(its own failure goes to ``metadata["close_error"]``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sao.engine.types import EngineCrashedError, Generation, InferenceEngine, SamplingParams
from sao.envs.base import Env, Message, Task
from sao.models.chat_delta import observation_delta, render
from sao.serve.sessions import ChatSession
from sao.types import Trajectory

from .env_calls import EpisodeError, close_env, reset_env, step_env

__all__ = ["AgentLoopConfig", "EpisodeError", "run_episode"]


@dataclass(frozen=True)
class AgentLoopConfig:
    """Limits and sampling of one episode.

    ``max_turns`` is capped by the env's own ``max_turns``; ``max_total_tokens`` bounds prompt + all turns;
    a turn generates at most ``min(max_tokens_per_turn, tokens left)``. ``end_of_turn``: the token that ends
    an assistant turn (default ``<|im_end|>`` if the tokenizer has it, else its eos token).
    ``env_timeout_s``: seconds each env call (reset, step, close) may take; None waits forever.
    """

    max_turns: int = 50
    max_total_tokens: int = 16384
    max_tokens_per_turn: int = 1024
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    end_of_turn: str | None = None
    env_timeout_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_total_tokens", "max_tokens_per_turn"):
            if getattr(self, name) < 1:
                raise ValueError(f"AgentLoopConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.env_timeout_s is not None and not self.env_timeout_s > 0:
            raise ValueError(f"AgentLoopConfig.env_timeout_s must be > 0 or None, got {self.env_timeout_s}")


class _Recorder:
    """The token bookkeeping of one episode: one `ChatSession` branch, extended by rendered prompt and
    observation suffixes (never a re-rendering) and the engine's turns."""

    def __init__(
        self, tokenizer: Any, session_id: str, tools: list[Any] | None, cfg: AgentLoopConfig
    ) -> None:
        self.tokenizer = tokenizer
        self.session = ChatSession(tokenizer, session_id, end_of_turn=cfg.end_of_turn)
        self.tools = tools
        self.eot_text, self.eot_id = self.session.end_of_turn, self.session.end_of_turn_id

    @property
    def num_tokens(self) -> int:
        return self.session.num_tokens

    def prompt(self, messages: list[Message]) -> list[int]:
        """Token ids of the first prompt (the rendering of ``messages`` with the generation prompt)."""
        text = render(
            self.tokenizer, messages, self.tools, add_generation_prompt=True,
        )  # fmt: skip
        if not isinstance(text, str) or not text:
            raise ValueError(f"the chat template rendered {text!r:.80}, not a prompt")
        return self.session.append_observation(text)

    def observe(self, new: list[Message], turn_ended: bool) -> list[int]:
        """Append the template's suffix for ``new`` after the last turn; returns the next prompt."""
        delta = observation_delta(self.tokenizer, new, self.tools, self.eot_text, turn_ended)
        return self.session.append_observation(delta)

    def record(self, gen: Generation) -> str:
        """Append the generated tokens as a turn; returns their text (end-of-turn token included)."""
        return self.session.record_generation(gen.token_ids, gen.logprobs, gen.versions, gen.finish_reason)


def _check_generation(gen: Generation) -> str | None:
    """Why ``gen`` cannot be recorded as a turn, or None."""
    if gen.finish_reason in ("error", "abort"):
        return f"engine finished with {gen.finish_reason!r}: {gen.error or 'no detail'}"
    if not gen.token_ids:
        return "engine returned no tokens"
    if not len(gen.token_ids) == len(gen.logprobs) == len(gen.versions):
        return (
            f"engine returned {len(gen.token_ids)} tokens, {len(gen.logprobs)} log-probs and "
            f"{len(gen.versions)} versions"
        )
    return None


async def run_episode(
    engine: InferenceEngine,
    tokenizer: Any,
    env: Env,
    task: Task,
    cfg: AgentLoopConfig,
    *,
    seed: int | None = None,
    group_id: str | None = None,
) -> Trajectory:
    """Play one episode of ``task`` in ``env`` with ``engine``; see the module docstring.

    Args:
        engine: any `InferenceEngine` (token ids in, token ids with log-probs and versions out).
        tokenizer: the policy's Hugging Face tokenizer, with the chat template the policy was trained on.
        env: a fresh environment; ``env.close()`` is awaited at the end, whatever happens.
        task: the problem; ``task.id`` becomes the trajectory's ``prompt_id``.
        cfg: limits and sampling.
        seed: turn i samples with seed ``seed + i`` (None: the engine's own seeding).
        group_id: copied to the trajectory (GRPO-style groups).

    Returns:
        The `Trajectory`: one reward per turn (the last is the outcome), ``finish_reason`` one of ``stop``,
        ``max_turns``, ``length``; ``metadata`` with ``env``, ``task_id``, ``turns``, ``timings`` (per
        turn ``generate_s``/``env_s``), ``infos`` (the env's per-turn ``info``), ``seed``, and
        ``sandbox_mode`` for envs that run model code (their ``sandbox_mode`` attribute).

    Raises:
        EpisodeError: the episode yields no trajectory; ``reason`` says why (see the module docstring).
    """
    try:
        episode = _Episode(engine, tokenizer, env, task, cfg, seed)
        await episode.play()
    finally:
        close_error = await close_env(env, cfg.env_timeout_s)
    metadata: dict[str, Any] = {
        "env": getattr(env, "name", None) or type(env).__name__,
        "task_id": task.id,
        "turns": len(episode.rewards),
        "timings": episode.timings,
        "infos": episode.infos,
        "seed": seed,
    }
    sandbox_mode = getattr(env, "sandbox_mode", None)
    if isinstance(sandbox_mode, str):
        metadata["sandbox_mode"] = sandbox_mode
    if close_error is not None:
        metadata["close_error"] = close_error
    return _trajectory(episode.rec.session, task.id, episode.rewards, episode.finish, metadata, group_id)


class _Episode:
    """One episode while it is played: the recorder, per-turn results, how it ended.

    A failure of the env, the chat template or the engine raises `EpisodeError` (with its drop reason);
    ``finish`` is how a fully played episode ended.
    """

    def __init__(
        self,
        engine: InferenceEngine,
        tokenizer: Any,
        env: Env,
        task: Task,
        cfg: AgentLoopConfig,
        seed: int | None,
    ) -> None:
        self.engine, self.env, self.task, self.cfg, self.seed = engine, env, task, cfg, seed
        self.max_turns = min(cfg.max_turns, int(getattr(env, "max_turns", cfg.max_turns)))
        tools = getattr(env, "tools", None)
        self.rec = _Recorder(tokenizer, task.id, list(tools) if tools else None, cfg)
        self.eot_text, self.eot_id = self.rec.eot_text, self.rec.eot_id
        self.rewards: list[float] = []
        self.timings: list[dict[str, float]] = []
        self.infos: list[dict[str, Any]] = []
        self.finish: str = "max_turns"

    def _fail(self, message: str, reason: str) -> EpisodeError:
        return EpisodeError(f"task {self.task.id!r}, turn {len(self.rewards)}: {message}", reason)

    async def play(self) -> None:
        """Reset the env, play turns until the episode ends."""
        try:
            messages = await reset_env(self.env, self.task, self.cfg.env_timeout_s)
        except EpisodeError as err:
            raise self._fail(str(err), err.reason) from err.__cause__
        try:
            prompt_ids = self.rec.prompt(messages)
        except Exception as err:  # the template cannot render the env's first messages
            why = f"rendering the prompt: {type(err).__name__}: {err}"
            raise self._fail(why, "template_error") from err
        for turn in range(self.max_turns):
            next_prompt = await self._turn(turn, prompt_ids)
            if next_prompt is None:
                break
            prompt_ids = next_prompt

    async def _generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        try:
            gen = await self.engine.generate(prompt_ids, params)
        except EngineCrashedError as err:
            raise self._fail(f"engine crashed: {err}", "engine_crash") from err
        except Exception as err:
            raise self._fail(f"engine: {type(err).__name__}: {err}", "engine_error") from err
        problem = _check_generation(gen)
        if problem is not None:
            raise self._fail(f"engine: {problem}", "engine_error")
        return gen

    async def _turn(self, turn: int, prompt_ids: list[int]) -> list[int] | None:
        """Play turn ``turn`` from ``prompt_ids``; returns the next prompt, or None when the episode ends."""
        cfg, rec = self.cfg, self.rec
        left = cfg.max_total_tokens - len(prompt_ids)
        if left <= 0:
            if not self.rewards:
                why = f"the prompt has {len(prompt_ids)} tokens > max_total_tokens ({cfg.max_total_tokens})"
                raise self._fail(why, "prompt_too_long")
            self.finish = "length"
            return None
        params = SamplingParams(
            max_new_tokens=min(cfg.max_tokens_per_turn, left),
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            stop_token_ids=(self.eot_id,),
            seed=None if self.seed is None else self.seed + turn,
        )
        t0 = time.perf_counter()
        gen = await self._generate(prompt_ids, params)
        text = rec.record(gen)
        timing = {"generate_s": time.perf_counter() - t0, "env_s": 0.0}
        self.timings.append(timing)
        ended = gen.token_ids[-1] == self.eot_id and text.endswith(self.eot_text)
        content = text[: -len(self.eot_text)] if ended else text
        # Cut by the token budget or the engine's context: no next turn, so no env step and no outcome.
        if gen.finish_reason == "length" and (
            rec.num_tokens >= cfg.max_total_tokens or len(gen.token_ids) < params.max_new_tokens
        ):
            self.rewards.append(0.0)
            self.finish = "length"
            return None
        t1 = time.perf_counter()
        try:
            result = await step_env(self.env, content, cfg.env_timeout_s)
        except EpisodeError as err:
            raise self._fail(str(err), err.reason) from err.__cause__
        finally:
            timing["env_s"] = time.perf_counter() - t1
        self.rewards.append(result.reward)
        self.infos.append(result.info)
        if result.done:
            self.finish = "stop"
            return None
        if turn + 1 == self.max_turns:
            return None  # finish stays "max_turns"; the last observation is not needed
        try:
            return rec.observe(result.observation, ended)
        except Exception as err:  # the template raised on the env's messages, or rendered them unusably
            why = f"rendering the observation: {type(err).__name__}: {err}"
            raise self._fail(why, "template_error") from err


def _trajectory(
    session: ChatSession,
    prompt_id: str,
    rewards: list[float],
    finish: str,
    metadata: dict[str, Any],
    group_id: str | None,
) -> Trajectory:
    """The session's one branch as a `Trajectory`, cut after its last action token (a trailing
    observation has nothing after it to train)."""
    branch = session.branches[-1]
    end = max(i for i, m in enumerate(branch.action_mask) if m) + 1
    return Trajectory(
        prompt_id=prompt_id,
        token_ids=branch.token_ids[:end],
        action_mask=branch.action_mask[:end],
        rollout_logprobs=branch.logprobs[:end],
        versions=branch.versions[:end],
        turn_ids=branch.turn_ids[:end],
        rewards=rewards,
        finish_reason=finish,
        metadata=metadata,
        group_id=group_id,
    )
