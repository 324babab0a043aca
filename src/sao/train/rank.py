"""`RankTrainer`: what one FSDP trainer rank runs, in a torch.distributed world that is already initialised.

Each rank loads the actor (and critic) as the one-process runtime does, shards them (`shard_model`), and
wraps them in the real `Trainer` with a `ProcessGroupCollective`, so a step is the single-process update
(`sao.train.step`, "Sharded"). The methods that touch the models (`train_step`, `full_actor_state`, `save`,
`load`, `pretrain_value`) are collectives: every rank calls them in the same order, with the same arguments
except ``indices``.

Owns: the rank's models and trainer. Does not own: the process group (its creator initialises and destroys
it), the assignment of trajectories to ranks (`sao.train.split.shard_indices`, the driver's), the trainer
state on disk (the driver saves `state_dict`; `save` writes only weights and optimizer states).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.distributed as dist
from rich.console import Console
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy

from sao.config import AlgoConfig, CriticConfig, TrainerConfig
from sao.models.attention import enable_packed_attention
from sao.models.critic import CriticModel, load_critic
from sao.models.freezing import apply_freeze
from sao.models.loading import load_policy
from sao.models.sharding import full_state_dict, set_gradient_reduction, shard_model
from sao.types import Batch, Trajectory

from .collective import ProcessGroupCollective
from .common import set_seed
from .dcp import load_sharded, save_sharded
from .step import Trainer
from .value_pretrain import ValuePretrainOptions, ValuePretrainResult, pretrain_value

__all__ = ["RankTrainer"]


class RankTrainer:
    """One rank of a sharded trainer.

    Args:
        actor_dir: the policy checkpoint. critic_dir: a saved critic, or None for a new one from
            ``actor_dir`` (a new value head; ``head_init`` as `load_critic`); ignored by critic-free presets.
        algo, critic_cfg, optim, temperature: as `Trainer`.
        dtype, device: as `load_policy` (``device="cuda"``: the current CUDA device).
        head_init: a new critic head's initialisation. seed: seeds the generators before loading, so a
            randomly initialised head is the same on every rank.
        mesh, mp_policy: as `shard_model`.
    """

    def __init__(
        self,
        actor_dir: str | os.PathLike[str],
        critic_dir: str | os.PathLike[str] | None,
        algo: AlgoConfig,
        critic_cfg: CriticConfig,
        optim: TrainerConfig,
        *,
        temperature: float = 1.0,
        dtype: str | torch.dtype = "auto",
        device: str | torch.device = "auto",
        head_init: Literal["zero", "normal"] = "zero",
        seed: int = 0,
        mesh: DeviceMesh | None = None,
        mp_policy: MixedPrecisionPolicy | None = None,
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError("RankTrainer needs torch.distributed to be initialised")
        set_seed(seed)
        actor = enable_packed_attention(load_policy(actor_dir, dtype=dtype, device=device))
        critic: CriticModel | None = None
        if algo.uses_critic:
            source = critic_dir if critic_dir is not None else actor_dir
            critic = load_critic(source, freeze="none", dtype=dtype, device=device, head_init=head_init)
        self.actor = shard_model(actor, mesh=mesh, mp_policy=mp_policy)
        self.critic = shard_model(critic, mesh=mesh, mp_policy=mp_policy) if critic is not None else None
        self.collective = ProcessGroupCollective()
        self.trainer = Trainer(
            self.actor,
            self.critic,
            algo,
            critic_cfg,
            optim,
            temperature=temperature,
            collective=self.collective,
        )

    @property
    def rank(self) -> int:
        return self.collective.rank

    @property
    def world_size(self) -> int:
        return self.collective.world_size

    def train_step(
        self, batch: Batch, indices: Sequence[int], policy_version: int, capture: bool = False
    ) -> dict[str, float]:
        """One trainer step: ``batch`` whole (the same on every rank), ``indices`` this rank's trajectories
        (the ranks' indices partition the batch). Returns the whole batch's metrics (the same everywhere).
        ``capture``: keep the per-token quantities in ``trainer.last_capture`` (the same on every rank)."""
        return self.trainer.train_step(
            batch, policy_version=policy_version, shard=list(indices), capture=capture
        )

    def state_dict(self) -> dict[str, Any]:
        """The trainer's state without the optimizers (those are in `save`): the same on every rank."""
        return self.trainer.state_dict(optimizers=False)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.trainer.load_state_dict(state)

    def full_actor_state(self) -> dict[str, Tensor] | None:
        """The actor's full weights (CPU) on rank 0, None on the others (every rank must call it)."""
        state = full_state_dict(self.actor)
        return state if self.rank == 0 else None

    def save(self, directory: str | os.PathLike[str]) -> None:
        """Weights and optimizer states: ``directory/dcp`` (all ranks), ``actor/``, ``critic/`` (rank 0)."""
        t = self.trainer
        save_sharded(directory, self.actor, self.critic, t.actor_optim, t.critic_optim)

    def load(self, directory: str | os.PathLike[str]) -> None:
        """Restore `save`'s weights and optimizer states, written by any number of ranks (then the driver
        restores `load_state_dict`)."""
        t = self.trainer
        load_sharded(directory, self.actor, self.critic, t.actor_optim, t.critic_optim)

    def pretrain_value(self, corpus: list[Trajectory], options: ValuePretrainOptions) -> ValuePretrainResult:
        """`sao.train.value_pretrain.pretrain_value` on the sharded critic, every rank with the whole corpus.

        Every rank computes the whole gradient, so the gradients are averaged for the duration (FSDP's mean
        of equal gradients is the single-process one). As in the one-process runtime, pretraining trains
        every critic parameter; the RL freezing (``critic.freeze``) is re-applied afterwards."""
        if self.critic is None:
            raise ValueError("value pretraining needs a critic; this preset has none")
        inner = self.critic.model
        apply_freeze(inner, "none")
        set_gradient_reduction(self.critic, "mean")
        try:
            console = Console(stderr=True, quiet=self.rank != 0)
            return pretrain_value(self.critic, corpus, options, None, console)
        finally:
            set_gradient_reduction(self.critic, "sum")
            apply_freeze(inner, self.trainer.critic_cfg.freeze)
            for param in self.critic.parameters():  # pretraining's last gradients: no use to RL
                param.grad = None
