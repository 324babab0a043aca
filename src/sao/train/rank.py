"""`RankTrainer`: what one FSDP trainer rank runs, in a torch.distributed world that is already initialised.

Each rank builds the actor, then the critic, straight into its FSDP2 shards (`load_sharded_policy`,
`load_sharded_critic`: the same weights as the one-process runtime's, but no rank ever holds a whole model),
and wraps them in the real `Trainer` with a `ProcessGroupCollective`, so a step is the single-process update
(`sao.train.step`, "Sharded"); value pretraining splits its corpus across the ranks the same way. The
methods that touch the models (`train_step`, `full_actor_state`, `save`, `load`, `pretrain_value`) are
collectives: every rank calls them in the same order, with the same arguments except ``indices``.

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

from sao.models.critic import CriticModel
from sao.models.freezing import apply_freeze
from sao.models.loading import resolve_device, resolve_dtype
from sao.models.precision import Precision, fsdp_policy
from sao.models.sharded_loading import Prepare, load_sharded_critic, load_sharded_policy
from sao.models.sharding import full_state_dict
from sao.types import Batch, Trajectory

from .collective import ProcessGroupCollective
from .common import set_seed
from .dcp import load_sharded, save_sharded
from .settings import TrainerArgs
from .step import Trainer
from .value_pretrain import ValuePretrainOptions, ValuePretrainResult, pretrain_value

__all__ = ["RankTrainer"]


class RankTrainer:
    """One rank of a sharded trainer.

    Args:
        actor_dir: the policy checkpoint. critic_dir: a saved critic, or None for a new one from
            ``actor_dir`` (a new value head; ``head_init`` as `load_critic`); ignored by critic-free presets.
        args: the trainer's settings, as `Trainer`.
        dtype: the compute dtype of forward and backward (`resolve_dtype`: ``"auto"`` is bfloat16 on CUDA,
            float32 on the CPU). master_dtype: the weights' dtype (and so the gradients', their reduction's
            and AdamW's); None: ``dtype`` (one dtype throughout). When they differ and ``mp_policy`` is
            None, FSDP computes in ``dtype`` and reduces gradients in float32
            (`sao.models.precision.fsdp_policy`).
        device: as `resolve_device` (``"cuda"``: the current CUDA device).
        head_init: a new critic head's initialisation. seed: seeds the generators before loading, so a
            randomly initialised head is the same on every rank.
        mesh, mp_policy: as `shard_model`.
        prepare: called on each model (the critic's inner HF model) before it is sharded: activation
            checkpointing, the attention kernel. None: packed sdpa attention only (what the loaders set).
    """

    def __init__(
        self,
        actor_dir: str | os.PathLike[str],
        critic_dir: str | os.PathLike[str] | None,
        args: TrainerArgs,
        *,
        dtype: str | torch.dtype = "auto",
        master_dtype: str | torch.dtype | None = None,
        device: str | torch.device = "auto",
        head_init: Literal["zero", "normal"] = "zero",
        seed: int = 0,
        mesh: DeviceMesh | None = None,
        mp_policy: MixedPrecisionPolicy | None = None,
        prepare: Prepare | None = None,
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError("RankTrainer needs torch.distributed to be initialised")
        target = resolve_device(device)
        compute = resolve_dtype(dtype, target)
        precision = Precision.resolve(compute, compute if master_dtype is None else master_dtype, target)
        master = precision.master
        if mp_policy is None:
            mp_policy = fsdp_policy(precision)
        set_seed(seed)
        # The actor is sharded before the critic exists: a rank never holds more than its shards of both.
        self.actor = load_sharded_policy(
            actor_dir, mesh=mesh, mp_policy=mp_policy, device=target, master_dtype=master, prepare=prepare
        )
        self.critic: CriticModel | None = None
        if args.estimator.uses_critic:
            source = critic_dir if critic_dir is not None else actor_dir
            self.critic = load_sharded_critic(
                source, mesh=mesh, mp_policy=mp_policy, device=target, master_dtype=master,
                head_init=head_init, prepare=prepare,
            )  # fmt: skip
        self.collective = ProcessGroupCollective()
        self.trainer = Trainer(self.actor, self.critic, args, collective=self.collective)

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
        """`sao.train.value_pretrain.pretrain_value` on the sharded critic, the corpus split across the ranks.

        Every rank gets the whole corpus (the same on every rank) and trains on its share of each batch,
        with gradients summed over the ranks: the single-process update, and the same EV curve and
        stopping decision on every rank. As in the one-process runtime, pretraining trains every critic
        parameter; the RL freezing (``critic.freeze``) is re-applied afterwards."""
        if self.critic is None:
            raise ValueError("value pretraining needs a critic; this preset has none")
        inner = self.critic.model
        apply_freeze(inner, "none")
        try:
            console = Console(stderr=True, quiet=self.rank != 0)
            return pretrain_value(self.critic, corpus, options, None, console, collective=self.collective)
        finally:
            apply_freeze(inner, self.trainer.args.critic.freeze)
            for param in self.critic.parameters():  # pretraining's last gradients: no use to RL
                param.grad = None
