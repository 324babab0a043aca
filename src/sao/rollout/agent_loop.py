"""The agent loop: one episode of an `Env` played by an `InferenceEngine`, recorded token-in/token-out.

Owns: turns, limits (turns, token budget), the token bookkeeping (through a strict `ChatSession`), the
prefix-invariant check, error handling, and building the `Trajectory`. Does not own: sampling prompts,
in-flight bounds, queues (the producer), rewards (the env), tokens of the env (it sees text only).

Token layout (invariant 1 of docs/training.md: the trainer never re-tokenizes):

- The prompt is the chat-template rendering of ``env.reset(task)`` with the generation prompt.
- Each assistant turn is exactly the engine's tokens, ending with the end-of-turn token (``<|im_end|>``,
  passed as a stop token id and kept: it was generated). The env gets the text without it.
- The env's observation messages are appended as the *chat-template delta*: the conversation (assistant
  turns as generated) plus the new messages is rendered with the generation prompt, and the text past the
  recorded text is tokenised as observation tokens (action_mask 0).
- The delta is only defined if the rendering starts with the recorded text (the *prefix invariant*).
  With ``check_prefix`` (the default) it is checked every turn, and at the end on the full rendering; a
  template that rewrites earlier text (e.g. Qwen3's, which drops the ``<think>`` part of earlier turns)
  raises `PrefixInvariantError`. With ``check_prefix=False`` a rewrite is tolerated where the new
  messages still have a well-defined delta (the rendering *with* them extends the rendering *without*
  them); the recorded history then keeps the turns as generated and ``metadata["prefix_mismatch_turns"]``
  lists where the template would have rendered it differently.

Finish reasons: ``stop`` (env done), ``max_turns``, ``length`` (token budget exhausted: a turn cut by the
budget gets no env step and reward 0, and a trailing observation past the budget is dropped). An episode
that cannot be played to one of those ends yields no trajectory: `run_episode` raises `EpisodeError` with a
drop reason (`sao.rollout.env_calls`): ``env_error`` (the env raised, or answered with something malformed,
or the chat template cannot render its messages), ``env_timeout`` (an env call ran past
``env_timeout_s``), ``engine_error`` (a generation failed), ``engine_crash`` (the engine died under it),
``prompt_too_long``. A half-played episode is never trained on: its last reward is not an outcome.
``env.close()`` is awaited in every case, under the same timeout (its own failure goes to
``metadata["close_error"]``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sao.engine.types import EngineCrashedError, Generation, InferenceEngine, SamplingParams
from sao.envs.base import Env, Message, Task
from sao.serve.sessions import ChatSession, PrefixMismatchError
from sao.types import Trajectory

from .env_calls import EpisodeError, close_env, reset_env, step_env

__all__ = ["AgentLoopConfig", "EpisodeError", "PrefixInvariantError", "run_episode"]

DEFAULT_END_OF_TURN = "<|im_end|>"


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
    check_prefix: bool = True
    end_of_turn: str | None = None
    env_timeout_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_total_tokens", "max_tokens_per_turn"):
            if getattr(self, name) < 1:
                raise ValueError(f"AgentLoopConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.env_timeout_s is not None and not self.env_timeout_s > 0:
            raise ValueError(f"AgentLoopConfig.env_timeout_s must be > 0 or None, got {self.env_timeout_s}")


class PrefixInvariantError(ValueError):
    """The chat template rewrites earlier text of the conversation (a configuration error).

    ``turn``: the turn whose prompt was being built (``num_turns`` at the final check); ``where``: the
    recorded part that is rewritten (``"prompt"``, ``"turn i"``, ``"observation after turn i"``);
    ``offset``: the first differing character of the recorded text.
    """

    def __init__(self, turn: int, where: str, mismatch: PrefixMismatchError) -> None:
        super().__init__(
            f"turn {turn}: the chat template rewrites earlier text ({where}): {mismatch}. Token-in/token-out "
            "needs a prefix-stable template (one that renders earlier turns exactly as generated)"
        )
        self.turn = turn
        self.where = where
        self.offset = mismatch.offset


class _Recorder:
    """The strict `ChatSession` of one episode plus where each recorded part starts in its text."""

    def __init__(self, tokenizer: Any, session_id: str, tools: list[Any] | None, end_of_turn: str) -> None:
        self.session = ChatSession(tokenizer, session_id, strict=True)
        self.tools = tools
        self.end_of_turn = end_of_turn
        self.parts: list[tuple[int, str]] = []  # (first character, name of the part)
        self.mismatch_turns: list[int] = []

    @property
    def num_tokens(self) -> int:
        return self.session.num_tokens

    def _where(self, offset: int) -> str:
        return next((name for start, name in reversed(self.parts) if start <= offset), "prompt")

    def _fail(self, turn: int, err: PrefixMismatchError) -> PrefixInvariantError:
        return PrefixInvariantError(turn, self._where(err.offset), err)

    def prompt(self, messages: list[Message]) -> list[int]:
        """Token ids of the first prompt (the rendering of ``messages`` with the generation prompt)."""
        self.parts.append((0, "prompt"))
        return self.session.prompt_for(messages, self.tools)

    def observe(self, turn: int, history: list[Message], new: list[Message], check: bool) -> list[int]:
        """Append the template delta of ``new`` after ``history`` (which ends with the assistant turn)."""
        start = len(self.session.text)
        try:
            ids = self.session.prompt_for(history + new, self.tools)
        except PrefixMismatchError as err:
            if check:
                raise self._fail(turn, err) from err
            ids = self.session.append_observation(self._delta_of_new(turn, history, err))
            self.mismatch_turns.append(turn)
        self.parts.append((start, f"observation after turn {turn - 1}"))
        return ids

    def _delta_of_new(self, turn: int, history: list[Message], err: PrefixMismatchError) -> str:
        """The text the template adds for the new messages, found without the recorded text: the rendering
        with them must extend the rendering without them up to the last turn's end-of-turn token (kept in
        the delta when the turn was cut before it)."""
        without = self.session.render(history, self.tools, add_generation_prompt=False)
        end = without.rfind(self.end_of_turn)
        if end >= 0 and self.session.text.endswith(self.end_of_turn):
            end += len(self.end_of_turn)
        if end < 0 or not err.rendered.startswith(without[:end]):
            raise self._fail(turn, err) from err
        return err.rendered[end:]

    def record(self, turn: int, gen: Generation) -> str:
        """Append the generated tokens as turn ``turn``; returns their text (end-of-turn token included)."""
        self.parts.append((len(self.session.text), f"turn {turn}"))
        return self.session.record_generation(gen.token_ids, gen.logprobs, gen.versions, gen.finish_reason)

    def check_final(self, turn: int, history: list[Message]) -> None:
        """The full rendering of the conversation (no generation prompt) must start with the recorded text.

        Only needed when ``history`` ends with an assistant turn: otherwise `observe` checked it already."""
        if history[-1].get("role") != "assistant":
            return
        rendered = self.session.render(history, self.tools, add_generation_prompt=False)
        try:
            self.session.check_extends(rendered)
        except PrefixMismatchError as err:
            raise self._fail(turn, err) from err


def _end_of_turn_id(tokenizer: Any, end_of_turn: str | None) -> tuple[str, int]:
    candidates = [end_of_turn] if end_of_turn else [DEFAULT_END_OF_TURN, tokenizer.eos_token]
    for text in candidates:
        # A direct lookup, not `text in get_vocab()`: that builds a dict of the whole vocabulary (~20 ms
        # for a 150k-token tokenizer) and this runs once per episode.
        token_id = tokenizer.convert_tokens_to_ids(text) if text else None
        if isinstance(token_id, int) and tokenizer.convert_ids_to_tokens(token_id) == text:
            return text, token_id
    raise ValueError(f"the tokenizer has no end-of-turn token (tried {candidates})")


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
        PrefixInvariantError: the chat template rewrites earlier text (``cfg.check_prefix``).
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
    if episode.rec.mismatch_turns:
        metadata["prefix_mismatch_turns"] = episode.rec.mismatch_turns
    return _trajectory(episode.rec.session, task.id, episode.rewards, episode.finish, metadata, group_id)


class _Episode:
    """One episode while it is played: the recorder, the conversation, per-turn results, how it ended.

    A failure of the env or the engine raises `EpisodeError` (with its drop reason), as does
    `PrefixInvariantError`; ``finish`` is how a fully played episode ended.
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
        self.eot_text, self.eot_id = _end_of_turn_id(tokenizer, cfg.end_of_turn)
        self.max_turns = min(cfg.max_turns, int(getattr(env, "max_turns", cfg.max_turns)))
        tools = getattr(env, "tools", None)
        self.rec = _Recorder(tokenizer, task.id, list(tools) if tools else None, self.eot_text)
        self.history: list[Message] = []
        self.rewards: list[float] = []
        self.timings: list[dict[str, float]] = []
        self.infos: list[dict[str, Any]] = []
        self.finish: str = "max_turns"

    def _fail(self, message: str, reason: str) -> EpisodeError:
        return EpisodeError(f"task {self.task.id!r}, turn {len(self.rewards)}: {message}", reason)

    async def play(self) -> None:
        """Reset the env, play turns until the episode ends, check the final rendering."""
        try:
            self.history = await reset_env(self.env, self.task, self.cfg.env_timeout_s)
        except EpisodeError as err:
            raise self._fail(str(err), err.reason) from err.__cause__
        try:
            prompt_ids = self.rec.prompt(self.history)
        except Exception as err:
            raise self._fail(f"rendering the prompt failed: {err}", "env_error") from err
        for turn in range(self.max_turns):
            next_prompt = await self._turn(turn, prompt_ids)
            if next_prompt is None:
                break
            prompt_ids = next_prompt
        if self.cfg.check_prefix:
            self.rec.check_final(len(self.rewards), self.history)

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
        text = rec.record(turn, gen)
        timing = {"generate_s": time.perf_counter() - t0, "env_s": 0.0}
        self.timings.append(timing)
        ended = gen.token_ids[-1] == self.eot_id and text.endswith(self.eot_text)
        content = text[: -len(self.eot_text)] if ended else text
        self.history.append({"role": "assistant", "content": content})
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
            next_prompt = rec.observe(turn + 1, self.history, result.observation, cfg.check_prefix)
        except PrefixInvariantError:
            raise
        except Exception as err:  # the template cannot render the env's messages
            why = f"rendering the observation: {type(err).__name__}: {err}"
            raise self._fail(why, "env_error") from err
        self.history.extend(result.observation)
        return next_prompt


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
