"""`LocalBackend`: the run's models, engine and trainer in this process (``runtime.backend=local``).

The actor (and critic) are loaded here and trained by one `sao.train.step.Trainer` in the run's trainer
thread; the engine (in-process, a child process, or a vLLM / SGLang server) is supervised: restarted with
the actor's current weights when it dies; weights reach it through `InprocSync`. The torch threads of the
engine and the trainer are split by `sao.runtime.threads.plan_threads`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from sao.types import Batch

from .args import CriticArgs, EngineArgs, ModelArgs, ThreadArgs, TrainerArgs
from .backend import EngineHooks, ModelDirs
from .build import build_trainer
from .engine_guard import SupervisedEngine
from .engines import StartDirs, start_engine
from .eval_engine import FrozenEvalEngine
from .threads import plan_threads
from .weight_sync import InprocSync, WeightSync, push_dtype

__all__ = ["LocalBackend"]


class LocalBackend:
    """The one-process `Backend` (`sao.runtime.backend`)."""

    def __init__(
        self,
        threads: ThreadArgs,
        engine: EngineArgs,
        actor: ModelArgs,
        critic: CriticArgs,
        trainer: TrainerArgs,
        console: Console,
    ) -> None:
        self.engine_args, self.actor_args, self.critic_args = engine, actor, critic
        self.trainer_args, self.console = trainer, console
        self.threads = plan_threads(threads.backend, threads.engine, threads.trainer)
        self.trainer_threads = self.threads.trainer
        self.actor: Any = None  # loaded by `load_models`
        self.critic: Any = None  # None: the run has no critic
        self.engine: SupervisedEngine | None = None  # started by `start_engine`
        self.trainer: Any = None  # built by `trainer_and_sync`

    def load_models(self, dirs: ModelDirs) -> None:
        from sao.models.critic import load_critic
        from sao.models.loading import load_policy
        from sao.train.common import ready_for_training

        actor, critic = self.actor_args.compute, self.critic_args  # the trainer's precision and kernel
        policy = load_policy(dirs.actor, dtype=actor.master_dtype, device=actor.device)
        self.actor = ready_for_training(policy, actor)
        if critic.enabled:
            compute = critic.compute
            model = load_critic(dirs.critic, freeze="none", dtype=compute.master_dtype, device=compute.device,
                                head_init=critic.head_init)  # fmt: skip
            self.critic = ready_for_training(model, compute)

    async def start_engine(self, dirs: ModelDirs, tokenizer: Any, hooks: EngineHooks) -> SupervisedEngine:
        args = dataclasses.replace(self.engine_args, threads=self.threads.engine)
        self.console.print(self.threads.describe(), markup=False, highlight=False)

        load_dir = StartDirs(dirs.actor, dirs.base)

        def start() -> Any:
            return start_engine(args, load_dir(), dirs.base, tokenizer)

        async def weights() -> tuple[Any, int]:
            async with hooks.train_lock:
                return self.actor.state_dict(), hooks.version()

        engine = await start()
        self.engine = SupervisedEngine(
            engine, start, weights, max_restarts=args.max_restarts, on_failed=hooks.on_failed
        )
        return self.engine

    def eval_engine(
        self, dirs: ModelDirs, tokenizer: Any, concurrency: int, version: Callable[[], int]
    ) -> Any:
        """A `FrozenEvalEngine`: an engine like the run's (``concurrency`` episodes at once), started on the
        first evaluation, loaded with a copy of the actor's weights of the evaluated step."""
        args = dataclasses.replace(self.engine_args, threads=self.threads.engine, max_concurrent=concurrency)
        dtype = push_dtype(args.backend, args.dtype, args.device)

        def snapshot() -> dict[str, Any]:  # a copy: the trainer goes on changing its own weights
            return {k: v.detach().to(dtype or v.dtype, copy=True) for k, v in self.actor.state_dict().items()}

        # The configured model, not a resumed run's checkpoint (rotation may have deleted it): every
        # evaluation loads its step's snapshot anyway.
        return FrozenEvalEngine(functools.partial(start_engine, args, dirs.base, dirs.base, tokenizer),
                                snapshot, version)  # fmt: skip

    def pretrain_value(self, corpus: list[Any], options: Any, console: Console) -> Any:
        from sao.train.value_pretrain import pretrain_value

        return pretrain_value(self.critic, corpus, options, None, console)

    def trainer_and_sync(self) -> tuple[Any, WeightSync]:
        self.trainer = build_trainer(self.trainer_args, self.actor, self.critic)
        e = self.engine_args
        return self.trainer, InprocSync(self.engine, self.actor, push_dtype(e.backend, e.dtype, e.device))

    def scorer(self) -> Callable[[list[int]], list[float]]:
        from .push_check import trainer_score

        return functools.partial(trainer_score, self.actor)

    def restore_weights(self, checkpoint: Path) -> None:
        """Plain checkpoints were loaded with the models; FSDP ranks' shards are loaded into this process."""
        from sao.train.dcp import has_sharded, load_plain

        if has_sharded(checkpoint):
            t = self.trainer
            load_plain(checkpoint, self.actor, self.critic, t.actor_optim, t.critic_optim)

    def train_step(self, batch: Batch, **kwargs: Any) -> dict[str, float]:
        """``trainer.train_step`` plus ``trainer/threads``, the intra-op torch threads of the thread it ran in
        (the run's trainer thread)."""
        import torch

        metrics = self.trainer.train_step(batch, **kwargs)
        metrics["trainer/threads"] = float(torch.get_num_threads())
        return metrics

    def checkpoint_models(self) -> dict[str, Any]:
        return {"actor": self.actor, "critic": self.critic}

    async def close(self) -> None:
        if self.engine is not None:
            await self.engine.close()
