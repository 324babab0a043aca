"""Small deterministic workloads and constants shared by the planner tests."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

from sao.plan import EngineCosts, Episode, StageCosts, TrainerCosts, Turn


class Cycle:
    """Episodes in a fixed order, repeating (the rng is not used)."""

    def __init__(self, episodes: Sequence[Episode]) -> None:
        self._it = itertools.cycle(episodes)

    def sample(self, rng: random.Random) -> Episode:
        return next(self._it)

    def describe(self) -> str:
        return "cycle"


def single_turn(gen: int, prompt: int = 0, env_s: float = 0.0) -> Episode:
    return Episode(prompt, (Turn(gen, 0, env_s),))


def costs(
    t0: float = 0.01,
    t1: float = 0.0,
    c: float = 0.0,
    p: float = 0.0,
    a: float = 1.0,
    b: float = 0.0,
    push_s: float = 0.0,
) -> StageCosts:
    return StageCosts(EngineCosts(t0, t1, c, p), TrainerCosts(a, b), push_s)
