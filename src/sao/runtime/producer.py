"""The producer: keeps episodes in flight through the agent loop and hands finished ones to the trainer.

Owns: starting episodes (one rollout per prompt, or a group of ``group_size`` for group presets) while
the in-flight bound and the staleness capacity allow, the drop rule for too-stale trajectories, and the
accounting of every started trajectory (queued, or dropped with a reason). Does not own: the engine's
weights (the trainer pushes them), training, or what the episode does (the agent loop and the env).

Faults. An episode that yields no trajectory (the env raised, hung or answered malformed, the engine failed
or crashed under it: `sao.rollout.env_calls.EpisodeError`) is dropped and counted as
``dropped/<reason>``; the first drop of each reason is logged with its message, later ones are only
counted. When ``max_consecutive_drops`` episodes in a row failed that way (a broken env or grader, an
engine that cannot generate), `NothingTrainableError` goes to ``on_fatal``: the run stops instead of
spinning. Any other exception out of an episode (a chat template that rewrites history, a bug) is fatal
too: it is handed to ``on_fatal`` and the producer stops starting episodes.

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
from .faults import NothingTrainableError
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
        on_fatal: told of an exception that is not an episode's own failure (see the module docstring).
        max_consecutive_drops: failed episodes in a row that end the run (None: never).
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
        on_fatal: Callable[[BaseException], None] | None = None,
        max_consecutive_drops: int | None = None,
    ) -> None:
        if max_in_flight < sampler.group_size:
            raise ValueError(
                f"max_in_flight ({max_in_flight}) must hold a whole group ({sampler.group_size})"
            )
        self.engine, self.tokenizer, self.make_env = engine, tokenizer, make_env
        self.sampler, self.staleness, self.queue, self.loop_cfg = sampler, staleness, queue, loop_cfg
        self.max_in_flight, self.clock, self.progress, self.seed = max_in_flight, clock, progress, seed
        self.on_fatal, self.max_consecutive_drops = on_fatal, max_consecutive_drops
        self.logged_reasons: set[str] = set()
        self.failed_in_a_row = 0
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

    @property
    def in_flight(self) -> int:
        """Episodes started and not yet finished (generating or waiting on their env)."""
        return self._in_flight

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

    def _fatal(self, err: BaseException) -> None:
        self.stop()
        if self.on_fatal is not None:
            self.on_fatal(err)

    def _dropped(self, reason: str, n: int, message: str | None = None) -> None:
        self.staleness.on_dropped(reason, n)
        self.counters[f"dropped/{reason}"] += n
        if message is not None and reason not in self.logged_reasons:
            self.logged_reasons.add(reason)
            log.warning("episode dropped (%s): %s [later %s drops are counted, not logged]", reason, message,
                        reason)  # fmt: skip

    async def _episode(self, start: Start, index: int) -> Trajectory | EpisodeError:
        env = self.make_env()
        if self.progress is not None:
            try:
                notify_training_progress(env, self.progress())
            except Exception as err:  # a user env's hook that raises costs this episode, not the run
                with contextlib.suppress(Exception):
                    await env.close()
                return EpisodeError(f"set_training_progress failed: {type(err).__name__}: {err}", "env_error")
        try:
            return await run_episode(
                self.engine, self.tokenizer, env, start.task, self.loop_cfg,
                seed=self.seed + index, group_id=start.group_id,
            )  # fmt: skip
        except EpisodeError as err:
            return err

    async def _play_group(self, start: Start, first: int) -> None:
        results: list[Trajectory | EpisodeError] = []
        try:
            results = await asyncio.gather(*(self._episode(start, first + i) for i in range(start.size)))
        except asyncio.CancelledError:
            self._dropped("cancelled", start.size)
            raise
        except Exception as err:  # not an episode's own failure: the run cannot go on
            self._dropped("fatal", start.size)
            log.error("episode of task %s: %s: %s", start.task.id, type(err).__name__, err)
            self._fatal(err)
            return
        finally:
            self._in_flight -= start.size
            self._wake.set()
        failed = [r for r in results if isinstance(r, EpisodeError)]
        for err in failed:
            self._dropped(err.reason, 1, str(err))
        self.failed_in_a_row = self.failed_in_a_row + len(failed) if len(failed) == start.size else 0
        limit = self.max_consecutive_drops
        if limit is not None and self.failed_in_a_row >= limit:
            drops = dict(self.staleness.stats().drops_by_reason)
            self._fatal(NothingTrainableError(
                f"{self.failed_in_a_row} episodes in a row yielded no trajectory "
                f"(runtime.max_consecutive_drops={limit}); drops so far: {drops}; last: {failed[-1]}"
            ))  # fmt: skip
        if failed:
            # A group with a failed member is dropped whole: group baselines need every member.
            if len(failed) < start.size:
                self._dropped("incomplete_group", start.size - len(failed))
            return
        trajs = [r for r in results if isinstance(r, Trajectory)]
        now = self.clock.get_version()
        oldest = min(min((v for v in t.versions if v >= 0), default=now) for t in trajs)
        if self.staleness.should_drop(oldest, now):
            self._dropped("too_stale", start.size)
            return
        self.counters["produced"] += start.size
        await self.queue.put(trajs)

    def notify_trained(self) -> None:
        """Wake the start loop after the trainer consumed trajectories (capacity may have freed)."""
        self._wake.set()
