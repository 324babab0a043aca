"""What a run's checkpoint holds beyond the models and the trainer, and the error that ends a run.

`RunState` is the run's books: the prompt sampler's position, the staleness books, the episode sources'
counters (producer, gateway sessions), the policy version and the wall time trained so far (summed over
resumes). `saved` gives them to `CheckpointManager.save`; `restore` puts a loaded checkpoint's back.

`FirstFailure` holds the first error of a component that cannot go on (engine restarts exhausted, a fatal
producer error): whatever the run is waiting on is abandoned and that error raised (`unless_failed`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

from .clock import TrainingClock
from .staleness import StalenessManager

__all__ = ["FirstFailure", "RunState"]

T = TypeVar("T")


class RunState:
    """The books of one run (module docstring); the sampler and the sources are attached once built."""

    def __init__(self, clock: TrainingClock, staleness: StalenessManager) -> None:
        self.clock, self.staleness = clock, staleness
        self.sampler: Any = None  # PromptSampler
        self.producer: Any = None  # Producer | None
        self.gateway: Any = None  # GatewaySource | None
        self._started = time.monotonic()
        self._elapsed_before = 0.0  # seconds the run had trained before a resume (from its checkpoint)

    def attach(self, sampler: Any, producer: Any, gateway: Any) -> None:
        self.sampler, self.producer, self.gateway = sampler, producer, gateway

    def elapsed_s(self) -> float:
        """Wall seconds of this run since its start (value pretraining included), summed over resumes: the
        time a checkpoint recorded plus the time since this process started the run."""
        return self._elapsed_before + time.monotonic() - self._started

    def saved(self) -> dict[str, Any]:
        """The ``data_position`` and ``counters`` arguments of `CheckpointManager.save`."""
        counters: dict[str, Any] = {"staleness": self.staleness.state_dict(), "elapsed_s": self.elapsed_s()}
        if self.producer is not None:
            counters["producer"] = dict(self.producer.counters)
        if self.gateway is not None:
            counters["gateway"] = self.gateway.state_dict()
        return {"data_position": {"sampler": self.sampler.state_dict()}, "counters": counters}

    def restore(self, loaded: Any, trainer_step: int) -> None:
        """A `LoadedCheckpoint`'s books, with the restored trainer at ``trainer_step``."""
        self.sampler.load_state_dict(loaded.data_position["sampler"])
        self.staleness.load_state_dict(loaded.counters["staleness"])
        if self.producer is not None:
            self.producer.counters.update(loaded.counters.get("producer", {}))
        if self.gateway is not None:
            self.gateway.load_state_dict(loaded.counters.get("gateway", {}))
        self.clock.version = int(loaded.policy_version or 0)
        self.clock.step = trainer_step
        self.clock.trained = self.staleness.stats().trained
        self._elapsed_before = float(loaded.counters.get("elapsed_s", 0.0))

    def counts(self) -> dict[str, int]:
        """The staleness books as the run's result reports them (without the drops by reason)."""
        counts = dataclasses.asdict(self.staleness.stats())
        counts.pop("drops_by_reason", None)
        return counts


class FirstFailure:
    """The first error reported by `fail`; `unless_failed` waits for a coroutine unless one comes first."""

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self._failed = asyncio.Event()

    def fail(self, err: BaseException) -> None:
        if self.error is None:
            self.error = err
            self._failed.set()

    async def unless_failed(self, coro: Coroutine[Any, Any, T]) -> T:
        """``coro``'s result, unless a component fails first: then its error is raised (and ``coro``
        cancelled)."""
        if self.error is not None:
            coro.close()  # never started
            raise self.error
        waiting = asyncio.ensure_future(coro)
        failed = asyncio.ensure_future(self._failed.wait())
        try:
            await asyncio.wait({waiting, failed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            failed.cancel()
        if waiting.done():
            return waiting.result()
        waiting.cancel()
        assert self.error is not None
        raise self.error
