"""Sharded checkpoints of the FSDP trainer: torch.distributed.checkpoint (DCP) shards plus HF directories.

`save_sharded` writes, under a checkpoint directory,

- ``dcp/``: every rank's shard of the models' weights and the optimizers' states (DCP, keyed by parameter
  name: entries ``actor``, ``critic``, ``actor_optim``, ``critic_optim``);
- ``actor/`` and, with a critic, ``critic/``: the full weights as Hugging Face directories (rank 0), laid
  out as ``save_pretrained`` of the plain models writes them (`CriticModel.save_pretrained` is its token
  classification model's; MoE experts one tensor per expert, `sao.models.moe_names.save_unfused`), so
  `sao.train.checkpoint_load.load_checkpoint`, ``sao eval --model dir/actor``, the one-process runtime and
  the sharded loaders (`load_sharded_policy`, `load_sharded_critic`: a resume on ranks) read them.

`load_sharded` restores the shards on any number of ranks (DCP reshards: W' need not be the W that
wrote it); `load_plain` restores them into one process without a process group, exactly. An optimizer that
has not stepped yet has no state and none is saved: DCP would otherwise create one by a zero-gradient
step, which counts as AdamW's first step (the bias corrections would then differ from an uninterrupted run).

Owns: the weights and optimizer states on disk. Does not own: the trainer's own state (counters,
schedulers, estimator: the same on every rank, the driver writes it), atomic staging (the caller's
`CheckpointManager`), the tokenizer.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.optim import Optimizer

from sao.models.critic import CriticModel
from sao.models.moe_names import save_unfused
from sao.models.sharding import full_state_dict

__all__ = ["DCP_DIR", "has_sharded", "load_plain", "load_sharded", "save_sharded", "saved_entries"]

DCP_DIR = "dcp"
_CRITIC_PREFIX = "model."  # CriticModel's names are its token-classification model's, prefixed


def has_sharded(directory: str | Path) -> bool:
    """Whether ``directory`` holds DCP shards (``directory/dcp/.metadata``)."""
    return (Path(directory) / DCP_DIR / ".metadata").is_file()


def _entries(
    actor: nn.Module, critic: nn.Module | None, actor_optim: Optimizer | None, critic_optim: Optimizer | None
) -> dict[str, tuple[nn.Module, Optimizer | None]]:
    entries = {"actor": (actor, actor_optim)}
    if critic is not None:
        entries["critic"] = (critic, critic_optim)
    return entries


def save_sharded(
    directory: str | Path,
    actor: nn.Module,
    critic: nn.Module | None,
    actor_optim: Optimizer | None,
    critic_optim: Optimizer | None,
) -> None:
    """Write ``directory/dcp`` (every rank its shards) and the HF ``actor/`` (``critic/``) directories (rank
    0). A collective: every rank calls it with the same directory (on storage they all see)."""
    directory = Path(directory)
    state: dict[str, dict] = {}
    for name, (model, optim) in _entries(actor, critic, actor_optim, critic_optim).items():
        state[name] = get_model_state_dict(model)
        if optim is not None and optim.state:
            state[f"{name}_optim"] = get_optimizer_state_dict(model, optim)
    dcp.save(state, checkpoint_id=directory / DCP_DIR)
    actor_state = full_state_dict(actor)
    critic_state = full_state_dict(critic) if critic is not None else None
    if dist.get_rank() != 0:
        return
    save_unfused(actor, directory / "actor", actor_state)
    if critic is not None:
        assert critic_state is not None
        _save_critic(critic, critic_state, directory / "critic")


def _save_critic(critic: nn.Module, state: dict, path: Path) -> None:
    if not isinstance(critic, CriticModel):
        raise TypeError(f"the critic must be a CriticModel, got {type(critic).__name__}")
    inner = {k.removeprefix(_CRITIC_PREFIX): state.pop(k) for k in list(state)}  # save_unfused frees them
    save_unfused(critic.model, path, inner)


def saved_entries(directory: str | Path) -> set[str]:
    """What ``directory/dcp`` holds: ``actor``, ``critic``, and ``actor_optim`` / ``critic_optim`` for the
    optimizers that had stepped."""
    metadata = dcp.FileSystemReader(Path(directory) / DCP_DIR).read_metadata()
    return {key.split(".", 1)[0] for key in metadata.state_dict_metadata}


def _load(
    directory: str | Path,
    actor: nn.Module,
    critic: nn.Module | None,
    actor_optim: Optimizer | None,
    critic_optim: Optimizer | None,
    no_dist: bool,
) -> None:
    checkpoint = Path(directory) / DCP_DIR
    if not has_sharded(directory):
        raise FileNotFoundError(f"{str(checkpoint)!r} holds no DCP checkpoint (no .metadata)")
    saved = saved_entries(directory)
    entries = _entries(actor, critic, actor_optim, critic_optim)
    missing = sorted(set(entries) - saved)
    if missing:
        raise ValueError(f"{str(checkpoint)!r} has no {' or '.join(missing)} weights")
    state: dict[str, dict] = {}
    for name, (model, optim) in entries.items():
        state[name] = get_model_state_dict(model)
        if optim is not None and f"{name}_optim" in saved:  # absent: it had not stepped when saved
            state[f"{name}_optim"] = get_optimizer_state_dict(model, optim)
    with warnings.catch_warnings():  # DCP warns whenever it loads without a process group: here, on purpose
        warnings.filterwarnings(
            "ignore", message="torch.distributed is disabled, unavailable or uninitialized"
        )
        dcp.load(state, checkpoint_id=checkpoint, no_dist=no_dist)
    for name, (model, optim) in entries.items():
        set_model_state_dict(model, state[name])
        if optim is not None and f"{name}_optim" in state:
            set_optimizer_state_dict(model, optim, state[f"{name}_optim"])


def load_sharded(
    directory: str | Path,
    actor: nn.Module,
    critic: nn.Module | None,
    actor_optim: Optimizer | None = None,
    critic_optim: Optimizer | None = None,
) -> None:
    """Restore the weights (and the optimizers' states, when given and saved) from ``directory/dcp`` into
    sharded models on any number of ranks. A collective: every rank calls it."""
    _load(directory, actor, critic, actor_optim, critic_optim, no_dist=False)


def load_plain(
    directory: str | Path,
    actor: nn.Module,
    critic: nn.Module | None,
    actor_optim: Optimizer | None = None,
    critic_optim: Optimizer | None = None,
) -> None:
    """`load_sharded` into plain (unsharded) models in this one process, without a process group: the
    full weights and optimizer states, exactly as the ranks held them."""
    _load(directory, actor, critic, actor_optim, critic_optim, no_dist=True)
