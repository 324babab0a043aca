"""Every CPU weight-sync path of the Ray runtime, on the real actors: 2 FSDP2 trainer ranks (gloo) train a
step, `WeightSync.push(v)` runs, and then every engine replica holds the trainer's weights (checksums) and
records log-probs equal to the trainer's teacher-forced ones (the DIS ratio is 1 on-policy)."""

from __future__ import annotations

import asyncio

import pytest

ray = pytest.importorskip("ray")

import torch  # noqa: E402
from tests.engine.teacher import trainer_logprobs  # noqa: E402

from sao.config import load_config  # noqa: E402
from sao.engine.types import SamplingParams  # noqa: E402
from sao.models.loading import load_policy  # noqa: E402
from sao.runtime.build import FACTORIES  # noqa: E402
from sao.runtime.ray_backend import RayParts, make_weight_sync  # noqa: E402
from sao.runtime.ray_engine import state_checksum  # noqa: E402
from sao.runtime.weight_sync import BroadcastSync  # noqa: E402
from sao.types import Batch, Trajectory  # noqa: E402


def _batch(n: int = 4) -> Batch:
    gen = torch.Generator().manual_seed(0)
    trajs = []
    for i in range(n):
        length = 10 + 3 * i  # uneven across ranks
        ids = torch.randint(3, 250, (length,), generator=gen).tolist()
        action = [0] * 4 + [1] * (length - 4)
        trajs.append(Trajectory(
            prompt_id=f"p{i}", token_ids=ids, action_mask=action,
            rollout_logprobs=[-0.5 if a else 0.0 for a in action],
            versions=[0 if a else -1 for a in action], turn_ids=[-1] * 4 + [0] * (length - 4),
            rewards=[float(i % 2)], traj_id=f"t{i}", group_id=f"g{i // 2}",
        ))  # fmt: skip
    return Batch.from_trajectories(trajs)


def test_every_cpu_path_gives_every_replica_the_trainers_weights_and_on_policy_logprobs(
    tiny_moe_dir, tmp_path
):
    cfg = load_config(None, [
        "model.tiny_arch=qwen3_moe", "model.dtype=float32", "model.device=cpu", "algo=grpo",
        "algo.group_size=2", "trainer.batch_size=4", "trainer.lr=1e-2", "runtime.backend=ray",
        "cluster.num_cpus=4", "cluster.trainer_workers=2", "cluster.engine_replicas=2",
    ])  # fmt: skip
    failed: list[BaseException] = []

    async def main():
        parts = await RayParts.open(
            cfg.cluster, FACTORIES["engine"](cfg), FACTORIES["trainer"](cfg), FACTORIES["critic"](cfg),
            actor_dir=tiny_moe_dir, critic_dir=None, tokenizer_dir=tiny_moe_dir, run_dir=tmp_path,
            weight_sync="broadcast", on_failed=failed.append, train_lock=asyncio.Lock(), version=lambda: 0,
        )  # fmt: skip
        results = {}
        try:
            prompt = [5, 6, 7, 8, 9]
            for version, path in enumerate(("object_store", "broadcast", "disk"), 1):
                await asyncio.to_thread(parts.group.train_step, _batch(), policy_version=version - 1)
                sync = make_weight_sync(path, parts.group, parts.pool, tmp_path, "gloo")
                await sync.push(version)
                full = await asyncio.to_thread(parts.group.checksum)
                replicas = [await r.engine.actor.checksum.remote() for r in parts.pool.replicas]
                state = await asyncio.to_thread(ray.get, parts.group.full_state_ref())
                gens = [await r.generate(prompt, SamplingParams(max_new_tokens=12, seed=version))
                        for r in parts.pool.replicas]  # fmt: skip
                fallbacks = sync.fallbacks if isinstance(sync, BroadcastSync) else 0
                results[path] = (full, replicas, state, gens, fallbacks)
        finally:
            await parts.close()
        return results

    results = asyncio.run(main())
    assert not failed
    previous = None
    for version, (path, (full, replicas, state, gens, fallbacks)) in enumerate(results.items(), 1):
        assert replicas == [full, full], path  # every replica holds the trainer's weights
        assert full != previous, path  # and they changed with the step
        previous = full
        assert fallbacks == 0
        assert state_checksum(state) == full
        policy = load_policy(tiny_moe_dir, dtype="float32", device="cpu")
        policy.load_state_dict(state)
        for gen in gens:
            assert set(gen.versions) == {version}, path
            teacher = trainer_logprobs(policy, [5, 6, 7, 8, 9], gen)
            assert max(abs(a - b) for a, b in zip(teacher, gen.logprobs, strict=True)) < 1e-4, path
