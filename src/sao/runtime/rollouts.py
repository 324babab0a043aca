"""Collecting a batch of episodes with a fixed policy (value-pretraining corpora, evaluation-like runs)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from sao.engine.types import InferenceEngine
from sao.envs.base import Env, Task
from sao.rollout.agent_loop import AgentLoopConfig, EpisodeError, run_episode
from sao.types import Trajectory

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
    each drop reason logged; the result can be shorter than ``n``.
    """
    if not tasks:
        raise ValueError("collect_rollouts needs at least one task")
    gate = asyncio.Semaphore(concurrency)
    logged: set[str] = set()

    async def one(i: int) -> Trajectory | None:
        async with gate:
            try:
                return await run_episode(
                    engine, tokenizer, make_env(), tasks[i % len(tasks)], loop_cfg, seed=seed + i
                )
            except EpisodeError as err:
                if err.reason not in logged:
                    logged.add(err.reason)
                    log.warning("rollout %d dropped (%s): %s [later ones are not logged]", i, err.reason, err)
                return None

    results = await asyncio.gather(*(one(i) for i in range(n)))
    return [t for t in results if t is not None]
