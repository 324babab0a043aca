"""`TrainerGroup`: W FSDP2 trainer ranks as Ray actors, with the `Trainer` surface the run loop uses.

Each rank is a `TrainerRankActor` holding a `sao.train.rank.RankTrainer` in one torch.distributed world
(gloo on CPU, NCCL on GPU; rank 0's node hosts the rendezvous). A step hands every rank the whole batch
(one object in Ray's store) and the indices of its own trajectories: whole groups, token-balanced
(`sao.train.split.shard_indices`). The ranks compute the single-process update (loss denominators over the
whole batch, summed gradients, the same number of micro-batches everywhere, the estimator's state updated
with the whole batch), and rank 0 returns the metrics.

The driver keeps a mirror of the advantage estimator's state (sent by rank 0 after every step) so that
prompt priorities (SPO) are computed locally, without a remote call per sampled prompt.

Weights leave the ranks directly: `full_state_ref` (every rank takes part in the gather; rank 0 puts the
full state into Ray's object store and returns the reference), `broadcast` (rank 0 sends over the weight
group it joined with `join_sync_group`), `write_weights` (rank 0 writes a directory).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sao.types import Batch

from .args import ComputeArgs

__all__ = ["TrainerGroup", "TrainerGroupArgs", "TrainerRankActor"]


@dataclass(frozen=True)
class TrainerGroupArgs:
    """What each rank builds its trainer from (the trainer factory's sections plus the model source).

    ``compute``: how the ranks hold and compute the actor and the critic (`ComputeArgs`: compute and master
    dtypes, device, attention kernel, activation checkpointing), the trainer's, not the engine's.
    ``push_dtype``: the engines' weight dtype (`sao.runtime.weight_sync.push_dtype`), which rank 0 casts the
    full weights to before they leave it (object store, broadcast, update directory); None: as held."""

    actor_dir: str
    critic_dir: str | None
    trainer: Any  # sao.train.settings.TrainerArgs
    compute: ComputeArgs
    threads: int
    head_init: str
    push_dtype: Any = None  # torch.dtype | None


class TrainerRankActor:
    """One trainer rank (the actor body; ``ray.remote`` is applied by `TrainerGroup.create`)."""

    def __init__(
        self, rank: int, world_size: int, threads: int, logging: dict[str, Any] | None = None
    ) -> None:
        import torch

        from .ray_engine import apply_logging

        apply_logging(logging)
        torch.set_num_threads(threads)
        self.rank, self.world_size = rank, world_size
        self.trainer: Any = None
        self._sync: Any = None
        self._push_dtype: Any = None

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0: the address and a free port of its node for the process group."""
        import ray

        from sao.engine.server_process import free_port

        return ray.util.get_node_ip_address(), free_port()

    def setup(self, host: str, port: int, args: TrainerGroupArgs) -> dict[str, Any]:
        import functools

        import torch
        import torch.distributed as dist

        from sao.models.prepare import prepare_for_training
        from sao.train.rank import RankTrainer

        compute = args.compute
        self._push_dtype = args.push_dtype
        backend = "nccl" if torch.cuda.is_available() and compute.device != "cpu" else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(0)  # Ray sets CUDA_VISIBLE_DEVICES to this rank's GPU
        dist.init_process_group(
            backend, init_method=f"tcp://{host}:{port}", rank=self.rank, world_size=self.world_size
        )
        t = args.trainer
        self.trainer = RankTrainer(
            args.actor_dir, args.critic_dir, t, dtype=compute.dtype, master_dtype=compute.master_dtype,
            device=compute.device, head_init=args.head_init, seed=t.seed,
            prepare=functools.partial(prepare_for_training, compute=compute),
        )  # fmt: skip
        return {"rank": self.rank, "pid": os.getpid(), "backend": backend}

    def train_step(
        self, batch: Batch, indices: list[int], policy_version: int, capture: bool = False
    ) -> dict[str, Any]:
        metrics = self.trainer.train_step(batch, indices, policy_version=policy_version, capture=capture)
        if self.rank != 0:
            return {}
        out = {"metrics": metrics, "state": self.trainer.state_dict()}
        if capture:
            out["capture"] = self.trainer.trainer.last_capture
        return out

    def state_dict(self) -> dict[str, Any]:
        return self.trainer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.trainer.load_state_dict(state)

    def pretrain_value(self, corpus: list[Any], options: Any) -> Any:
        return self.trainer.pretrain_value(corpus, options)

    def _pushed_state(self) -> Any:
        """Every rank gathers; rank 0 gets the full actor state in the engines' dtype, the others None."""
        from sao.engine.weights import cast_state_dict

        state = self.trainer.full_actor_state()
        return None if state is None else cast_state_dict(state, self._push_dtype)

    def full_state(self) -> Any:
        """Every rank gathers; rank 0 returns the full actor state dict (CPU, in the engines' dtype), the
        others None."""
        return self._pushed_state()

    def score(self, token_ids: list[int]) -> list[float]:
        """Every rank forwards (the actor is sharded); teacher-forced log-probs of ``token_ids[1:]`` under
        the trainer's current weights (`sao.runtime.push_check.trainer_score`), the same on every rank."""
        from .push_check import trainer_score

        return trainer_score(self.trainer.actor, token_ids)

    def checksum(self) -> dict[str, float] | None:
        from .ray_engine import state_checksum

        state = self.trainer.full_actor_state()
        return None if state is None else state_checksum(state)

    def join_sync_group(self, host: str, port: int, world_size: int, backend: str, timeout_s: float) -> None:
        from sao.engine.weight_broadcast import open_sync_group

        if self.rank == 0:
            self._sync = open_sync_group(host, port, 0, world_size, backend=backend, timeout_s=timeout_s)

    def broadcast(self, version: int, bucket_bytes: int | None = None) -> None:
        """All ranks gather the full weights; rank 0 sends them over the weight group, in buckets of
        ``bucket_bytes`` (None: `WeightSender`'s default)."""
        from sao.engine.weight_broadcast import DEFAULT_BUCKET_BYTES, WeightSender

        state = self._pushed_state()
        if self.rank == 0:
            if self._sync is None:
                raise RuntimeError("broadcast before join_sync_group")
            WeightSender(self._sync, bucket_bytes or DEFAULT_BUCKET_BYTES).send(state, version)

    def leave_sync_group(self) -> None:
        if self._sync is not None:
            self._sync.close()
        self._sync = None

    def write_weights(self, directory: str, config_from: str | None = None) -> str | None:
        """All ranks gather; rank 0 writes the full actor state as a safetensors checkpoint directory
        (engine names, experts unfused, ``config.json`` beside them; `write_update_dir`)."""
        from sao.engine.weights import write_update_dir

        state = self._pushed_state()
        if self.rank != 0:
            return None
        return str(write_update_dir(state, directory, config_from=config_from))

    def save(self, directory: str) -> None:
        self.trainer.save(directory)

    def load(self, directory: str) -> None:
        self.trainer.load(directory)

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class TrainerGroup:
    """The driver's handle on the trainer ranks (module docstring); the `Trainer` surface of the run."""

    def __init__(self, ranks: list[Any], args: TrainerGroupArgs) -> None:
        self.ranks, self.args = ranks, args
        self._estimator = args.trainer.estimator.build()
        self._adv_state = self._estimator.make_state()
        self.step = 0
        self.uses_critic = bool(self._estimator.uses_critic)
        self.last_capture: Any = None  # rank 0's StepCapture of the last step that captured

    @classmethod
    def create(cls, cluster: Any, args: TrainerGroupArgs, bundles: list[int] | None = None) -> TrainerGroup:
        """Start the ranks in their bundles (default: the cluster's trainer bundles, one rank each), form
        the process group, build each rank's trainer."""
        import ray

        remote = ray.remote(TrainerRankActor)
        from .ray_engine import logging_settings

        quiet = logging_settings()
        bundles = list(range(cluster.cfg.trainer_workers)) if bundles is None else bundles
        world = len(bundles)
        ranks = [
            cluster.track(remote.options(**cluster.trainer_options(b)).remote(r, world, args.threads, quiet))
            for r, b in enumerate(bundles)
        ]
        group = cls(ranks, args)
        host, port = group._get(ranks[0].rendezvous.remote())
        group._get([rank.setup.remote(host, port, args) for rank in ranks])
        return group

    def _get(self, refs: Any, timeout: float | None = None) -> Any:
        import ray

        return ray.get(refs, timeout=timeout)

    def _all(self, method: str, *args: Any) -> list[Any]:
        return self._get([getattr(rank, method).remote(*args) for rank in self.ranks])

    # ---- the Trainer surface ------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def prioritizes_prompts(self) -> bool:
        return bool(self._estimator.prioritizes_prompts)

    def sampling_weights(self, prompt_ids: list[str]) -> list[float] | None:
        weights = self._estimator.sampling_weights(self._adv_state, prompt_ids)
        return None if weights is None else weights.tolist()

    def train_step(self, batch: Batch, *, policy_version: int, capture: bool = False) -> dict[str, float]:
        """One step on every rank (the batch sharded by trajectory); rank 0's metrics, and with ``capture``
        its `StepCapture` in ``last_capture`` (the whole batch's: every rank has it)."""
        import ray

        from sao.train.split import shard_indices

        lengths = batch.seq_lengths.tolist()
        shards = shard_indices(list(batch.group_ids), lengths, self.world_size)
        ref = ray.put(batch)
        pairs = zip(self.ranks, shards, strict=True)
        calls = [rank.train_step.remote(ref, shard, policy_version, capture) for rank, shard in pairs]
        out = self._get(calls)[0]
        self.last_capture = out.get("capture")
        self._mirror(out["state"])
        metrics = dict(out["metrics"])
        metrics["trainer/world_size"] = float(self.world_size)
        sizes = [sum(lengths[i] for i in shard) for shard in shards]
        metrics["trainer/rank_tokens_max_frac"] = max(sizes) / max(sum(sizes), 1)
        return metrics

    def _mirror(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        if self._adv_state is not None and state.get("adv_state") is not None:
            self._adv_state.load_state_dict(state["adv_state"])

    def state_dict(self) -> dict[str, Any]:
        """The trainers' own state (counters, schedulers, estimator; identical on every rank): rank 0's."""
        return self._get(self.ranks[0].state_dict.remote())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._all("load_state_dict", state)
        self._mirror(state)

    # ---- weights, checkpoints -------------------------------------------------------------------------

    def pretrain_value(self, corpus: list[Any], options: Any) -> Any:
        """Value pretraining on the sharded critic, each rank forwarding its share of every batch (the
        same update, EV curve and stop as one process; `RankTrainer.pretrain_value`)."""
        return self._all("pretrain_value", corpus, options)[0]

    def full_state_ref(self) -> Any:
        """A reference to the full actor state in Ray's object store (rank 0's; the data stays there)."""
        refs = [rank.full_state.remote() for rank in self.ranks]  # every rank gathers; rank 0 holds it
        return refs[0]

    def score(self, token_ids: list[int]) -> list[float]:
        """Teacher-forced log-probs of ``token_ids[1:]`` under the actor's current weights (every rank
        takes part in the sharded forward; rank 0's answer)."""
        return self._all("score", list(token_ids))[0]

    def checksum(self) -> dict[str, float]:
        """`state_checksum` of the full actor weights (rank 0's gather)."""
        return self._all("checksum")[0]

    def sync_rendezvous(self) -> tuple[str, int]:
        """Address and free port of rank 0's node for the weight group."""
        return self._get(self.ranks[0].rendezvous.remote())

    def join_sync_group(self, host: str, port: int, world_size: int, backend: str, timeout_s: float) -> None:
        """Rank 0 joins the weight group as its rank 0 (blocks until every member joined)."""
        self._get(self.ranks[0].join_sync_group.remote(host, port, world_size, backend, timeout_s))

    def broadcast(self, version: int, bucket_bytes: int | None = None) -> None:
        """Every rank gathers the full weights; rank 0 broadcasts them over the weight group."""
        self._all("broadcast", version, bucket_bytes)

    async def leave_sync_group_async(self) -> None:
        await self.ranks[0].leave_sync_group.remote()

    def write_weights(self, directory: Path) -> str:
        """Rank 0 writes the full weights to ``directory`` (every rank gathers); returns the path."""
        return self._all("write_weights", str(directory), self.args.actor_dir)[0]

    def save(self, directory: Path) -> None:
        """Every rank writes its DCP shard under ``directory/dcp``; rank 0 also the HF ``actor/`` (and
        ``critic/``) directories."""
        self._all("save", str(directory))

    def load(self, directory: Path) -> None:
        """Load a checkpoint written by any number of ranks (DCP reshards)."""
        self._all("load", str(directory))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._get([rank.close.remote() for rank in self.ranks], timeout=30)
