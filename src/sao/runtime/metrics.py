"""Metric sinks: one JSON object per logged step, appended to ``RUN_DIR/metrics.jsonl``."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from torch import Tensor

__all__ = ["JsonlMetricsSink"]


def _plain(value: Any) -> Any:
    if isinstance(value, Tensor):
        value = value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else (1e308 if value > 0 else -1e308)
    return value


class JsonlMetricsSink:
    """Appends ``{"step": s, "time": t, **metrics}`` lines to a JSONL file (flushed per line)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, "time": time.time(), **{k: _plain(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> JsonlMetricsSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
