"""The kept inspection records of a run on disk: ``RUN_DIR/inspect/step_<step:08d>.json.gz``, one file per
kept step, written atomically.

A file is ``{"format": "sao.inspect/1", "step": …, "meta": {…}, "trajectories": [record, …]}`` (records:
`sao.inspector.records`; ``meta``: the run's name and algorithm settings).

Bounded disk use: after each write, while the files add up to more than ``max_bytes``, the kept step whose
removal leaves the smallest gap between its neighbours is deleted (never the first or the newest), so what
stays is spread over the whole run at a coarser spacing.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path
from typing import Any

__all__ = ["FORMAT", "INSPECT_DIR", "InspectStore", "read_step_files", "step_files"]

FORMAT = "sao.inspect/1"
INSPECT_DIR = "inspect"
_NAME = re.compile(r"^step_(\d{8})\.json\.gz$")


def step_files(directory: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of the step files in ``directory``, by step."""
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return sorted(found)


class InspectStore:
    """Writes step files under ``run_dir/inspect`` within ``max_bytes`` (module docstring)."""

    def __init__(self, run_dir: str | os.PathLike[str], max_bytes: int, meta: dict[str, Any]) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be > 0, got {max_bytes}")
        self.directory = Path(run_dir) / INSPECT_DIR
        self.max_bytes, self.meta = max_bytes, meta
        self.thinned = 0  # step files deleted to stay within max_bytes

    def path_for(self, step: int) -> Path:
        return self.directory / f"step_{step:08d}.json.gz"

    def write(self, step: int, records: list[dict[str, Any]]) -> Path:
        """Write ``records`` as step ``step``'s file (replacing one already there), then thin."""
        self.directory.mkdir(parents=True, exist_ok=True)
        doc = {"format": FORMAT, "step": step, "meta": self.meta, "trajectories": records}
        data = gzip.compress(
            json.dumps(doc, allow_nan=False, separators=(",", ":")).encode(), compresslevel=6
        )
        path = self.path_for(step)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        self._thin()
        return path

    def rewind(self, step: int) -> None:
        """Delete the files of the steps after ``step`` (a resumed run trains them again)."""
        for kept, path in step_files(self.directory):
            if kept > step:
                path.unlink(missing_ok=True)

    def total_bytes(self) -> int:
        return sum(p.stat().st_size for _, p in step_files(self.directory))

    def _thin(self) -> None:
        files = step_files(self.directory)
        total = sum(p.stat().st_size for _, p in files)
        while total > self.max_bytes and len(files) > 2:
            # the interior step whose removal leaves the smallest gap between its neighbours (older on ties)
            i = min(range(1, len(files) - 1), key=lambda j: (files[j + 1][0] - files[j - 1][0], files[j][0]))
            _, path = files.pop(i)
            total -= path.stat().st_size
            path.unlink(missing_ok=True)
            self.thinned += 1


def read_step_files(run_dir: str | os.PathLike[str], step: int | None = None) -> list[dict[str, Any]]:
    """The step documents under ``run_dir/inspect`` (all, by step, or only ``step``'s). Raises
    FileNotFoundError when there are none (naming ``logging.inspect_every``), ValueError on a file of
    another format."""
    directory = Path(run_dir) / INSPECT_DIR
    files = step_files(directory)
    if step is not None:
        files = [f for f in files if f[0] == step]
        if not files:
            kept = ", ".join(str(s) for s, _ in step_files(directory)) or "none"
            raise FileNotFoundError(f"{directory}: no kept trajectories of step {step} (kept steps: {kept})")
    if not files:
        raise FileNotFoundError(
            f"{directory}: no kept trajectories (train with logging.inspect_every=N to keep some)"
        )
    docs = []
    for _, path in files:
        try:
            doc = json.loads(gzip.decompress(path.read_bytes()))
        except (OSError, EOFError, ValueError) as err:
            raise ValueError(f"{path}: not a readable inspection file ({err})") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"{path}: not an inspection file of format {FORMAT!r}")
        docs.append(doc)
    return docs
