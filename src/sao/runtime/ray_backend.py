"""What ``runtime.backend=ray`` puts in place of the local engine, trainer and weight hand-off.

`RayParts.open` joins or starts the cluster (`RayCluster`), starts ``cluster.engine_replicas`` engine
replicas all at once (LocalEngine actors, or actors running a vLLM / SGLang server for
``engine.backend=vllm|sglang``; each supervised: restarted with the latest weights when it dies) behind an
`EnginePool`, the ``cluster.trainer_workers`` FSDP2 ranks of a `TrainerGroup`, and the `WeightSync` of
``runtime.weight_sync``. The driver (`sao.runtime.runner.Run`) keeps everything else: prompts, producer,
queue, staleness, metrics, checkpoint bookkeeping. `close` stops every actor and a cluster it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sao.config import ClusterConfig
from sao.config.schema import weight_sync_path
from sao.engine.server_settings import ServerSettings

from .args import CriticArgs, EngineArgs, TrainerArgs
from .engine_guard import SupervisedEngine
from .engine_pool import EnginePool, start_replicas
from .engines import check_rope_scaling, server_settings
from .ray_cluster import RayCluster, actor_threads
from .ray_engine import RemoteEngine, logging_settings, replica_class
from .ray_server import launch_server_replica
from .trainer_group import TrainerGroup, TrainerGroupArgs
from .weight_sync import WeightSync, make_weight_sync, push_dtype

__all__ = ["RayParts", "replica_starter"]


@dataclass
class RayParts:
    cluster: RayCluster
    pool: EnginePool
    group: TrainerGroup
    sync: WeightSync

    @classmethod
    async def open(
        cls,
        cluster_cfg: ClusterConfig,
        engine: EngineArgs,
        trainer: TrainerArgs,
        critic: CriticArgs,
        *,
        actor_dir: Path,
        critic_dir: Path | None,
        tokenizer_dir: Path,
        run_dir: Path,
        weight_sync: str,
        bucket_mb: int = 512,
        on_failed: Callable[[BaseException], None],
        train_lock: asyncio.Lock,
        version: Callable[[], int],
    ) -> RayParts:
        check_rope_scaling(engine.server.rope_scaling, actor_dir)
        cluster = await asyncio.to_thread(RayCluster.open, cluster_cfg)
        pool: EnginePool | None = None
        try:
            pushed = push_dtype(engine.backend, engine.dtype, engine.device)  # what the engines hold
            group_args = TrainerGroupArgs(
                actor_dir=str(actor_dir), critic_dir=str(critic_dir) if critic_dir else None, trainer=trainer,
                compute=critic.compute, threads=actor_threads(cluster_cfg.trainer_cpus),
                head_init=critic.head_init, push_dtype=pushed,
            )  # fmt: skip
            group = await asyncio.to_thread(TrainerGroup.create, cluster, group_args)

            servers = engine.backend in ("vllm", "sglang")
            restarts = run_dir / "weights" / "restart"

            async def latest() -> tuple[Any, int]:
                """The current weights for a restarted replica (a server reloads from a directory)."""
                async with train_lock:
                    v = version()
                    if not servers:
                        return group.full_state_ref(), v
                    target = restarts / f"v{v:08d}"
                    if not target.exists():
                        await asyncio.to_thread(group.write_weights, target)
                    return target, v

            gpus = {"engine_gpus": cluster_cfg.engine_gpus, "trainer_gpus": cluster_cfg.trainer_gpus}
            path = weight_sync_path(weight_sync, "ray", engine.backend, **gpus)
            starts = [
                server_starter(cluster, i, engine, actor_dir, cluster_cfg.start_timeout_s, path)
                if servers
                else replica_starter(cluster, i, engine, actor_dir, tokenizer_dir)
                for i in range(cluster_cfg.engine_replicas)
            ]
            started = await start_replicas(starts)  # all at once; a failure names its replica
            pool = EnginePool([
                SupervisedEngine(e, start, latest, max_restarts=engine.max_restarts, on_failed=on_failed)
                for e, start in zip(started, starts, strict=True)
            ])  # fmt: skip
            backend = "nccl" if cluster_cfg.engine_gpus > 0 and cluster_cfg.trainer_gpus > 0 else "gloo"
            sync = make_weight_sync(path, group, pool, run_dir, backend, bucket_bytes=bucket_mb << 20)
            return cls(cluster, pool, group, sync)
        except BaseException:
            if pool is not None:
                with contextlib.suppress(Exception):
                    await pool.close()
            await asyncio.to_thread(cluster.close)
            raise

    async def close(self) -> None:
        try:
            await self.pool.close()
            await asyncio.to_thread(self.group.close)
        finally:
            await asyncio.to_thread(self.cluster.close)


def replica_server_settings(engine: EngineArgs, model_dir: Path, sync_path: str) -> ServerSettings:
    """The launch settings of a server replica: ``engine``'s (`server_settings`: its bundle's GPUs are its
    tensor-parallel size), plus vLLM's NCCL weight-transfer engine when the run pushes over it
    (``sync_path`` ``"vllm"``: the server refuses the transfer endpoints without it)."""
    settings = server_settings(engine, model_dir)
    if sync_path == "vllm":
        settings = dataclasses.replace(settings, weight_transfer="nccl")
    return settings


def server_starter(
    cluster: RayCluster, index: int, engine: EngineArgs, model_dir: Path, timeout_s: float, sync_path: str
) -> Callable[[], Awaitable[Any]]:
    """Starts replica ``index`` as a vLLM / SGLang server in its bundle (again, after it died), with
    `replica_server_settings`."""
    settings = replica_server_settings(engine, model_dir, sync_path)

    async def start() -> Any:
        return await launch_server_replica(
            cluster, index, engine.backend, model_dir, python=engine.python, dtype=engine.dtype,
            max_running=engine.max_concurrent, settings=settings, episode_budget=engine.server.episode_budget,
            extra_args=engine.server_args, timeout_s=timeout_s,
        )  # fmt: skip

    return start


def replica_starter(
    cluster: RayCluster, index: int, engine: EngineArgs, model_dir: Path, tokenizer_dir: Path
) -> Callable[[], Awaitable[RemoteEngine]]:
    """Starts replica ``index`` in its bundle (again, after it died) and waits until it serves."""
    remote = replica_class()
    quiet = logging_settings()
    threads = actor_threads(cluster.cfg.engine_cpus)

    async def start() -> RemoteEngine:
        actor = cluster.track(
            remote.options(**cluster.engine_options(index), max_concurrency=1000).remote(
                str(model_dir), str(tokenizer_dir), device=engine.device, dtype=engine.dtype,
                max_running=engine.max_concurrent, seed=engine.seed + index, threads=threads, logging=quiet,
                prefix_cache_tokens=engine.prefix_cache_tokens,
            )
        )  # fmt: skip
        info = await asyncio.wait_for(actor.ready.remote(), timeout=cluster.cfg.start_timeout_s)
        return RemoteEngine(actor, index, info)

    return start
