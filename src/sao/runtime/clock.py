"""Where training stands: the policy version, the trainer's steps and the trajectories trained so far.

The run owns one `TrainingClock` and advances it after every trainer step; the producer reads it through
the small `VersionProvider` protocol (the version a new trajectory is checked against, the training
progress handed to environments that follow it). Nothing else keeps its own copy of the version.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from sao.envs.base import TrainingProgress

__all__ = ["TrainingClock", "VersionProvider"]


@runtime_checkable
class VersionProvider(Protocol):
    """The policy version now (the version of the weights the engine was last given)."""

    def get_version(self) -> int: ...


@dataclass
class TrainingClock:
    """``version``: policy version (trainer steps that changed the weights, plus any restored offset);
    ``step``: trainer steps done; ``trained``: trajectories trained so far. Single writer: the run."""

    version: int = 0
    step: int = 0
    trained: int = 0

    def get_version(self) -> int:
        return self.version

    def progress(self) -> TrainingProgress:
        """The plain-data snapshot environments receive (`sao.envs.base.TrainingProgress`)."""
        return TrainingProgress(step=self.step, trained_trajectories=self.trained)

    def advance(self, trajectories: int) -> None:
        """One trainer step on ``trajectories`` trajectories; the new weights are version + 1."""
        self.version += 1
        self.step += 1
        self.trained += trajectories
