"""Keeping the rollout engine alive: `SupervisedEngine` restarts an engine process or server that died.

A run's engine is always wrapped. When a request fails and the engine reports itself dead (its ``alive``
attribute: the child process of ``engine.backend=process`` exited, a launched vLLM / SGLang server
exited or an attached one stopped answering), the supervisor

1. fails that request, and every other one in flight on the dead engine, with `EngineCrashedError` (the
   agent loop drops those episodes with reason ``engine_crash``);
2. starts a new engine (the run's own start function) and loads the run's latest weights into it, under
   the current policy version; requests made meanwhile wait for it, then go to the new engine;
3. gives up after ``max_restarts`` restarts with no trained step in between (`note_progress` resets the
   count): `EngineFailedError`, which the run turns into a clean stop with a checkpoint.

An engine without an ``alive`` attribute (the in-process `LocalEngine`) is never restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from sao.engine.types import (
    EngineCrashedError,
    Generation,
    InferenceEngine,
    InvalidRequestError,
    SamplingParams,
    WeightsLike,
)
from sao.serve.limits import engine_context_limit

from .faults import EngineFailedError

__all__ = ["SupervisedEngine"]

log = logging.getLogger(__name__)


def _alive(engine: Any) -> bool:
    return bool(getattr(engine, "alive", True))


class SupervisedEngine:
    """An `InferenceEngine` that restarts the engine it wraps when that one dies (module docstring).

    Args:
        engine: the running engine.
        start: makes a fresh engine (e.g. the run's `start_engine` with its arguments).
        weights: the latest weights and their policy version, loaded into a restarted engine; awaited, so
            the run can hand them over between optimizer steps.
        max_restarts: restarts allowed without a trained step in between.
        on_failed: called once with the `EngineFailedError` when restarts are exhausted.
    """

    def __init__(
        self,
        engine: InferenceEngine,
        start: Callable[[], Awaitable[InferenceEngine]],
        weights: Callable[[], Awaitable[tuple[WeightsLike, int]]],
        *,
        max_restarts: int,
        on_failed: Callable[[EngineFailedError], None] | None = None,
    ) -> None:
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
        self._engine, self._start, self._weights = engine, start, weights
        self.max_restarts, self.on_failed = max_restarts, on_failed
        self.restarts = 0
        self.failed: EngineFailedError | None = None
        self._since_progress = 0
        self._restarting: asyncio.Task[None] | None = None
        self._closing = False

    @property
    def engine(self) -> InferenceEngine:
        """The engine serving now."""
        return self._engine

    @property
    def version(self) -> int:
        return self._engine.version

    @property
    def context_limit(self) -> int | None:
        """The serving engine's context limit in tokens (``context_limit`` or ``max_model_len``), if any."""
        return engine_context_limit(self._engine)

    @property
    def alive(self) -> bool:
        return self.failed is None and not self._closing

    def note_progress(self) -> None:
        """A step was trained: the restarts count starts over."""
        self._since_progress = 0

    async def _restarted(self) -> None:
        """Wait for a restart in progress, if any (never cancelling it)."""
        if self._restarting is not None:
            await asyncio.shield(self._restarting)

    async def _serving(self) -> InferenceEngine:
        """The engine to send a request to: after a restart in progress, if any."""
        await self._restarted()
        if self.failed is not None:
            raise EngineCrashedError(str(self.failed))
        return self._engine

    async def generate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> Generation:
        engine = await self._serving()
        try:
            gen = await engine.generate(prompt_token_ids, params)
        except InvalidRequestError:
            raise
        except Exception as err:
            if _alive(engine) or self._closing:
                raise
            raise EngineCrashedError(self._crashed(engine, f"{type(err).__name__}: {err}")) from err
        if gen.finish_reason in ("error", "abort") and not _alive(engine) and not self._closing:
            raise EngineCrashedError(self._crashed(engine, gen.error or gen.finish_reason))
        return gen

    async def update_weights(self, weights: WeightsLike, version: int) -> None:
        """Load the weights; an engine that dies meanwhile is restarted with them (`EngineFailedError` once
        restarts are exhausted)."""
        await self._restarted()
        if self.failed is not None:
            raise self.failed
        engine = self._engine
        try:
            await engine.update_weights(weights, version)
        except Exception as err:
            if _alive(engine) or self._closing:
                raise
            self._crashed(engine, f"{type(err).__name__}: {err}")
            await self._restarted()  # the restarted engine got the latest weights
            if self.failed is not None:
                raise self.failed from err

    def _crashed(self, engine: InferenceEngine, why: str) -> str:
        """Note that ``engine`` died; start the restart once per dead engine. Returns the message."""
        message = f"the engine died ({why})"
        if engine is self._engine and self._restarting is None and self.failed is None:
            log.error("%s; restarting it with the latest weights", message)
            self._restarting = asyncio.create_task(self._restart(engine, why))
        return message

    async def _restart(self, dead: InferenceEngine, why: str) -> None:
        try:
            with contextlib.suppress(Exception):
                await dead.close()
            while True:
                if self._since_progress >= self.max_restarts:
                    self._fail(why)
                    return
                self._since_progress += 1
                self.restarts += 1
                try:
                    self._engine = await self._fresh_engine()
                    log.warning("engine restarted (%d restart(s) in this run)", self.restarts)
                    return
                except Exception as err:
                    why = f"restart failed: {type(err).__name__}: {err}"
                    log.error("engine %s", why)
        finally:
            self._restarting = None

    async def _fresh_engine(self) -> InferenceEngine:
        engine = await self._start()
        try:
            weights, version = await self._weights()
            await engine.update_weights(weights, version)
        except BaseException:
            with contextlib.suppress(Exception):
                await engine.close()
            raise
        return engine

    def _fail(self, why: str) -> None:
        self.failed = EngineFailedError(
            f"the rollout engine died {self._since_progress + 1} time(s) with no trained step in between "
            f"(engine.max_restarts={self.max_restarts}); last: {why}"
        )
        log.error("%s", self.failed)
        if self.on_failed is not None:
            self.on_failed(self.failed)

    def stats(self) -> dict[str, float]:
        return {**self._engine.stats(), "restarts": float(self.restarts)}

    async def close(self) -> None:
        self._closing = True
        if self._restarting is not None:
            self._restarting.cancel()
            with contextlib.suppress(BaseException):
                await self._restarting
        await self._engine.close()
