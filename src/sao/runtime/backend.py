"""`Backend`: where a run's models, engine and trainer live — one process (`LocalBackend`) or a Ray cluster
(`RayBackend`, ``runtime.backend=ray``) — behind the one surface `sao.runtime.runner.Run` uses.

The run loop owns everything else (prompts, sources, queue, staleness, metrics, checkpoint bookkeeping)
and calls a backend in this order: `load_models`, `start_engine`, `pretrain_value` (maybe),
`trainer_and_sync`, `eval_engine` (with ``eval.engine=frozen``), then `scorer`, `restore_weights` (on
resume), `train_step` and `checkpoint_models`
(every step / checkpoint), and `close`. The blocking methods (`pretrain_value`, `train_step`) run in the
run's trainer thread, with ``trainer_threads`` intra-op torch threads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console

from sao.types import Batch

from .weight_sync import WeightSync

__all__ = ["Backend", "EngineHooks", "ModelDirs"]


@dataclass(frozen=True)
class ModelDirs:
    """Where the run's models come from: ``base`` (the configured model, the tokenizer's source), ``actor``
    and ``critic`` (a resumed run's checkpoint directories, else ``base``)."""

    base: Path
    actor: Path
    critic: Path


@dataclass(frozen=True)
class EngineHooks:
    """What an engine (re)started by a backend needs of the run: ``on_failed`` ends the run when restarts
    are exhausted; a restarted engine takes the weights under ``train_lock`` as version ``version()``."""

    on_failed: Callable[[BaseException], None]
    train_lock: asyncio.Lock
    version: Callable[[], int]


class Backend(Protocol):
    trainer_threads: int | None  # intra-op torch threads of the run's trainer thread (None: as set)

    def load_models(self, dirs: ModelDirs) -> None:
        """Load the actor (and critic) where the trainer runs."""

    async def start_engine(self, dirs: ModelDirs, tokenizer: Any, hooks: EngineHooks) -> Any:
        """Start the (supervised) rollout engine, or the pool of replicas; returns it."""

    def eval_engine(
        self, dirs: ModelDirs, tokenizer: Any, concurrency: int, version: Callable[[], int]
    ) -> Any:
        """The `sao.runtime.eval_engine.FrozenEvalEngine` of ``eval.engine=frozen`` (weights of the clock's
        ``version()``); only where the config allows it (`sao.config.sections.frozen_eval_supported`)."""

    def pretrain_value(self, corpus: list[Any], options: Any, console: Console) -> Any:
        """Value pretraining of the critic on ``corpus`` (blocking); its `ValuePretrainResult`."""

    def trainer_and_sync(self) -> tuple[Any, WeightSync]:
        """The `Trainer` surface of the run and the weight hand-off to the engine (after value
        pretraining: the local trainer (re)applies the critic's freezing when it is built)."""

    def scorer(self) -> Callable[[list[int]], list[float]]:
        """The trainer's teacher-forced scorer of the push probe (blocking: ids -> log-probs)."""

    def restore_weights(self, checkpoint: Path) -> None:
        """Model weights and optimizer states of ``checkpoint`` into the trainer."""

    def train_step(self, batch: Batch, **kwargs: Any) -> dict[str, float]:
        """One RL step on ``batch`` (blocking); its metrics."""

    def checkpoint_models(self) -> dict[str, Any]:
        """The model arguments of `CheckpointManager.save` (the models, or a writer of them)."""

    async def close(self) -> None:
        """Stop the engine(s), the trainer ranks and a cluster the backend started."""
