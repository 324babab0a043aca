"""Prompt sampling for the producer: epochs in a seeded order, groups for group presets, SPO priorities.

`PromptSampler.next()` returns the next *start*: one task and its group (``group_size`` copies sharing a
``group_id``; size 1 for single-rollout presets). With a `TaskStream` (``data.stream``), start ``i`` plays
the stream's fresh task ``i``. Without weights, tasks are visited epoch by epoch in a
fresh seeded permutation; with a weight function (SPO's prioritised sampling, ``√(p̂(1−p̂)) + floor``),
each start draws a task with probability proportional to its weight. The position (epoch, cursor, draws)
is part of ``state_dict`` so a resumed run continues the same sequence.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sao.envs.base import Task

from .task_stream import TaskStream

__all__ = ["PromptSampler", "Start"]


@dataclass(frozen=True)
class Start:
    """One task to play ``len(group)`` times; ``group_id`` is shared by the group (None for size 1)."""

    task: Task
    group_id: str | None
    size: int


class PromptSampler:
    """Seeded, resumable task order (see the module docstring)."""

    def __init__(
        self,
        tasks: Sequence[Task],
        *,
        group_size: int = 1,
        seed: int = 0,
        weights: Callable[[Sequence[str]], Sequence[float]] | None = None,
        stream: TaskStream | None = None,
    ) -> None:
        if stream is not None and weights is not None:
            raise ValueError("a task stream is not drawn by weights: every task is played once")
        self.stream = stream
        if not tasks and stream is None:
            raise ValueError("the prompt sampler needs at least one task")
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        self.tasks = list(tasks)
        self.group_size = group_size
        self.seed = seed
        self.weights = weights
        self.epoch = 0
        self.cursor = 0
        self.draws = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.tasks)))
        random.Random(f"{self.seed}-{epoch}").shuffle(order)
        return order

    def next(self) -> Start:
        """The next task (and its group) to start."""
        task = self.stream.task(self.draws) if self.stream is not None else self.tasks[self._next_index()]
        self.draws += 1
        group_id = f"{task.id}#{self.draws}" if self.group_size > 1 else None
        return Start(task, group_id, self.group_size)

    def _next_index(self) -> int:
        """The index in ``tasks`` of the next start: drawn by weight, else the epoch order's next."""
        if self.weights is not None:
            w = list(self.weights([t.id for t in self.tasks]))
            if len(w) != len(self.tasks) or any(x < 0 for x in w) or sum(w) <= 0:
                raise ValueError("sampling weights must be one non-negative number per task, not all zero")
            return random.Random(f"{self.seed}-draw-{self.draws}").choices(range(len(self.tasks)), w)[0]
        if self.cursor == len(self._order):
            self.epoch += 1
            self.cursor = 0
            self._order = self._permutation(self.epoch)
        self.cursor += 1
        return self._order[self.cursor - 1]

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "cursor": self.cursor, "draws": self.draws, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["seed"] != self.seed:
            raise ValueError(f"sampler state is for seed {state['seed']}, this sampler has seed {self.seed}")
        self.epoch, self.cursor, self.draws = int(state["epoch"]), int(state["cursor"]), int(state["draws"])
        self._order = self._permutation(self.epoch)
