"""Learning-rate multipliers of every trainer, as plain ``step -> factor`` functions: the RL trainer's actor
and critic (`sao.train.step.Trainer`) and supervised warm-starting (`sao.train.sft`, cosine to a floor).

They are wrapped in ``torch.optim.lr_scheduler.LambdaLR``, whose state_dict keeps the step count (the
functions themselves are stateless, so a restored scheduler resumes exactly).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

__all__ = ["actor_lr_factor", "critic_lr_factor"]


def actor_lr_factor(
    schedule: Literal["constant", "cosine", "linear"], warmup_steps: int, total_steps: int, floor: float = 0.0
) -> Callable[[int], float]:
    """Multiplier of the actor lr after ``step`` actor optimizer steps (SFT: after ``step`` SFT steps).

    Linear warm-up ``(step + 1) / warmup_steps`` for the first ``warmup_steps`` steps, then ``constant`` (1),
    ``cosine`` (``floor + (1 − floor)·½(1 + cos πp)``) or ``linear`` (``floor + (1 − floor)(1 − p)``)
    decay, with ``p`` the fraction of the post-warm-up budget ``total_steps − warmup_steps`` used (clamped
    to [0, 1]: the decayed schedules reach ``floor`` at ``total_steps`` and stay there). ``floor`` 0 (the RL
    trainer) gives exactly ``½(1 + cos πp)`` and ``1 − p``.
    """
    if schedule not in ("constant", "cosine", "linear"):
        raise ValueError(f"lr_schedule must be 'constant', 'cosine' or 'linear', got {schedule!r}")
    if not 0.0 <= floor <= 1.0:
        raise ValueError(f"the lr floor must lie in [0, 1], got {floor}")

    def factor(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = min(1.0, max(0.0, (step - warmup_steps) / max(1, total_steps - warmup_steps)))
        decayed = 0.5 * (1.0 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress
        return floor + (1.0 - floor) * decayed  # exactly `decayed` for floor 0

    return factor


def critic_lr_factor(warmup_steps: int) -> Callable[[int], float]:
    """Multiplier of the critic lr after ``step`` trainer steps: linear warm-up over ``warmup_steps`` trainer
    steps (one reading of the paper's "10-step warmup", docs/concepts.md), then 1. The K critic optimizer
    steps of one trainer step share one lr."""

    def factor(step: int) -> float:
        return min(1.0, (step + 1) / warmup_steps) if warmup_steps else 1.0

    return factor
