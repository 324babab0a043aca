"""Why a run stopped before its step budget, when it can stop cleanly (with a checkpoint to resume from)."""

from __future__ import annotations

__all__ = ["EngineFailedError", "NothingTrainableError", "RunStopped"]


class RunStopped(RuntimeError):  # noqa: N818 (a stop, not an error of the run's code)
    """The run stopped early and cleanly: a checkpoint of its last trained step was written; the message says
    why and what to do. ``checkpoint`` is that checkpoint's directory (None if none could be written)."""

    def __init__(self, message: str, checkpoint: object = None) -> None:
        super().__init__(message)
        self.checkpoint = checkpoint


class EngineFailedError(RuntimeError):
    """The rollout engine kept dying: restarts exhausted (``engine.max_restarts``)."""


class NothingTrainableError(RuntimeError):
    """Every episode fails: ``runtime.max_consecutive_drops`` episodes in a row yielded no trajectory."""
