"""Collecting a batch of episodes with a fixed policy (value-pretraining corpora, evaluation-like runs)."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Sequence

from sao.engine.types import InferenceEngine
from sao.envs.base import Env, Task
from sao.rollout.agent_loop import AgentLoopConfig, EpisodeError, run_episode
from sao.types import Trajectory

from .faults import NothingTrainableError

__all__ = ["collect_rollouts"]

log = logging.getLogger(__name__)


async def collect_rollouts(
    engine: InferenceEngine,
    tokenizer: object,
    make_env: Callable[[], Env],
    tasks: Sequence[Task],
    n: int,
    loop_cfg: AgentLoopConfig,
    *,
    concurrency: int = 32,
    seed: int = 0,
) -> list[Trajectory]:
    """Play ``n`` episodes (tasks cycled in order) with at most ``concurrency`` at once.

    Episodes that yield no trajectory (`EpisodeError`: env or engine failures) are skipped, the first of
    each drop reason logged; the result can be shorter than ``n``. When none yields one,
    `NothingTrainableError` says why (the drops by reason and the first message).
    """
    if not tasks:
        raise ValueError("collect_rollouts needs at least one task")
    gate = asyncio.Semaphore(concurrency)
    drops: Counter[str] = Counter()
    first: list[str] = []

    async def one(i: int) -> Trajectory | None:
        async with gate:
            try:
                return await run_episode(
                    engine, tokenizer, make_env(), tasks[i % len(tasks)], loop_cfg, seed=seed + i
                )
            except EpisodeError as err:
                if not drops[err.reason]:
                    log.warning("rollout %d dropped (%s): %s [later ones are not logged]", i, err.reason, err)
                    first.append(str(err))
                drops[err.reason] += 1
                return None

    results = await asyncio.gather(*(one(i) for i in range(n)))
    trajectories = [t for t in results if t is not None]
    if n and not trajectories:
        raise NothingTrainableError(
            f"none of the {n} rollouts of the policy yielded a trajectory; dropped: {dict(drops)}; "
            f"first: {first[0] if first else 'none'}"
        )
    return trajectories
