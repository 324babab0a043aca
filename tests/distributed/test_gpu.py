"""FSDP2 on CUDA (run by scripts/gpu_check.sh on a GPU machine): a 1-rank NCCL world, bf16 parameters with
fp32 gradient reduction, one `sao` step (critic K=2, frozen attention) on a 32k-token packed batch."""

from __future__ import annotations

import math
import os

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _batch(tokens: int, vocab: int, seed: int = 0):
    """Trajectories of 512 tokens (prompt 64, action, observation 32, action) up to ``tokens`` in all."""
    from sao.types import Batch, Trajectory

    gen = torch.Generator().manual_seed(seed)
    trajs = []
    for i in range(tokens // 512):
        ids = torch.randint(3, vocab, (512,), generator=gen).tolist()
        action = [0] * 64 + [1] * 208 + [0] * 32 + [1] * 208
        turns = [-1] * 64 + [0] * 240 + [1] * 208
        trajs.append(Trajectory(
            prompt_id=f"p{i}", token_ids=ids, action_mask=action,
            rollout_logprobs=[-5.5 if a else 0.0 for a in action], versions=[0 if a else -1 for a in action],
            turn_ids=turns, rewards=[float(i % 2)], traj_id=f"t{i}",
        ))  # fmt: skip
    return Batch.from_trajectories(trajs)


def test_fsdp2_on_cuda_bf16_params_fp32_reduce_trains_a_32k_token_packed_batch(tiny_moe_dir):
    import torch.distributed as dist
    from tests.conftest import free_port
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from sao.config import load_config
    from sao.runtime.build import FACTORIES
    from sao.train.rank import RankTrainer

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    torch.cuda.set_device(0)
    try:
        cfg = load_config(None, ["model.tiny_arch=qwen3_moe", "trainer.micro_batch_tokens=8192",
                                 "trainer.lr=1e-3", "critic.lr=1e-3"])  # fmt: skip
        t = FACTORIES["trainer"](cfg)
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        rank = RankTrainer(tiny_moe_dir, None, t, dtype="float32", device="cuda", mp_policy=policy)
        before = {k: v.clone() for k, v in (rank.full_actor_state() or {}).items()}
        batch = _batch(32768, vocab=250)
        assert batch.num_tokens == 32768
        torch.cuda.reset_peak_memory_stats()
        metrics = rank.train_step(batch, list(range(batch.num_sequences)), policy_version=1)
        after = rank.full_actor_state() or {}
        assert all(math.isfinite(v) for k, v in metrics.items() if k != "critic/explained_variance")
        assert metrics["trainer/actor_updated"] == 1.0 and metrics["trainer/critic_steps"] == 2.0
        assert all(v.dtype == torch.float32 for v in after.values())  # fp32 master weights
        assert any(not torch.equal(before[k], after[k]) for k in before)
        print(f"peak CUDA memory {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB for 32k tokens")
    finally:
        dist.destroy_process_group()
