"""The asynchronous training run (`sao train`): sources, queue, trainer, weight pushes, observers.

A `Run` is built from the typed `RunParts` of `sao.runtime.build.assemble` (the one place that holds the whole
config; each component gets its own part) by its assembly half, `sao.runtime.run_setup.RunSetup`; this module
is the loop. Where the models, the engine and the trainer live — this process, or a Ray cluster
(``runtime.backend``) — is its `Backend` (`sao.runtime.backend`). The engine generates continuously while the
episode sources keep episodes in flight: the built-in `Producer` (``data.source=env``), external agents
through the run's OpenAI-compatible server (``gateway``: a `GatewaySource` admits their sessions under the
same staleness rule), or both (`Sources`). Finished trajectories (whole groups for group presets) go through
an asyncio queue to the trainer, which trains on each batch of ``trainer.batch_size`` arrivals in a worker
thread; the per-batch work then hangs off the observers (`sao.runtime.observers`): the weight push (in-flight
episodes are not aborted, so one trajectory can span several policy versions), the books, metrics,
checkpoints, evaluations. The `TrainingClock` is the one version provider; the `StalenessManager` bounds how
far generation runs ahead (``runtime.max_staleness``) and drops too-stale trajectories
(``runtime.drop_older_than``). ``runtime.mode = "sync"`` is the same pipeline with capacity and in-flight
bound of exactly one batch.

Faults (docs/faults.md): episodes whose env or engine failed are dropped and counted by the producer; a
dead engine process or server is restarted with the latest weights (`SupervisedEngine`); when that keeps
failing (``engine.max_restarts``), every episode fails (``runtime.max_consecutive_drops`` in a row),
training diverges (``trainer.max_consecutive_skips`` non-finite steps in a row), or a weight push misses
``runtime.weight_sync_timeout_s`` or fails its check (`sao.runtime.weight_checks`), the run writes a
checkpoint of its last trained step and stops with `RunStopped`. Any other failure out of the producer
(e.g. a chat template that rewrites history) ends the run with that error. No algorithm logic here (that
is `sao.train.step.Trainer`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

from rich.console import Console

from sao.config import RunConfig
from sao.types import Batch, Trajectory

from .engines import EngineStartError
from .faults import EngineFailedError, NothingTrainableError, RunStopped
from .observers import StepRecord, observe
from .run_setup import RunSetup, timeline
from .weight_checks import STOPPING_ERRORS

__all__ = ["EngineStartError", "Run", "RunResult", "RunStopped", "train", "train_sync_entry"]


@dataclasses.dataclass
class RunResult:
    steps: int
    policy_version: int
    run_dir: Path
    counters: dict[str, int]
    last_metrics: dict[str, float]


class Run(RunSetup):
    """One training run: `start` (`RunSetup`) builds every component (the engine first, closed on any
    failure after it), `loop` trains until ``trainer.total_steps``, `close` stops what `start` started."""

    async def loop(self) -> None:
        """Train until ``trainer.total_steps``; the sources run beside it. Raises `RunStopped` (after a
        checkpoint) when the engine cannot be kept alive or training diverged."""
        producing = asyncio.create_task(self.sources.run())
        try:
            if self.pre_metrics:
                self.sinks.log(0, {**self.pre_metrics, "runtime/elapsed_s": self.state.elapsed_s()})
            self.evaluator.on_start()
            logs = self.parts.run_logs
            async with timeline(logs, self.clock, self.staleness, self.sources, self.queue, self.engine):
                await self._steps()
            self.sources.stop()
            await producing
            await self.evaluator.finish(self.trainer.step)  # the final evaluation has the engine to itself
        finally:  # on any exit (stop and await are no-ops when the sources already ended)
            self.sources.stop()
            await producing
            self.evaluator.cancel()
            await self.evaluator.wait()

    async def _steps(self) -> None:
        """Train, observe, repeat, until ``trainer.total_steps``."""
        from sao.train.step import TrainingDiverged

        with self.progress:
            while self.trainer.step < self.parts.loop.total_steps:
                try:
                    record = await self._train_one()
                    record.metrics["runtime/elapsed_s"] = self.state.elapsed_s()
                    await observe(self.observers, self.books, record)
                except (EngineFailedError, NothingTrainableError, TrainingDiverged, *STOPPING_ERRORS) as err:
                    raise self._stop_cleanly(err) from err
                self.engine.note_progress()
                self.evaluator.on_step(record.step)
                self.last = record.metrics

    def _stop_cleanly(self, err: BaseException) -> RunStopped:
        """Checkpoint the last trained step (the weights a skipped step left untouched) and say why."""
        step = self.trainer.step
        if self.ckpts.latest() != self.ckpts.path_for(step):
            self._save_checkpoint(step, self.clock.version)
        where = self.ckpts.latest()
        message = f"the run stopped at step {step}: {err}. Checkpoint: {where}; resume it with --resume"
        self.console.print(message, style="bold red", markup=False, highlight=False)
        return RunStopped(message, where)

    async def _train_one(self) -> StepRecord:
        t0 = time.monotonic()
        groups: list[list[Trajectory]] = []
        while sum(len(g) for g in groups) < self.parts.loop.batch_size:
            groups.append(await self.failure.unless_failed(self.queue.get()))
        wait_s = time.monotonic() - t0
        # Episode order (seed = run seed + episode index), not arrival order: the batch, and so the step,
        # does not depend on which episode happened to finish first.
        trajs = sorted((t for g in groups for t in g), key=lambda t: t.metadata.get("seed") or 0)
        batch = Batch.from_trajectories(trajs)
        t1 = time.monotonic()
        capture = self.inspector.wants(self.trainer.step + 1)
        async with self._train_lock:
            metrics = await self._in_trainer(
                self.backend.train_step, batch, policy_version=self.clock.version, capture=capture
            )
            self.clock.advance(len(trajs))
        return StepRecord(
            self.trainer.step, self.clock.version, batch, wait_s, time.monotonic() - t1, metrics, trajs
        )

    async def close(self) -> RunResult:
        """Close the sinks, the engine and the trainer's thread; the run's result."""
        try:
            self.sinks.close()
        finally:
            try:
                await self._close_engine()
            finally:
                self._trainer_pool.shutdown(wait=False)
        counters = {**dict(self.sources.counters if self.sources else {}), **self.state.counts()}
        return RunResult(self.trainer.step, self.clock.version, self.run_dir, counters, self.last)


async def train(cfg: RunConfig, *, resume: bool = False, console: Console | None = None) -> RunResult:
    """Run (or resume) the training job described by ``cfg``; see the module docstring."""
    run = Run(cfg, resume=resume, console=console)
    await run.start()
    try:
        await run.loop()
    finally:
        result = await run.close()
    return result


def train_sync_entry(cfg: RunConfig, resume: bool = False) -> RunResult:
    """Blocking entry point for the CLI."""
    return asyncio.run(train(cfg, resume=resume))
