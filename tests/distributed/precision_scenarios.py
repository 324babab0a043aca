"""What `test_mixed_precision` runs: the sharded trainer with bf16 compute and float32 master weights on 2
gloo ranks (`run_ranks`, spawned once per module), and the same steps in one plain process with
`cast_for_compute` (`reference_steps`).

Both build the models as the runtime does: float32 weights, `prepare_for_training` (packed sdpa, activation
checkpointing on), then bf16 compute (FSDP2's `MixedPrecisionPolicy(bf16, fp32)` on the ranks,
`cast_for_compute` in one process). The tiny dense Qwen3 (GQA) with a critic (``algo=sao``); micro-batches of
40 tokens, so each rank has several per step and the gradient reduce-scatter is deferred to the last one.
Results: full CPU state dicts, the actor's gradients after each step, metrics, and the reduce-scatters FSDP
issued (count and dtypes) per step.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import functools
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sao.config import load_config
from sao.models.critic import load_critic
from sao.models.forward import token_logprobs
from sao.models.loading import load_policy
from sao.models.precision import Precision, cast_for_compute
from sao.models.prepare import checkpointing_enabled, prepare_for_training
from sao.runtime.args import ComputeArgs
from sao.runtime.build import FACTORIES
from sao.train.common import set_seed
from sao.train.split import shard_indices
from sao.train.step import Trainer
from sao.types import Batch

from .fsdp_scenarios import free_port, trajectories

WORLD = 2
MICRO_BATCH_TOKENS = 40
COMPUTE = ComputeArgs(dtype="bfloat16", master_dtype="float32", device="cpu", attn_implementation="sdpa",
                      gradient_checkpointing=True)  # fmt: skip
PRECISION = Precision.resolve(COMPUTE.dtype, COMPUTE.master_dtype, COMPUTE.device)
LENGTHS = [[24, 12, 30, 9, 17, 20], [14, 26, 10, 33, 19, 8]]


def config() -> Any:
    return load_config(
        overrides=[
            "algo=sao", "model.tiny_arch=qwen3", "model.dtype=bfloat16", "model.master_dtype=float32",
            "model.device=cpu", "trainer.lr=1e-3", "critic.lr=1e-3",
            f"trainer.micro_batch_tokens={MICRO_BATCH_TOKENS}",
        ]
    )  # fmt: skip


def make_batches(model_dir: Path) -> list[Batch]:
    """The steps' batches, rollout log-probs from the initial float32 actor (on-policy)."""
    actor = load_policy(model_dir, dtype="float32", device="cpu")
    prepare_for_training(actor, COMPUTE)
    out = []
    for seed, lengths in enumerate(LENGTHS):
        batch = Batch.from_trajectories(trajectories(lengths, seed, grouped=True))
        with torch.no_grad():
            lp, _ = token_logprobs(actor, batch)
        batch.rollout_logprobs = torch.where(batch.action_mask, lp, torch.zeros_like(lp))
        out.append(batch)
    return out


def shards(batch: Batch) -> list[list[int]]:
    return shard_indices(list(batch.group_ids), batch.seq_lengths.tolist(), WORLD)


def _state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for name, param in module.named_parameters():
        if param.grad is not None:
            grad = param.grad.full_tensor() if hasattr(param.grad, "full_tensor") else param.grad
            out[name] = grad.detach().clone()
    return out


# ---- one process ------------------------------------------------------------------------------------------


def reference_steps(model_dir: Path, batches: list[Batch]) -> list[dict[str, Any]]:
    """The plain `Trainer` on float32 models computing in bf16 (`cast_for_compute`), seeded and loaded as
    `RankTrainer` loads them."""
    cfg = config()
    set_seed(0)
    actor = prepare_for_training(load_policy(model_dir, dtype=PRECISION.master, device="cpu"), COMPUTE)
    critic = load_critic(model_dir, freeze="none", dtype=PRECISION.master, device="cpu", head_init="normal")
    prepare_for_training(critic, COMPUTE)
    cast_for_compute(actor, PRECISION.compute)
    cast_for_compute(critic, PRECISION.compute)
    trainer = Trainer(actor, critic, FACTORIES["trainer"](cfg))
    steps = []
    for version, batch in enumerate(batches, start=1):
        metrics = trainer.train_step(batch, policy_version=version)
        steps.append({"metrics": metrics, "actor": _state(actor), "critic": _state(critic),
                      "actor_grads": _grads(actor)})  # fmt: skip
    return steps


