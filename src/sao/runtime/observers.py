"""Per-batch work of a run, each piece an explicit observer of the trained step, run by `observe` in the
order `sao.runtime.runner.Run` declares them:

1. `WeightPush` — the new weights to the engine, without aborting in-flight episodes;
2. `WeightChecks` (`sao.runtime.weight_checks`) — the push probe's per-replica log-prob differences and the
   lag-0 mismatch drift alarm, added to the step's metrics (before the books free capacity, so no
   episode starts between the push and the checkpoint in sync mode);
3. `Books` — the staleness books and the episode sources learn that the batch was trained; runtime
   metrics (throughput, idle fractions, queue size, trajectory counts, policy version, gateway sessions);
   with an LLM judge, `JudgeMetrics` adds its counters (``judge/*``);
4. the `TrajectoryInspector` (``logging.inspect_every``, `sao.runtime.inspection`), then the `EpisodeLog`
   (``logging.episodes``, `sao.runtime.run_logs`), when they are on;
5. `MetricsLog` — the step's metrics to the sinks and the progress display; then the checks' verdict (a
   failed probe or a drift alarm with ``action: error`` stops the run, the failing step logged first);
6. `Checkpoints` — every ``logging.checkpoint_every`` steps and at the last one;
7. the evaluator (`sao.runtime.evaluation.TrainingEvaluator.on_step`), every ``logging.eval_every`` steps.

An observer gets the `StepRecord` (step, version, trajectories, timings, metrics it may add to) and the
run's shared objects from its constructor; none reads the config.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sao.types import Batch, Trajectory

__all__ = [
    "Books",
    "Checkpoints",
    "JudgeMetrics",
    "MetricsLog",
    "StepObserver",
    "StepRecord",
    "WeightPush",
    "observe",
]


@dataclass
class StepRecord:
    """One trained step: ``step`` and ``version`` after it, the batch (and its trajectories, in batch
    order), seconds waited and trained."""

    step: int
    version: int
    batch: Batch
    wait_s: float
    train_s: float
    metrics: dict[str, float] = field(default_factory=dict)
    trajectories: list[Trajectory] = field(default_factory=list)


class StepObserver(Protocol):
    async def on_step(self, record: StepRecord) -> None: ...


async def observe(observers: Sequence[StepObserver], books: StepObserver, record: StepRecord) -> None:
    """Every observer, in order; if one fails, ``books`` (one of them) still learns of the trained batch
    first, so the run's books balance whatever stopped it."""
    done: list[StepObserver] = []
    for observer in observers:
        try:
            await observer.on_step(record)
        except BaseException:
            if observer is not books and books not in done:
                await books.on_step(record)
            raise
        done.append(observer)


class WeightPush:
    """The trainer's new weights to the engines as version ``record.version`` (a `WeightSync` path)."""

    def __init__(self, sync: Any) -> None:
        self.sync = sync

    async def on_step(self, record: StepRecord) -> None:
        t0 = time.monotonic()
        await self.sync.push(record.version)
        record.metrics["runtime/weight_push_s"] = time.monotonic() - t0


class Books:
    """Trajectory accounting after a step, and the runtime metrics derived from it."""

    def __init__(self, staleness: Any, sources: Any, queue: Any, engine: Any) -> None:
        self.staleness, self.sources, self.queue, self.engine = staleness, sources, queue, engine
        self.started_at = time.monotonic()
        self.waited = 0.0

    async def on_step(self, record: StepRecord) -> None:
        n = record.batch.num_sequences
        self.staleness.on_trained(n)
        self.sources.notify_trained()
        self.waited += record.wait_s
        busy = max(record.wait_s + record.train_s, 1e-9)
        s = self.staleness.stats()
        engine = self.engine.stats()
        record.metrics.update(
            {
                "throughput/trajectories_per_s": n / busy,
                "throughput/tokens_per_s": record.batch.num_tokens / busy,
                "runtime/trainer_idle_frac": self.waited / max(time.monotonic() - self.started_at, 1e-9),
                "runtime/wait_s": record.wait_s,
                "runtime/train_s": record.train_s,
                "runtime/in_flight": float(self.sources.in_flight),
                "runtime/engine_running": engine.get("running", float("nan")),
                "runtime/engine_idle_frac": engine.get("idle_fraction", float("nan")),
                "runtime/queue_size": float(self.queue.qsize()),
                "runtime/started": float(s.started),
                "runtime/trained": float(s.trained),
                "runtime/dropped": float(s.dropped),
                "runtime/engine_restarts": engine.get("restarts", 0.0),
                "runtime/engine_threads": engine.get("threads", float("nan")),
                "policy/version": float(record.version),
            }
        )
        record.metrics.update({f"runtime/dropped/{k}": float(v) for k, v in s.drops_by_reason.items()})
        record.metrics.update(self.sources.metrics())  # the gateway's session books, when there is one


class JudgeMetrics:
    """The LLM judge's counters (requests, cache hits, failures by kind, latency) as ``judge/*`` metrics:
    cumulative since the run (this process) started."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def on_step(self, record: StepRecord) -> None:
        record.metrics.update({f"judge/{k}": float(v) for k, v in self.client.stats().items()})


class MetricsLog:
    """The step's metrics to the sinks and the progress display."""

    def __init__(self, sinks: Any, progress: Any) -> None:
        self.sinks, self.progress = sinks, progress

    async def on_step(self, record: StepRecord) -> None:
        self.sinks.log(record.step, record.metrics)
        self.progress.update(record.step, record.metrics, trajectories=record.batch.num_sequences)


class Checkpoints:
    """``save(step, version)`` every ``every`` steps and at step ``last``.

    Queued (finished, not yet trained) trajectories are not in a checkpoint: a resumed run counts them as
    dropped (``lost_on_resume``) through the staleness books it restores."""

    def __init__(self, save: Callable[[int, int], object], every: int, last: int) -> None:
        self.save, self.every, self.last = save, every, last

    async def on_step(self, record: StepRecord) -> None:
        if record.step % self.every == 0 or record.step == self.last:
            self.save(record.step, record.version)
