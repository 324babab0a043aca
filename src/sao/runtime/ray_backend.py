"""What ``runtime.backend=ray`` puts in place of the local engine, trainer and weight hand-off.

`RayParts.open` joins or starts the cluster (`RayCluster`), starts ``cluster.engine_replicas`` engine
replicas all at once (LocalEngine actors, or actors running a vLLM / SGLang server for
``engine.backend=vllm|sglang``; each supervised: restarted with the latest weights when it dies) behind an
`EnginePool`, the ``cluster.trainer_workers`` FSDP2 ranks of a `TrainerGroup`, and the `WeightSync` of
``runtime.weight_sync``. `RayBackend` is the run's `sao.runtime.backend.Backend` over them: the driver
(`sao.runtime.runner.Run`) keeps everything else: prompts, producer, queue, staleness, metrics, checkpoint
bookkeeping. `close` stops every actor and a cluster it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from sao.config import ConfigError
from sao.config.schema import weight_sync_path
from sao.engine.server_settings import ServerSettings
from sao.types import Batch

from .args import ClusterArgs, ClusterSettings, CriticArgs, EngineArgs, TrainerArgs
from .backend import EngineHooks, ModelDirs
from .engine_guard import SupervisedEngine
from .engine_pool import EnginePool, start_replicas
from .engines import StartDirs, check_rope_scaling, server_settings
from .native_weight_sync import NativeSync
from .ray_cluster import RayCluster, actor_threads
from .ray_engine import RemoteEngine, logging_settings, replica_class
from .ray_server import launch_server_replica
from .trainer_group import TrainerGroup, TrainerGroupArgs
from .weight_sync import BroadcastSync, DiskSync, ObjectStoreSync, WeightSync, push_dtype

__all__ = ["RayBackend", "RayParts", "make_weight_sync", "replica_starter"]


@dataclass
class RayParts:
    cluster: RayCluster
    pool: EnginePool
    group: TrainerGroup
    sync: WeightSync

    @classmethod
    async def open(
        cls,
        cluster_cfg: ClusterSettings,
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
            gpus = {"engine_gpus": cluster_cfg.engine_gpus, "trainer_gpus": cluster_cfg.trainer_gpus}
            path = weight_sync_path(weight_sync, "ray", engine.backend, **gpus)
            latest = _latest_weights(group, engine, run_dir, train_lock, version)
            pool = await _engine_pool(cluster, engine, actor_dir, tokenizer_dir, path, latest, on_failed)
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


def _latest_weights(
    group: TrainerGroup,
    engine: EngineArgs,
    run_dir: Path,
    train_lock: asyncio.Lock,
    version: Callable[[], int],
) -> Callable[[], Awaitable[tuple[Any, int]]]:
    """The current weights for a restarted replica (a server reloads them from a directory)."""
    servers = engine.backend in ("vllm", "sglang")
    restarts = run_dir / "weights" / "restart"

    async def latest() -> tuple[Any, int]:
        async with train_lock:
            v = version()
            if not servers:
                return group.full_state_ref(), v
            target = restarts / f"v{v:08d}"
            if not target.exists():
                await asyncio.to_thread(group.write_weights, target)
            return target, v

    return latest


async def _engine_pool(
    cluster: RayCluster, engine: EngineArgs, actor_dir: Path, tokenizer_dir: Path, sync_path: str,
    latest: Callable[[], Awaitable[tuple[Any, int]]], on_failed: Callable[[BaseException], None],
) -> EnginePool:  # fmt: skip
    """``cluster.engine_replicas`` supervised replicas, started all at once (a failure names its replica)."""
    servers = engine.backend in ("vllm", "sglang")
    cfg = cluster.cfg
    base = tokenizer_dir  # the configured model: what a replica restarts on (`StartDirs`)
    starts = [
        server_starter(cluster, i, engine, actor_dir, cfg.start_timeout_s, sync_path, restart_dir=base)
        if servers
        else replica_starter(cluster, i, engine, actor_dir, tokenizer_dir, restart_dir=base)
        for i in range(cfg.engine_replicas)
    ]
    started = await start_replicas(starts)
    return EnginePool([
        SupervisedEngine(e, start, latest, max_restarts=engine.max_restarts, on_failed=on_failed)
        for e, start in zip(started, starts, strict=True)
    ])  # fmt: skip


class RayBackend:
    """The `Backend` of ``runtime.backend=ray`` (`sao.runtime.backend`): the models live in the trainer
    ranks, which exist from `start_engine` on (value pretraining runs on them)."""

    trainer_threads = None  # the ranks set their own, from cluster.trainer_cpus

    def __init__(
        self,
        cluster: ClusterArgs,
        engine: EngineArgs,
        trainer: TrainerArgs,
        critic: CriticArgs,
        run_dir: Path,
    ) -> None:
        self.cluster_args, self.engine_args, self.trainer_args = cluster, engine, trainer
        self.critic_args, self.run_dir = critic, run_dir
        self.parts: RayParts | None = None  # opened by `start_engine`

    def load_models(self, dirs: ModelDirs) -> None:
        """Nothing here: each rank loads its shard of ``dirs`` when `start_engine` starts it."""

    async def start_engine(self, dirs: ModelDirs, tokenizer: Any, hooks: EngineHooks) -> EnginePool:
        c = self.cluster_args
        self.parts = await RayParts.open(
            c.cluster, self.engine_args, self.trainer_args, self.critic_args,
            actor_dir=dirs.actor, critic_dir=dirs.critic, tokenizer_dir=dirs.base, run_dir=self.run_dir,
            weight_sync=c.weight_sync, bucket_mb=c.weight_bucket_mb, on_failed=hooks.on_failed,
            train_lock=hooks.train_lock, version=hooks.version,
        )  # fmt: skip
        return self.parts.pool

    @property
    def group(self) -> TrainerGroup:
        assert self.parts is not None, "start_engine first"
        return self.parts.group

    def eval_engine(
        self, dirs: ModelDirs, tokenizer: Any, concurrency: int, version: Callable[[], int]
    ) -> Any:
        """Not here: the config refuses ``eval.engine=frozen`` with this runtime (evaluations share the
        pool)."""
        raise ConfigError("eval.engine='frozen' needs runtime.backend=local; set eval.engine: shared")

    def pretrain_value(self, corpus: list[Any], options: Any, console: Console) -> Any:
        """Every rank trains on the whole corpus: the single-process update."""
        return self.group.pretrain_value(corpus, options)

    def trainer_and_sync(self) -> tuple[Any, WeightSync]:
        assert self.parts is not None, "start_engine first"
        return self.parts.group, self.parts.sync

    def scorer(self) -> Callable[[list[int]], list[float]]:
        return self.group.score

    def restore_weights(self, checkpoint: Path) -> None:
        """The ranks load the DCP shards (resharded to this run's world size)."""
        from sao.train.dcp import has_sharded

        if not has_sharded(checkpoint):
            raise ConfigError(
                f"runtime.backend: {str(checkpoint)!r} was written by the local runtime (no dcp/ "
                "shards); resume it with runtime.backend=local"
            )
        self.group.load(checkpoint)

    def train_step(self, batch: Batch, **kwargs: Any) -> dict[str, float]:
        return self.group.train_step(batch, **kwargs)

    def checkpoint_models(self) -> dict[str, Any]:
        """Every rank writes its DCP shard, rank 0 the full HF directories."""
        return {"write_models": self.group.save, "has_critic": self.group.uses_critic}

    async def close(self) -> None:
        if self.parts is not None:
            await self.parts.close()


def replica_server_settings(engine: EngineArgs, model_dir: Path, sync_path: str) -> ServerSettings:
    """The launch settings of a server replica: ``engine``'s (`server_settings`: its bundle's GPUs are its
    tensor-parallel size), plus vLLM's NCCL weight-transfer engine when the run pushes over it
    (``sync_path`` ``"vllm"``: the server refuses the transfer endpoints without it)."""
    settings = server_settings(engine, model_dir)
    if sync_path == "vllm":
        settings = dataclasses.replace(settings, weight_transfer="nccl")
    return settings


def server_starter(
    cluster: RayCluster, index: int, engine: EngineArgs, model_dir: Path, timeout_s: float, sync_path: str,
    restart_dir: Path | None = None,
) -> Callable[[], Awaitable[Any]]:  # fmt: skip
    """Starts replica ``index`` as a vLLM / SGLang server in its bundle on ``model_dir`` (again, after it
    died, on ``restart_dir``: see `StartDirs`), with `replica_server_settings`."""
    settings = replica_server_settings(engine, model_dir, sync_path)
    load_dir = StartDirs(model_dir, restart_dir or model_dir)

    async def start() -> Any:
        return await launch_server_replica(
            cluster, index, engine.backend, load_dir(), python=engine.python, dtype=engine.dtype,
            max_running=engine.max_concurrent, settings=settings, episode_budget=engine.server.episode_budget,
            extra_args=engine.server_args, timeout_s=timeout_s,
        )  # fmt: skip

    return start


def replica_starter(
    cluster: RayCluster, index: int, engine: EngineArgs, model_dir: Path, tokenizer_dir: Path,
    restart_dir: Path | None = None,
) -> Callable[[], Awaitable[RemoteEngine]]:  # fmt: skip
    """Starts replica ``index`` in its bundle on ``model_dir`` (again, after it died, on ``restart_dir``: see
    `StartDirs`) and waits until it serves."""
    remote = replica_class()
    quiet = logging_settings()
    threads = actor_threads(cluster.cfg.engine_cpus)
    load_dir = StartDirs(model_dir, restart_dir or model_dir)

    async def start() -> RemoteEngine:
        actor = cluster.track(
            remote.options(**cluster.engine_options(index), max_concurrency=1000).remote(
                str(load_dir()), str(tokenizer_dir), device=engine.device, dtype=engine.dtype,
                max_running=engine.max_concurrent, seed=engine.seed + index, threads=threads, logging=quiet,
                prefix_cache_tokens=engine.prefix_cache_tokens,
            )
        )  # fmt: skip
        info = await asyncio.wait_for(actor.ready.remote(), timeout=cluster.cfg.start_timeout_s)
        return RemoteEngine(actor, index, info)

    return start


def make_weight_sync(
    path: str, group: Any, pool: Any, run_dir: Path, backend: str, *, bucket_bytes: int | None = None
) -> WeightSync:
    """The Ray runtime's `WeightSync` for ``runtime.weight_sync`` (already resolved: not 'auto').
    ``bucket_bytes``: ``runtime.weight_bucket_mb`` in bytes (None: the path's default)."""
    if path == "object_store":
        return ObjectStoreSync(group, pool)
    if path == "disk":
        return DiskSync(group, pool, run_dir / "weights")
    if path == "broadcast":
        return BroadcastSync(group, pool, backend, bucket_bytes=bucket_bytes)
    if path in ("vllm", "sglang"):  # the servers' native NCCL transfer; falls back to disk
        size = {} if bucket_bytes is None else {"bucket_bytes": bucket_bytes}
        return NativeSync(group, pool, run_dir / "weights", wire=path, **size)  # type: ignore[arg-type]
    raise ValueError(f"runtime.weight_sync={path!r} is not a path of the ray runtime")