# ---- the ranks --------------------------------------------------------------------------------------------


class _ReduceScatters:
    """Counts FSDP's gradient reduce-scatters (`dist.reduce_scatter_single`) and their dtypes."""

    def __init__(self) -> None:
        self.count, self.dtypes = 0, set()
        self._real = dist.reduce_scatter_single

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            self.dtypes.add(kwargs.get("input", args[1] if len(args) > 1 else None).dtype)
            return self._real(*args, **kwargs)

        dist.reduce_scatter_single = counted

    def take(self) -> dict[str, Any]:
        out = {"count": self.count, "dtypes": sorted(str(d) for d in self.dtypes)}
        self.count, self.dtypes = 0, set()
        return out


def _rank_steps(model_dir: Path, batches: list[Batch], gradient_sync: str) -> dict[str, Any]:
    from sao.models.sharding import full_state_dict
    from sao.train.rank import RankTrainer
    from sao.train.step_shard import StepShard

    cfg = config()
    rank = dist.get_rank()
    args = dataclasses.replace(FACTORIES["trainer"](cfg), gradient_sync=gradient_sync)
    trainer = RankTrainer(model_dir, None, args, dtype=COMPUTE.dtype,
                          master_dtype=COMPUTE.master_dtype, device="cpu", head_init="normal",
                          prepare=functools.partial(prepare_for_training, compute=COMPUTE))  # fmt: skip
    assert trainer.trainer.args.gradient_sync == gradient_sync
    assert trainer.critic is not None
    sharded = {p.dtype for p in trainer.actor.parameters()} | {p.dtype for p in trainer.critic.parameters()}
    counter = _ReduceScatters()
    steps = []
    for version, batch in enumerate(batches, start=1):
        shard = shards(batch)[rank]
        parts = len(StepShard.build(batch, shard, MICRO_BATCH_TOKENS, trainer.collective).parts)
        metrics = trainer.train_step(batch, shard, policy_version=version)
        steps.append({
            "metrics": metrics, "reduce_scatters": counter.take(), "micro_batches": parts,
            "actor": full_state_dict(trainer.actor), "critic": full_state_dict(trainer.critic),
            "actor_grads": _grads(trainer.actor),
        })  # fmt: skip
    dist.reduce_scatter_single = counter._real
    return {
        "steps": steps,
        "sharded_dtypes": sorted(str(d) for d in sharded),
        "checkpointed": checkpointing_enabled(trainer.actor) and checkpointing_enabled(trainer.critic),
        "k_critic": cfg.algo.k_critic,
    }


def _worker(rank: int, port: int, model_dir: Path, work: Path) -> None:
    torch.set_num_threads(1)
    faulthandler.dump_traceback_later(300, exit=True)  # a hung collective fails the test, not the session
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        batches = torch.load(work / "batches.pt", weights_only=False)
        results = {"step": _rank_steps(model_dir, batches, "step"),
                   "micro_batch": _rank_steps(model_dir, batches[:1], "micro_batch")}  # fmt: skip
        if rank == 0:
            torch.save(results, work / "ranks.pt")
        dist.barrier()  # the ranks leave together, as in fsdp_scenarios
    finally:
        dist.destroy_process_group()


def run_ranks(model_dir: Path, work: Path, batches: list[Batch]) -> dict[str, Any]:
    """On 2 spawned gloo ranks: every batch with ``gradient_sync="step"``, the first with ``"micro_batch"``;
    rank 0's results."""
    torch.save(batches, work / "batches.pt")
    mp.start_processes(_worker, args=(free_port(), model_dir, work), nprocs=WORLD, start_method="spawn")
    return torch.load(work / "ranks.pt", weights_only=False)
