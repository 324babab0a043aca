"""The producer: keeps episodes in flight through the agent loop and hands finished ones to the trainer.

Owns: starting episodes (one rollout per prompt, or a group of ``group_size`` for group presets) while
the in-flight bound and the staleness capacity allow, the drop rule for too-stale trajectories, and the
accounting of every started trajectory (queued, or dropped with a reason). Does not own: the engine's
weights (the trainer pushes them), training, or what the episode does (the agent loop and the env).

Queue items are lists of trajectories: one trajectory for single-rollout presets, a whole group for group
presets (a group is queued only when all its members finished, so the trainer always sees whole groups).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable

from sao.engine.types import InferenceEngine
from sao.envs.base import Env, TrainingProgress, notify_training_progress
from sao.rollout.agent_loop import AgentLoopConfig, EpisodeError, run_episode
from sao.types import Trajectory

from .clock import VersionProvider
from .sampler import PromptSampler, Start
from .staleness import StalenessManager

__all__ = ["Producer"]

log = logging.getLogger(__name__)


class Producer:
    """Runs episodes concurrently until ``stop()``; see the module docstring.

    Args:
        engine, tokenizer: what the agent loop generates with.
        make_env: builds a fresh env for each episode.
        sampler: the task order (and group size).
        staleness: capacity and drop rules, shared with the trainer.
        queue: where finished groups go (``list[Trajectory]`` items).
        loop_cfg: agent-loop limits and sampling.
        max_in_flight: episodes generating at once.
        clock: the current policy version (for the drop rule).
        progress: where training stands, handed to each fresh env before its reset
            (`sao.envs.base.notify_training_progress`); None hands nothing.
        seed: episode seeds are ``seed + episode index``.
    """

    def __init__(
        self,
        engine: InferenceEngine,
        tokenizer: object,
        make_env: Callable[[], Env],
        sampler: PromptSampler,
        staleness: StalenessManager,
        queue: asyncio.Queue[list[Trajectory]],
        loop_cfg: AgentLoopConfig,
        *,
        max_in_flight: int,
        clock: VersionProvider,
        progress: Callable[[], TrainingProgress] | None = None,
        seed: int = 0,
    ) -> None:
        if max_in_flight < sampler.group_size:
            raise ValueError(
                f"max_in_flight ({max_in_flight}) must hold a whole group ({sampler.group_size})"
            )
        self.engine, self.tokenizer, self.make_env = engine, tokenizer, make_env
        self.sampler, self.staleness, self.queue, self.loop_cfg = sampler, staleness, queue, loop_cfg
        self.max_in_flight, self.clock, self.progress, self.seed = max_in_flight, clock, progress, seed
        self.episodes_started = 0
        self.counters: Counter[str] = Counter()
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()

    async def run(self) -> None:
        """Start groups whenever the bounds allow, until `stop`; then cancel what is still running."""
        try:
            while not self._stopping.is_set():
                size = self.sampler.group_size
                if self._in_flight + size <= self.max_in_flight and self.staleness.try_start(size):
                    self._launch(self.sampler.next())
                    continue
                self._wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=0.05)  # capacity frees on training
        finally:
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    def _launch(self, start: Start) -> None:
        first = self.episodes_started
        self.episodes_started += start.size
        self._in_flight += start.size
        task = asyncio.create_task(self._play_group(start, first))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _episode(self, start: Start, index: int) -> Trajectory | None:
        env = self.make_env()
        if self.progress is not None:
            try:
                notify_training_progress(env, self.progress())
            except Exception as err:  # a user env's hook that raises costs this episode, not the run
                log.warning("episode of task %s: set_training_progress failed: %s", start.task.id, err)
                with contextlib.suppress(Exception):
                    await env.close()
                return None
        try:
            return await run_episode(
                self.engine, self.tokenizer, env, start.task, self.loop_cfg,
                seed=self.seed + index, group_id=start.group_id,
            )  # fmt: skip
        except EpisodeError as err:
            log.warning("episode of task %s failed before generating: %s", start.task.id, err)
            return None

    async def _play_group(self, start: Start, first: int) -> None:
        results: list[Trajectory | None] = []
        try:
            results = await asyncio.gather(*(self._episode(start, first + i) for i in range(start.size)))
        except asyncio.CancelledError:
            self.staleness.on_dropped("cancelled", start.size)
            self.counters["dropped/cancelled"] += start.size
            raise
        finally:
            self._in_flight -= start.size
            self._wake.set()
        trajs = [t for t in results if t is not None]
        if len(trajs) < start.size:
            # A group with a failed member is dropped whole: group baselines need every member.
            reason = "episode_error" if start.size == 1 else "incomplete_group"
            self.staleness.on_dropped(reason, start.size)
            self.counters[f"dropped/{reason}"] += start.size
            return
        now = self.clock.get_version()
        oldest = min(min((v for v in t.versions if v >= 0), default=now) for t in trajs)
        if self.staleness.should_drop(oldest, now):
            self.staleness.on_dropped("too_stale", start.size)
            self.counters["dropped/too_stale"] += start.size
            return
        self.counters["produced"] += start.size
        await self.queue.put(trajs)

    def notify_trained(self) -> None:
        """Wake the start loop after the trainer consumed trajectories (capacity may have freed)."""
        self._wake.set()
