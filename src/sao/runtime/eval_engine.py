"""Where a run's evaluations sample (``eval.engine``): an engine of their own frozen at the evaluated step,
or the run's engine.

- `FrozenEvalEngine` (``frozen``): a second engine that only evaluations use. When the evaluation of step s
  is launched, the trainer's weights of step s are copied (`hold`, between two training steps, so the copy
  is exactly step s's); the evaluation then loads that copy into its engine and samples from it alone. No
  weight push reaches that engine while it evaluates, so ``eval/policy_version_start == _end`` (= s's
  version) by construction. Evaluations run one after another on it; a copy waits while an earlier
  evaluation still runs. Cost: one more copy of the weights for the engine, one per waiting evaluation, the
  engine's KV cache for ``eval.concurrency`` episodes, and its decode steps share the machine with the
  training engine's (on a CPU they take cores from it while an evaluation runs).
- `SharedEvalEngine` (``shared``): the run's own engine, interleaving evaluation episodes with training
  episodes; weights pushed during an evaluation reach its later episodes, so an intermediate evaluation
  spans versions ``start`` … ``end`` (logged). Costs nothing more; only the final evaluation (after the
  episode sources stopped) is on one version.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

__all__ = ["EvalEngine", "FrozenEvalEngine", "SharedEvalEngine"]

R = TypeVar("R")


class EvalEngine(Protocol):
    def hold(self) -> Any:
        """What an evaluation launched now needs later (called between training steps)."""

    async def run(self, held: Any, fn: Callable[[Any], Awaitable[R]]) -> tuple[R, int, int]:
        """``fn(engine)`` on the engine of ``held``; its result and the first and last policy version the
        engine held while it ran."""

    async def close(self) -> None: ...


class SharedEvalEngine:
    """The run's engine; versions from the run's clock (``version()``)."""

    def __init__(self, engine: Any, version: Callable[[], int]) -> None:
        self.engine, self.version = engine, version

    def hold(self) -> None:
        return None

    async def run(self, held: None, fn: Callable[[Any], Awaitable[R]]) -> tuple[R, int, int]:
        start = self.version()
        result = await fn(self.engine)
        return result, start, self.version()

    async def close(self) -> None:
        """Nothing: the run closes its engine."""


class FrozenEvalEngine:
    """An engine of the evaluations' own: ``start()`` starts it (on the first evaluation, and again after
    one failed), ``snapshot()`` copies the trainer's current weights in the engine's dtype, ``version()`` is
    their policy version."""

    def __init__(
        self, start: Callable[[], Awaitable[Any]], snapshot: Callable[[], Any], version: Callable[[], int]
    ) -> None:
        self.start, self.snapshot, self.version = start, snapshot, version
        self.engine: Any = None
        self._lock = asyncio.Lock()

    def hold(self) -> tuple[Any, int]:
        return self.snapshot(), self.version()

    async def run(self, held: tuple[Any, int], fn: Callable[[Any], Awaitable[R]]) -> tuple[R, int, int]:
        weights, version = held
        async with self._lock:
            if self.engine is None:
                self.engine = await self.start()
            try:
                await self.engine.update_weights(weights, version)
                del weights, held  # the engine holds its own copy now
                start = self.engine.version
                result = await fn(self.engine)
                return result, start, self.engine.version
            except BaseException:  # a broken or cancelled evaluation: the next one starts a fresh engine
                await self.close()
                raise

    async def close(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            await engine.close()
