"""The Ray pieces on a private cluster of this machine: hygiene (loopback, auth, temp dir, threads, nothing
left behind), the resource check, and engine replicas (generation, a weight update through the object
store, a killed replica)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from sao.config import ClusterConfig, ConfigError  # noqa: E402
from sao.engine.types import EngineCrashedError, SamplingParams  # noqa: E402
from sao.runtime.ray_cluster import RayCluster, session_processes  # noqa: E402
from sao.runtime.ray_engine import RemoteEngine, replica_class, state_checksum  # noqa: E402


@ray.remote
def _probe() -> dict:
    import torch

    return {"auth": os.environ.get("RAY_AUTH_MODE"), "hub": os.environ.get("HF_HUB_OFFLINE"),
            "threads": torch.get_num_threads(), "ip": ray.util.get_node_ip_address()}  # fmt: skip


def _replica(cluster: RayCluster, index: int, model_dir: Path) -> RemoteEngine:
    actor = cluster.track(
        replica_class()
        .options(**cluster.engine_options(index))
        .remote(
            str(model_dir),
            str(model_dir),
            device="cpu",
            dtype="float32",
            max_running=4,
            seed=index,
            threads=1,
        )
    )
    return RemoteEngine(actor, index, ray.get(actor.ready.remote(), timeout=120))


def test_a_private_cluster_is_loopback_only_explicit_and_leaves_nothing_behind(tiny_moe_dir):
    from sao.models.loading import load_policy

    cfg = ClusterConfig(num_cpus=3, trainer_workers=1, engine_replicas=2, trainer_cpus=1, engine_cpus=1)
    auth_before = os.environ.get("RAY_AUTH_MODE")
    cluster = RayCluster.open(cfg)
    temp_dir = cluster.temp_dir
    try:
        assert temp_dir is not None and temp_dir.name.startswith("sao-ray-") and temp_dir.is_dir()
        assert session_processes(temp_dir)  # the raylet and GCS of this session run under it
        resources = ray.cluster_resources()
        assert "node:127.0.0.1" in resources and resources["CPU"] == 3
        info = ray.get(_probe.options(**cluster.trainer_options(0)).remote())
        assert info == {"auth": "disabled", "hub": "1", "threads": 1, "ip": "127.0.0.1"}

        engines = [_replica(cluster, i, tiny_moe_dir) for i in range(2)]
        prompt, params = [1, 2, 3, 4], SamplingParams(max_new_tokens=5, seed=0)

        async def generate_all():
            return await asyncio.gather(*(e.generate(prompt, params) for e in engines))

        gens = asyncio.run(generate_all())
        assert [len(g.token_ids) for g in gens] == [5, 5] and gens[0].token_ids == gens[1].token_ids

        # A weight update through the object store: the replicas resolve the reference themselves.
        policy = load_policy(tiny_moe_dir, dtype="float32", device="cpu")
        state = {k: v * 1.5 for k, v in policy.state_dict().items()}
        ref = ray.put(state)

        async def push():
            await asyncio.gather(*(e.update_weights(ref, 4) for e in engines))
            return await asyncio.gather(*(e.generate(prompt, params) for e in engines))

        after = asyncio.run(push())
        want = state_checksum(policy.state_dict() | state)
        for engine, gen in zip(engines, after, strict=True):
            assert ray.get(engine.actor.checksum.remote()) == want
            assert engine.version == 4 and set(gen.versions) == {4}

        # A killed replica: its request fails as a crash, and the proxy says it is dead.
        ray.kill(engines[1].actor, no_restart=True)
        with pytest.raises(EngineCrashedError, match="replica 1 died"):
            asyncio.run(engines[1].generate(prompt, params))
        assert not engines[1].alive and engines[0].alive
    finally:
        cluster.close()
    assert not ray.is_initialized()
    assert session_processes(temp_dir) == []  # nothing of the session is left running
    assert not temp_dir.exists()
    assert os.environ.get("RAY_AUTH_MODE") == auth_before


def test_asking_for_more_than_the_cluster_has_fails_naming_the_key_before_any_actor_starts():
    cfg = ClusterConfig(num_cpus=2, num_gpus=0, engine_replicas=1, engine_gpus=1)
    with pytest.raises(ConfigError, match=r"cluster\.trainer_gpus / cluster\.engine_gpus.*asks for 1 GPU"):
        RayCluster.open(cfg)
    assert not ray.is_initialized()
