"""What the simulated episodes look like: turns, token counts and environment waits.

An `Episode` is a prompt and a sequence of `Turn`s; each turn prefills its new tokens (the prompt on turn
0, the previous turn's observation afterwards), generates ``gen_tokens`` and then waits ``env_s`` seconds of
environment wall time (no engine cost). A `Workload` draws episodes from a seeded ``random.Random``:

* `EmpiricalWorkload` resamples whole episodes of a real run (``RUN_DIR/episodes.jsonl``, one line per
  trained trajectory), so the joint distribution of turns, token counts and env times is kept;
* `ParametricWorkload` draws turns per episode, tokens per turn and env latency from `sao.plan.dists`
  distributions, within the run's budgets (max turns, max new tokens per turn, context budget).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from sao.jsonl import iter_jsonl

from .dists import Distribution, Fixed

__all__ = [
    "EPISODES_FILE",
    "EmpiricalWorkload",
    "Episode",
    "ParametricWorkload",
    "Turn",
    "Workload",
    "WorkloadError",
    "WorkloadSummary",
    "load_episodes",
    "summarize",
]

EPISODES_FILE = "episodes.jsonl"


class WorkloadError(ValueError):
    """An unreadable or malformed workload file; the message names the file and line."""


@dataclass(frozen=True)
class Turn:
    """One model turn: ``gen_tokens`` generated, then ``obs_tokens`` of observation appended (0 on the
    last turn) after ``env_s`` seconds of environment wall time."""

    gen_tokens: int
    obs_tokens: int = 0
    env_s: float = 0.0


@dataclass(frozen=True)
class Episode:
    prompt_tokens: int
    turns: tuple[Turn, ...]

    @property
    def total_tokens(self) -> int:
        """Tokens of the finished trajectory: prompt, every reply and every observation."""
        return self.prompt_tokens + sum(t.gen_tokens + t.obs_tokens for t in self.turns)

    @property
    def gen_tokens(self) -> int:
        return sum(t.gen_tokens for t in self.turns)

    @property
    def env_s(self) -> float:
        return sum(t.env_s for t in self.turns)


class Workload(Protocol):
    def sample(self, rng: random.Random) -> Episode: ...

    def describe(self) -> str: ...


class EmpiricalWorkload:
    """Draws uniformly (with replacement) from recorded episodes."""

    def __init__(self, episodes: Sequence[Episode], source: str = "episodes") -> None:
        if not episodes:
            raise WorkloadError(f"{source}: no episodes")
        self.episodes = list(episodes)
        self.source = source

    @classmethod
    def from_run_dir(cls, run_dir: str | Path) -> EmpiricalWorkload:
        path = Path(run_dir) / EPISODES_FILE
        return cls(load_episodes(path), str(path))

    def sample(self, rng: random.Random) -> Episode:
        return self.episodes[rng.randrange(len(self.episodes))]

    def describe(self) -> str:
        return f"resampled from {self.source} ({len(self.episodes)} episodes)"


def _int_field(record: dict[str, object], key: str, where: str) -> int:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise WorkloadError(f"{where}: {key!r} must be a non-negative number, got {value!r}")
    return int(value)


def _float_field(record: dict[str, object], key: str, where: str) -> float:
    value = record.get(key, 0.0)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise WorkloadError(f"{where}: {key!r} must be a finite non-negative number, got {value!r}")
    return float(value)


def load_episodes(path: str | Path) -> list[Episode]:
    """Episodes of an ``episodes.jsonl`` (the runtime's format: ``prompt_tokens`` and ``turns`` of
    ``gen_tokens`` / ``obs_tokens`` / ``env_s``; other keys are ignored)."""
    path = Path(path)
    if not path.is_file():
        raise WorkloadError(f"{path}: no such file (a run writes it when it trains)")
    episodes = []
    for lineno, record in iter_jsonl(path, WorkloadError):
        where = f"{path}:{lineno}"
        if not isinstance(record, dict) or not isinstance(record.get("turns"), list) or not record["turns"]:
            raise WorkloadError(f"{where}: expected an object with a non-empty 'turns' list")
        turns = []
        for i, turn in enumerate(record["turns"]):
            if not isinstance(turn, dict):
                raise WorkloadError(f"{where}: turns[{i}] is not an object")
            at = f"{where}: turns[{i}]"
            turns.append(
                Turn(
                    _int_field(turn, "gen_tokens", at),
                    _int_field(turn, "obs_tokens", at),
                    _float_field(turn, "env_s", at),
                )
            )
        episodes.append(Episode(_int_field(record, "prompt_tokens", where), tuple(turns)))
    if not episodes:
        raise WorkloadError(f"{path}: no episodes")
    return episodes


@dataclass(frozen=True)
class ParametricWorkload:
    """Episodes drawn from distributions, within budgets.

    ``turns``: model turns per episode (rounded, clipped to ``[1, max_turns]``); ``gen_tokens``,
    ``obs_tokens``: tokens per turn (rounded, ``gen`` clipped to ``[1, max_new_tokens]``); ``env_s``:
    seconds of env latency per turn; ``max_total_tokens``: the context budget — the episode ends at the turn
    that reaches it (that turn's reply is cut to fit), as the agent loop stops a trajectory at its budget.
    ``label`` starts `describe`.
    """

    turns: Distribution = field(default_factory=lambda: Fixed(1))
    gen_tokens: Distribution = field(default_factory=lambda: Fixed(512))
    obs_tokens: Distribution = field(default_factory=lambda: Fixed(0))
    prompt_tokens: Distribution = field(default_factory=lambda: Fixed(256))
    env_s: Distribution = field(default_factory=lambda: Fixed(0.0))
    max_turns: int = 1_000_000
    max_new_tokens: int = 1_000_000_000
    max_total_tokens: int | None = None
    label: str = "parametric"

    def sample(self, rng: random.Random) -> Episode:
        prompt = max(1, round(self.prompt_tokens.sample(rng)))
        n_turns = min(self.max_turns, max(1, round(self.turns.sample(rng))))
        budget = math.inf if self.max_total_tokens is None else self.max_total_tokens - prompt
        turns: list[Turn] = []
        for i in range(n_turns):
            gen = min(self.max_new_tokens, max(1, round(self.gen_tokens.sample(rng))))
            env = max(0.0, self.env_s.sample(rng))
            if gen >= budget:  # the budget ends the episode on this reply
                turns.append(Turn(max(1, int(budget)), 0, env))
                break
            budget -= gen
            obs = 0 if i == n_turns - 1 else max(0, round(self.obs_tokens.sample(rng)))
            if obs >= budget:  # the observation would fill the context: the episode ends here
                turns.append(Turn(gen, 0, env))
                break
            budget -= obs
            turns.append(Turn(gen, obs, env))
        return Episode(prompt, tuple(turns))

    def describe(self) -> str:
        caps = f"max_turns={self.max_turns}, max_new_tokens={self.max_new_tokens}"
        if self.max_total_tokens is not None:
            caps += f", max_total_tokens={self.max_total_tokens}"
        return (
            f"{self.label}: turns {self.turns}, gen {self.gen_tokens}, obs {self.obs_tokens}, "
            f"prompt {self.prompt_tokens}, env_s {self.env_s} ({caps})"
        )


@dataclass(frozen=True)
class WorkloadSummary:
    """Means (and p99 of the episode's wall-clock-relevant sizes) over ``n`` sampled episodes."""

    n: int
    turns_mean: float
    turns_max: int
    gen_tokens_mean: float
    gen_tokens_p99: float
    total_tokens_mean: float
    env_s_mean: float


def summarize(workload: Workload, n: int = 2000, seed: int = 0) -> WorkloadSummary:
    """Statistics of ``n`` episodes drawn with ``seed`` (for the CLI's workload table)."""
    rng = random.Random(seed)
    eps = [workload.sample(rng) for _ in range(n)]
    gens = sorted(e.gen_tokens for e in eps)
    return WorkloadSummary(
        n=n,
        turns_mean=sum(len(e.turns) for e in eps) / n,
        turns_max=max(len(e.turns) for e in eps),
        gen_tokens_mean=sum(gens) / n,
        gen_tokens_p99=float(gens[min(n - 1, int(0.99 * n))]),
        total_tokens_mean=sum(e.total_tokens for e in eps) / n,
        env_s_mean=sum(e.env_s for e in eps) / n,
    )
