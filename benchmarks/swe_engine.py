"""The engine arm of `swe_turns`: the repository env's episodes played through a real `LocalEngine`,
teacher-forced, with the engine's kept-KV prefix cache on or off (imported as a sibling module).

Teacher forcing. Each turn the engine generates ``gen_tokens`` tokens (temperature 1, seeded by the turn
index, no stop token) on the episode's true prompt, and the recorded turn is those tokens followed by the
scripted policy's tool calls and the end-of-turn token; the env is handed the scripted text only (the
engine's tokens stand for a turn's free text, e.g. reasoning, and a random model's tokens could hold a
``<tool_call>`` of their own). The engine's tokens stay in the context because the engine's prefix cache
continues a kept KV only when the next prompt starts with *exactly* the finished request's tokens (prompt +
generated, `sao.engine.prefix_store`): had the generated tokens been discarded, no turn would ever hit.
With the cache on, each turn therefore prefills the last turn's last generated token, its scripted tool
calls and the observation, then decodes ``gen_tokens``; with it off (``prefix_cache_tokens=0``) each turn
prefills the whole context.

Timing of an episode: ``engine`` is the wall time inside the real engine's ``generate`` (all of it: the
loop waits on it); the caller's `TimedSandbox` / `TimedSWEEnv` add up the sandbox, env and grading times.
Step boundaries are stamped so that turns/s over the first ``window`` turns can be compared between arms
whose episodes differ in length (reset, grading and close excluded).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import Spread, ratio
from sao.engine.local import LocalEngine
from sao.engine.types import Generation, SamplingParams
from sao.envs.base import StepResult, Task
from sao.rollout.agent_loop import AgentLoopConfig, run_episode

__all__ = ["EngineArm", "ScriptOnlyEnv", "TeacherForcedEngine", "engine_episode", "report"]

STAT_KEYS = ("prefix_hits", "prefix_reused_tokens", "prefill_tokens", "tokens_generated")


@dataclass(frozen=True)
class EngineArm:
    """One engine arm: ``cached`` (the engine's default ``prefix_cache_tokens``) or not (0); episodes of
    ``turns`` turns; ``gen_tokens`` generated per turn; ``window``: turns/s is also measured over the first
    ``window`` turns (<= ``turns``); ``context_limit``: the engine's ``max_model_len`` and ``max_kv_tokens``
    (tokens); ``device``: where the model runs."""

    cached: bool
    turns: int
    gen_tokens: int
    window: int
    context_limit: int
    device: str = "cpu"

    def __post_init__(self) -> None:
        if not 1 <= self.window <= self.turns:
            raise ValueError(f"window must lie in [1, turns={self.turns}], got {self.window}")
        if self.gen_tokens < 1:
            raise ValueError(f"gen_tokens must be >= 1, got {self.gen_tokens}")


class TeacherForcedEngine:
    """An `InferenceEngine` for the agent loop: the real ``engine`` generates ``gen_tokens`` tokens on the
    prompt (timed), and the turn returned is those tokens + the next scripted text + the end-of-turn token.

    ``starts[i]``: `time.perf_counter` when turn i's generate began; ``engine_s``: seconds inside the engine;
    ``script``: the scripted text of the latest turn (what `ScriptOnlyEnv` hands the env)."""

    version = 0

    def __init__(self, engine: LocalEngine, tokenizer: Any, turns: Iterator[str], gen_tokens: int) -> None:
        self.engine, self.tokenizer, self.turns, self.gen_tokens = engine, tokenizer, turns, gen_tokens
        self.eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.starts: list[float] = []
        self.engine_s = 0.0
        self.script = ""

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        started = time.perf_counter()
        self.starts.append(started)
        own = SamplingParams(max_new_tokens=self.gen_tokens, temperature=1.0, seed=len(self.starts))
        gen = await self.engine.generate(prompt_ids, own)
        self.engine_s += time.perf_counter() - started
        if gen.finish_reason != "length" or len(gen.token_ids) != self.gen_tokens:
            raise RuntimeError(
                f"the engine stopped after {len(gen.token_ids)} of {self.gen_tokens} tokens "
                f"({gen.finish_reason}: {gen.error or 'no detail'}); raise --context-limit"
            )
        self.script = next(self.turns)
        forced = [*self.tokenizer.encode(self.script, add_special_tokens=False), self.eot]
        return Generation(
            [*gen.token_ids, *forced],
            [*gen.logprobs, *[0.0] * len(forced)],
            [*gen.versions, *[self.version] * len(forced)],
            "stop",
        )


class ScriptOnlyEnv:
    """``env`` handed only the scripted part of each turn (the text after the engine's tokens);
    ``ends[i]``: `time.perf_counter` when step i returned. Other attributes are ``env``'s."""

    def __init__(self, env: Any, forced: TeacherForcedEngine) -> None:
        self.env, self.forced = env, forced
        self.ends: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    async def reset(self, task: Task) -> list[dict[str, Any]]:
        return await self.env.reset(task)

    async def step(self, assistant_text: str) -> StepResult:
        script = self.forced.script
        if not assistant_text.endswith(script):
            raise RuntimeError(f"the turn's text does not end with the scripted text {script[:60]!r}")
        result = await self.env.step(script)
        self.ends.append(time.perf_counter())
        return result

    async def close(self) -> None:
        await self.env.close()


def _stats_delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {key: after[key] - before[key] for key in STAT_KEYS}


async def _play(model_dir: Path, tokenizer: Any, task: Task, env: Any, script: Iterator[str], arm: EngineArm):
    """Build the arm's engine (not timed), warm it up, play one episode; returns the trajectory, its wall
    seconds, the forced engine, the wrapped env and the engine's counters over the episode."""
    engine = LocalEngine(
        model_dir, device=arm.device, max_running=1, max_model_len=arm.context_limit,
        max_kv_tokens=arm.context_limit, prefix_cache_tokens=None if arm.cached else 0,
    )  # fmt: skip
    async with engine:
        await engine.generate([1, 2, 3, 4], SamplingParams(max_new_tokens=2, seed=0))  # thread, first forward
        before = engine.stats()
        forced = TeacherForcedEngine(engine, tokenizer, script, arm.gen_tokens)
        wrapped = ScriptOnlyEnv(env, forced)
        cfg = AgentLoopConfig(
            max_turns=arm.turns, max_total_tokens=arm.context_limit, max_tokens_per_turn=arm.context_limit
        )
        started = time.perf_counter()
        traj = await run_episode(forced, tokenizer, wrapped, task, cfg)
        wall = time.perf_counter() - started
        stats = _stats_delta(engine.stats(), before)
    return traj, wall, forced, wrapped, stats


def engine_episode(
    model_dir: Path, tokenizer: Any, task: Task, env: Any, script: Iterator[str], arm: EngineArm,
    spent: dict[str, float],
) -> dict[str, float]:  # fmt: skip
    """One teacher-forced episode of ``arm`` on ``env`` (a fresh timed `SWEEnv` whose times add up in
    ``spent``, reset by the caller: ``sandbox_s``, ``reset_close_s``, ``grade_s``); returns its figures:
    turns/s (whole episode, and over the first ``arm.window`` turns without reset/grading/close), the wall
    shares engine / sandbox / env outside the sandbox / agent loop, the engine's prefix counters and the
    final context in tokens."""
    traj, wall, forced, wrapped, stats = asyncio.run(_play(model_dir, tokenizer, task, env, script, arm))
    played, last = len(traj.rewards), traj.metadata["infos"][-1]
    if traj.finish_reason == "length":
        raise RuntimeError(
            f"the context reached the engine's limit ({arm.context_limit} tokens) after {played} of "
            f"{arm.turns} turns; raise --context-limit"
        )
    if played != arm.turns or last.get("grade_error") is not None or not last.get("resolved"):
        raise RuntimeError(f"the episode ended after {played} of {arm.turns} turns unresolved: {last}")
    env_s = sum(t["env_s"] for t in traj.metadata["timings"]) + spent["reset_close_s"]
    graded_in_window = arm.window == played
    window_s = wrapped.ends[arm.window - 1] - forced.starts[0] - (spent["grade_s"] if graded_in_window else 0)
    prompt_tokens = stats["prefill_tokens"] + stats["prefix_reused_tokens"]
    return {
        "turns_per_s": played / wall,
        "window_turns_per_s": arm.window / window_s,
        "wall_s": wall,
        "engine_share": forced.engine_s / wall,
        "sandbox_share": spent["sandbox_s"] / wall,
        "env_share": max(env_s - spent["sandbox_s"], 0.0) / wall,
        "loop_share": max(wall - forced.engine_s - env_s, 0.0) / wall,
        "prefix_hits": stats["prefix_hits"],
        "reused_share": stats["prefix_reused_tokens"] / max(prompt_tokens, 1),
        "prefill_tokens": stats["prefill_tokens"],
        "context_tokens": len(traj.token_ids),
    }


def report(results: dict[str, list[dict[str, float]]], arms: dict[str, EngineArm]) -> str:
    """Each arm's figures, median [range] over its episodes, and the cache on / off ratio of turns/s over
    the first ``window`` turns (the ratio of medians and the range of the per-repetition ratios)."""
    lines = []
    for name, runs in results.items():
        arm, s = arms[name], {key: Spread(tuple(r[key] for r in runs)) for key in runs[0]}
        keep = "default" if arm.cached else "0"
        lines += [
            f"{name} (prefix_cache_tokens {keep}): {arm.turns}-turn episodes, {len(runs)} episodes",
            f"  turns/s                  {s['turns_per_s'].fmt('.2f')}",
            f"  episode wall             {s['wall_s'].fmt('.1f', ' s')}",
            f"  share in engine          {s['engine_share'].fmt('.0%')}",
            f"  share in sandbox runs    {s['sandbox_share'].fmt('.0%')}",
            f"  share in env, host-side  {s['env_share'].fmt('.0%')}",
            f"  share in agent loop      {s['loop_share'].fmt('.0%')}",
            f"  prefix hits              {s['prefix_hits'].fmt('.0f')} of {arm.turns} turns",
            f"  reused prompt tokens     {s['reused_share'].fmt('.1%')}  "
            f"(prefilled {s['prefill_tokens'].fmt(',.0f')} tokens)",
            f"  final context            {s['context_tokens'].fmt(',.0f', ' tokens')}",
        ]
    on, off = results["cache on"], results["cache off"]
    window = arms["cache off"].window
    fast = Spread(tuple(r["window_turns_per_s"] for r in on))
    slow = Spread(tuple(r["window_turns_per_s"] for r in off))
    med, spread = ratio(list(fast.values), list(slow.values))
    lines.append(
        f"first {window} turns (reset, grading, close excluded), turns/s: cache on {fast.fmt('.2f')}, "
        f"cache off {slow.fmt('.2f')}; on / off {med:.2f}x {spread.fmt('.2f')}"
    )
    return "\n".join(lines)
