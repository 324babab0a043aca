"""Reading one run checkpoint back (the format: `sao.train.checkpoint`): every file checked before anything
is returned, an incomplete or corrupt checkpoint refused with a `CheckpointError` that names the file.

Owns: reading and validating a checkpoint directory. Does not own: writing, finding or pruning checkpoints
(`sao.train.checkpoint.CheckpointManager`), nor loading the models (`load_policy` / `load_critic`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = ["FORMAT_VERSION", "CheckpointError", "LoadedCheckpoint", "load_checkpoint"]

FORMAT_VERSION = 1  # of meta.json; a checkpoint of a newer format is refused


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or unreadable; the message names the file."""


@dataclass(frozen=True)
class LoadedCheckpoint:
    """What `CheckpointManager.load` read back. Models are not loaded: pass ``actor_dir`` / ``critic_dir``
    to `load_policy` / `load_critic` (with the run's dtype and device). Restore order that reproduces an
    uninterrupted run: models, optimizer *and* scheduler constructed, then optimizer state, scheduler state,
    estimator state, and `restore_rng` last (a scheduler's constructor rewrites the optimizer's lrs)."""

    path: Path
    meta: dict[str, Any]
    trainer_state: dict[str, Any]
    rng: dict[str, Any]
    actor_dir: Path
    critic_dir: Path | None

    @property
    def step(self) -> int:
        return int(self.meta["step"])

    @property
    def policy_version(self) -> int | None:
        return self.meta.get("policy_version")

    @property
    def data_position(self) -> dict[str, Any]:
        return self.meta.get("data_position", {})

    @property
    def counters(self) -> dict[str, Any]:
        return self.meta.get("counters", {})


def load_checkpoint(path: str | Path) -> LoadedCheckpoint:
    """Read one checkpoint directory; see `CheckpointManager.load`."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory {str(path)!r} does not exist")
    meta_file = path / "meta.json"
    try:
        meta = json.loads(meta_file.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"incomplete checkpoint: {str(meta_file)!r} is missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"corrupt checkpoint file {str(meta_file)!r}: {err}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("step"), int):
        raise CheckpointError(f"corrupt checkpoint file {str(meta_file)!r}: no integer 'step'")
    if meta.get("format", FORMAT_VERSION) > FORMAT_VERSION:
        raise CheckpointError(
            f"{str(meta_file)!r} has checkpoint format {meta['format']}, this sao reads <= {FORMAT_VERSION}"
        )
    actor_dir = path / "actor"
    if not (actor_dir / "config.json").is_file():
        raise CheckpointError(f"incomplete checkpoint: {str(actor_dir / 'config.json')!r} is missing")
    critic_dir = path / "critic"
    if meta.get("has_critic") and not (critic_dir / "config.json").is_file():
        raise CheckpointError(f"incomplete checkpoint: {str(critic_dir / 'config.json')!r} is missing")
    return LoadedCheckpoint(
        path=path,
        meta=meta,
        trainer_state=_torch_load(path / "trainer_state.pt"),
        rng=_torch_load(path / "rng.pt"),
        actor_dir=actor_dir,
        critic_dir=critic_dir if critic_dir.is_dir() else None,
    )


def _torch_load(file: Path) -> dict[str, Any]:
    if not file.is_file():
        raise CheckpointError(f"incomplete checkpoint: {str(file)!r} is missing")
    try:
        value = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for a truncated or foreign file
        raise CheckpointError(f"corrupt checkpoint file {str(file)!r}: {type(err).__name__}: {err}") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"corrupt checkpoint file {str(file)!r}: expected a dict, got {type(value)}")
    return value
