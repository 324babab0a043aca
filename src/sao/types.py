"""Core data types, re-exported for ``from sao.types import ...``.

`Trajectory` (one episode) lives in `sao.trajectory`; the packed `Batch` and `PaddedBatch` in `sao.batch`.
"""

from sao.batch import Batch, BatchError, PaddedBatch
from sao.trajectory import Trajectory, TrajectoryError, load_jsonl, save_jsonl

__all__ = ["Batch", "BatchError", "PaddedBatch", "Trajectory", "TrajectoryError", "load_jsonl", "save_jsonl"]
