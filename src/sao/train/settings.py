"""What the RL trainer receives: plain, typed settings (`sao.runtime.build.trainer_args` fills them from the
``algo``, ``critic``, ``trainer`` and ``engine`` sections; a component never sees the whole config)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["ActorOptim", "CriticOptim", "TrainerArgs"]


@dataclass(frozen=True)
class ActorOptim:
    """The actor's AdamW and lr schedule (``trainer.*``)."""

    lr: float
    weight_decay: float
    grad_clip: float  # total gradient-norm clip
    lr_schedule: str  # constant | cosine | linear
    warmup_steps: int
    total_steps: int  # the schedule's length


@dataclass(frozen=True)
class CriticOptim:
    """The critic's schedule and AdamW (``critic.*``, ``algo.k_critic``, ``trainer.weight_decay``)."""

    k_critic: int  # critic optimizer steps per actor step, targets fixed
    freeze: str | tuple[str, ...]  # 'attention', 'none' or parameter-name regexes
    lr: float
    weight_decay: float
    lr_warmup_steps: int
    warmup_steps: int  # critic-only trainer steps before the actor trains
    value_clip: float | None
    recompute_values: bool
    grad_clip: float


@dataclass(frozen=True)
class TrainerArgs:
    """Everything `sao.train.step.Trainer` is built from.

    ``estimator`` / ``loss``: the typed algorithm configs (``algo.advantage`` / ``algo.loss``; their
    ``build()`` gives the object the trainer calls). ``seed``: the trainer's (a sharded trainer's ranks seed
    their generators with it)."""

    estimator: Any  # sao.algos.AdvantageEstimator, or a CustomEstimator entry
    loss: Any  # sao.algos.PolicyLoss, or a CustomLoss entry
    actor: ActorOptim
    critic: CriticOptim
    micro_batch_tokens: int
    max_consecutive_skips: int
    gradient_sync: Literal["step", "micro_batch"] = "step"
    temperature: float = 1.0  # the engine's sampling temperature (log-probs are taken at it)
    seed: int = 0
