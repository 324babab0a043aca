"""Run checkpoints: written atomically, found robustly, restored exactly (invariant 6 of docs/concepts.md).

A checkpoint is ``run_dir/checkpoints/step_{step:08d}/`` holding

- ``actor/``: the policy as an HF checkpoint (``save_pretrained``, safetensors),
- ``critic/``: the critic's ``save_pretrained`` directory, when there is a critic,
- ``dcp/``: with a sharded trainer (``runtime.backend=ray``), the model and optimizer shards of every rank
  (torch.distributed.checkpoint, `sao.train.dcp`; its ``actor/`` / ``critic/`` are then the full weights
  written by rank 0, and ``trainer_state.pt`` holds no optimizer state),
- ``trainer_state.pt``: whatever the trainer needs to continue (optimizer, scheduler, baseline state …),
- ``rng.pt``: python ``random``, numpy, torch CPU and CUDA generator states,
- ``meta.json``: step, policy version, data position, trajectory counters, config snapshot, versions, time.

It is built in a hidden sibling staging directory, every file fsynced, then renamed into place: a
directory named ``step_*`` is always complete. The ``latest`` file then names it (written to a temp file
and ``os.replace``d), and old checkpoints beyond ``keep_last`` are pruned. One writer per run is assumed;
any number of readers may look at the same time.

Killed at any moment (SIGKILL, even mid-save), a run leaves at worst hidden leftovers beside its
checkpoints: a staging directory (``.step_N.tmp-*``), a checkpoint being replaced or pruned
(``.step_N.old-*``, ``.step_N.del-*``), a pointer temp file (``.latest.tmp-*``). Readers never see them
(`latest`, `checkpoints`); the writer removes them with `CheckpointManager.clean_partial` on resume and
after every save. A checkpoint is committed once ``latest`` names it: one renamed into place whose pointer
update was cut off is complete, yet `latest` returns the one the pointer names (the steps after it are
redone).

This module owns the on-disk format and the writing, finding and pruning; reading one checkpoint back is
`sao.train.checkpoint_load`. What goes into ``trainer_state`` and ``meta`` is the trainer's.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sao import __version__

from .checkpoint_load import FORMAT_VERSION, CheckpointError, LoadedCheckpoint, load_checkpoint
from .common import atomic_dir

__all__ = ["CheckpointManager", "capture_rng", "restore_rng"]

_STEP_DIR = re.compile(r"step_(\d{8,})")
_LATEST = "latest"


def capture_rng() -> dict[str, Any]:
    """The state of every generator a training step may draw from (torch.load(weights_only=True)-safe)."""
    np_state = np.random.get_state(legacy=False)
    states: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng(states: Mapping[str, Any]) -> None:
    """Set the generators to ``states`` (from `capture_rng` or `LoadedCheckpoint.rng`). CUDA states are
    restored when CUDA is available and the checkpoint has them for as many devices; else skipped."""
    random.setstate(_as_tuple(states["python"]))
    np_state = states["numpy"]
    np.random.set_state(
        {
            "bit_generator": np_state["bit_generator"],
            "state": {"key": np_state["key"].numpy().astype(np.uint32), "pos": int(np_state["pos"])},
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        }
    )
    torch.set_rng_state(states["torch"])
    cuda = states.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def _as_tuple(value: Any) -> Any:
    """``random.setstate`` wants nested tuples; a round trip through a checkpoint may give lists."""
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


class CheckpointManager:
    """Saves, finds, loads and prunes the checkpoints of one run under ``run_dir/checkpoints``."""

    def __init__(self, run_dir: str | Path, keep_last: int = 3) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.run_dir = Path(run_dir)
        self.root = self.run_dir / "checkpoints"
        self.keep_last = keep_last

    # ---- writing -----------------------------------------------------------------------------------

    def save(
        self,
        step: int,
        *,
        actor: Any = None,
        critic: Any | None = None,
        write_models: Callable[[Path], None] | None = None,
        has_critic: bool | None = None,
        tokenizer: Any | None = None,
        trainer_state: Mapping[str, Any],
        policy_version: int | None = None,
        data_position: Mapping[str, Any] | None = None,
        counters: Mapping[str, Any] | None = None,
        config: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Path:
        """Write checkpoint ``step`` atomically, point ``latest`` at it, prune; returns its directory.

        ``actor`` / ``critic`` need ``save_pretrained(dir)``; a ``tokenizer`` is saved beside the actor so
        ``actor/`` is a complete checkpoint (``sao eval --model .../actor``). A sharded trainer passes
        ``write_models(stage)`` instead, which writes ``actor/`` (and ``critic/``, then ``has_critic``) and
        its shards into the staging directory (every rank has returned when it returns).
        ``trainer_state`` goes to ``torch.save`` (keep it to tensors, numbers, strings, lists, dicts: it is
        loaded with ``weights_only=True``).
        ``data_position`` (sampler cursor/epoch/seed), ``counters`` (produced/trained/dropped …),
        ``config`` and ``extra`` go to ``meta.json`` and must be JSON-serialisable. If anything fails,
        no checkpoint directory appears and ``latest`` is unchanged.
        """
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        if (actor is None) == (write_models is None):
            raise ValueError("pass exactly one of actor and write_models")
        meta = {
            "step": int(step),
            "policy_version": policy_version,
            "data_position": dict(data_position or {}),
            "counters": dict(counters or {}),
            "config": dict(config or {}),
            "extra": dict(extra or {}),
            "has_critic": critic is not None if has_critic is None else has_critic,
        }
        meta_text = _meta_text(meta)  # fails before gigabytes of weights are written
        target = self.path_for(step)
        with atomic_dir(target) as stage:
            if write_models is not None:
                write_models(stage)
            else:
                actor.save_pretrained(stage / "actor")
            if tokenizer is not None:
                tokenizer.save_pretrained(stage / "actor")
            if critic is not None:
                critic.save_pretrained(stage / "critic")
            torch.save(dict(trainer_state), stage / "trainer_state.pt")
            torch.save(capture_rng(), stage / "rng.pt")
            (stage / "meta.json").write_text(meta_text)  # last: its presence marks a complete checkpoint
            _fsync_tree(stage)
        _fsync_dir(self.root)
        self._write_latest(target.name)
        self.prune(keep=target)
        return target

    def path_for(self, step: int) -> Path:
        """Where the checkpoint of ``step`` is (or would be) written."""
        return self.root / f"step_{step:08d}"

    def _write_latest(self, name: str) -> None:
        fd, tmp = tempfile.mkstemp(prefix=f".{_LATEST}.tmp-", dir=self.root)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(name + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.root / _LATEST)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _fsync_dir(self.root)

    def prune(self, keep: Path | None = None) -> list[Path]:
        """Delete all but the ``keep_last`` highest-step checkpoints (never ``keep`` nor the one ``latest``
        names) and leftovers of interrupted saves; returns the removed checkpoint directories.

        A pruned directory is first renamed to a hidden name, so `latest` never returns it; a reader that
        already opened files in it keeps reading them (POSIX unlink semantics)."""
        protected = {p.name for p in (keep, self._pointer_target()) if p is not None}
        removed = []
        self.clean_partial()
        for path in self.checkpoints()[: -self.keep_last]:
            if path.name in protected:
                continue
            doomed = path.with_name(f".{path.name}.del-{os.getpid()}-{time.monotonic_ns()}")
            try:
                path.rename(doomed)
            except OSError:  # already gone (another pruner) or busy: leave it for next time
                continue
            shutil.rmtree(doomed, ignore_errors=True)
            removed.append(path)
        return removed

    def clean_partial(self) -> list[Path]:
        """Remove what an interrupted save or prune left behind (see the module docstring); returns the
        removed paths.

        Only the run's one writer may call this (at resume, and `save` does after each checkpoint): a
        reader calling it while a save runs would delete that save's staging directory."""
        if not self.root.is_dir():
            return []
        removed = []
        for stale in [*self.root.glob(".step_*"), *self.root.glob(f".{_LATEST}.tmp-*")]:
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)
            removed.append(stale)
        return removed

    # ---- finding -----------------------------------------------------------------------------------

    def checkpoints(self) -> list[Path]:
        """Complete checkpoint directories (``step_*`` with a ``meta.json``), oldest step first."""
        if not self.root.is_dir():
            return []
        found = []
        for path in self.root.iterdir():
            match = _STEP_DIR.fullmatch(path.name)
            if match and (path / "meta.json").is_file():
                found.append((int(match.group(1)), path))
        return [path for _, path in sorted(found)]

    def _pointer_target(self) -> Path | None:
        try:
            name = (self.root / _LATEST).read_text().strip()
        except OSError:
            return None
        path = self.root / name
        if _STEP_DIR.fullmatch(name) and (path / "meta.json").is_file():
            return path
        return None

    def latest(self) -> Path | None:
        """The checkpoint ``latest`` names; if that file is missing or stale, the highest complete step;
        None when the run has no checkpoint. Staging and half-deleted directories are never returned."""
        pointed = self._pointer_target()
        if pointed is not None:
            return pointed
        found = self.checkpoints()
        return found[-1] if found else None

    # ---- reading -----------------------------------------------------------------------------------

    def load(self, path: str | Path | None = None) -> LoadedCheckpoint:
        """Read checkpoint ``path`` (default: `latest`). Raises `CheckpointError` naming the missing or
        corrupt file. RNG states are returned, not applied: call `restore_rng` when the run resumes."""
        if path is None:
            path = self.latest()
            if path is None:
                raise CheckpointError(f"no checkpoint under {str(self.root)!r}")
        return load_checkpoint(path)


def _meta_text(meta: dict[str, Any]) -> str:
    """``meta.json`` of a checkpoint: ``meta`` plus the format, versions and time; TypeError naming the
    step when a value is not JSON-serialisable."""
    meta = {
        "format": FORMAT_VERSION,
        **meta,
        "sao_version": __version__,
        "torch_version": torch.__version__,
        "timestamp": time.time(),
    }
    try:
        return json.dumps(meta, indent=2, sort_keys=True)
    except (TypeError, ValueError) as err:
        raise TypeError(f"checkpoint meta for step {meta['step']} is not JSON-serialisable: {err}") from None


def _fsync_tree(root: Path) -> None:
    """fsync every file, then every directory (deepest first), so the rename publishes durable data."""
    dirs = []
    for current, _, files in os.walk(root):
        dirs.append(current)
        for name in files:
            fd = os.open(os.path.join(current, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    for directory in reversed(dirs):
        _fsync_dir(Path(directory))


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
