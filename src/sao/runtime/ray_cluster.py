"""The Ray cluster of a distributed run: joined or started, checked, placed, and shut down without leftovers.

`RayCluster.open` either joins the cluster at ``cluster.address`` (``ray start --head`` / ``--address``
on the nodes; its own auth settings apply) or starts a private one on this machine with everything set
explicitly rather than left to Ray's defaults:

- bound to 127.0.0.1 (the node advertises the loopback address; nothing listens on other interfaces);
- ``RAY_AUTH_MODE`` set to ``cluster.auth`` (``disabled`` for a loopback-only cluster; ``token`` keeps
  Ray's token authentication);
- its own session directory (``cluster.temp_dir``, else a fresh ``/tmp/sao-ray-*``; Unix sockets there
  must stay under 108 bytes of path), removed at the end;
- ``cluster.num_cpus`` / ``cluster.num_gpus`` logical resources;
- no dashboard UI (Ray still runs its minimal dashboard process, on 127.0.0.1), no usage stats.

Before any actor starts, the actors' total request (`ClusterConfig.requested`) is compared with what the
cluster has (`check_cluster_resources`, a `ConfigError` naming the key), then one placement group holds a
bundle per trainer rank and per engine replica (``cluster.placement_strategy``). `RayCluster.close` kills
the actors it was given, removes the placement group and, for a cluster it started, shuts Ray down and
checks that none of that session's processes is left (`session_processes`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sao.config import ClusterConfig, ConfigError
from sao.config.schema import check_cluster_resources

__all__ = ["RayCluster", "actor_threads", "session_processes"]

log = logging.getLogger(__name__)

# Set for a cluster sao starts (and inherited by its workers): the node's address is the loopback one.
_LOCAL_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
# Passed to every actor: no hub look-ups (they hang without a network), the interpreter's own path.
_ACTOR_ENV = ("HF_HUB_OFFLINE", "SAO_SANDBOX_MODE", "PYTHONPATH")


def actor_threads(cpus: float) -> int:
    """Torch threads of an actor holding ``cpus`` logical CPUs (Ray itself sets 1 OMP thread)."""
    return max(1, int(cpus))


def session_processes(temp_dir: str | Path) -> list[int]:
    """Pids of live processes whose command line names ``temp_dir`` (a Ray session's raylet, GCS,
    workers …); empty once the session is fully shut down."""
    needle = str(temp_dir).encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline:
            pids.append(int(entry.name))
    return pids


@dataclass
class RayCluster:
    """A joined or started Ray cluster and the placement group of one run (module docstring)."""

    cfg: ClusterConfig
    started: bool
    temp_dir: Path | None
    placement_group: Any = None
    actors: list[Any] = field(default_factory=list)
    _own_temp_dir: bool = False
    _env_before: dict[str, str | None] = field(default_factory=dict)

    @classmethod
    def open(cls, cfg: ClusterConfig) -> RayCluster:
        """Join or start the cluster, check its resources, reserve the run's bundles."""
        try:
            import ray
        except ImportError:
            raise ConfigError(
                "runtime.backend=ray needs Ray, which is not installed: pip install 'sao[ray]'"
            ) from None

        if ray.is_initialized():
            raise RuntimeError("Ray is already initialised in this process; a run opens its own connection")
        env = {name: os.environ[name] for name in _ACTOR_ENV if name in os.environ}
        if cfg.address is not None:
            ray.init(address=cfg.address, runtime_env={"env_vars": env}, configure_logging=False)
            cluster = cls(cfg, started=False, temp_dir=None)
        else:
            own = cfg.temp_dir is None
            temp_dir = Path(tempfile.mkdtemp(prefix="sao-ray-", dir="/tmp")) if own else Path(cfg.temp_dir)
            before = {k: os.environ.get(k) for k in (*_LOCAL_ENV, "RAY_AUTH_MODE")}
            os.environ.update(_LOCAL_ENV)
            os.environ["RAY_AUTH_MODE"] = cfg.auth
            _advertise_loopback()
            cluster = cls(cfg, started=True, temp_dir=temp_dir, _own_temp_dir=own, _env_before=before)
            try:
                ray.init(
                    num_cpus=cfg.num_cpus, num_gpus=cfg.num_gpus, _temp_dir=str(temp_dir),
                    _node_ip_address="127.0.0.1", include_dashboard=False, configure_logging=False,
                    runtime_env={"env_vars": {**env, **_LOCAL_ENV, "RAY_AUTH_MODE": cfg.auth}},
                )  # fmt: skip
            except BaseException:
                cluster.close()
                raise
        try:
            check_cluster_resources(cfg, ray.cluster_resources())
            cluster._reserve()
        except BaseException:
            cluster.close()
            raise
        return cluster

    def _reserve(self) -> None:
        from ray.util.placement_group import placement_group

        cfg = self.cfg
        trainer = {"CPU": cfg.trainer_cpus, "GPU": cfg.trainer_gpus}
        engine = {"CPU": cfg.engine_cpus, "GPU": cfg.engine_gpus}
        bundles = [_nonzero(trainer)] * cfg.trainer_workers + [_nonzero(engine)] * cfg.engine_replicas
        self.placement_group = placement_group(bundles, strategy=cfg.placement_strategy, name="")
        import ray

        ready = self.placement_group.ready()
        done, _ = ray.wait([ready], timeout=cfg.start_timeout_s)
        if not done:
            raise ConfigError(
                f"cluster.placement_strategy: the cluster could not place {len(bundles)} bundles "
                f"({cfg.trainer_workers} trainer ranks of {trainer}, {cfg.engine_replicas} engine replicas "
                f"of {engine}, strategy {cfg.placement_strategy}) within cluster.start_timeout_s="
                f"{cfg.start_timeout_s:g} s"
            )

    def trainer_options(self, rank: int) -> dict[str, Any]:
        """``.options(...)`` of trainer rank ``rank``: its bundle, CPUs and GPUs."""
        return self._options(rank, self.cfg.trainer_cpus, self.cfg.trainer_gpus)

    def engine_options(self, replica: int) -> dict[str, Any]:
        """``.options(...)`` of engine replica ``replica``."""
        index = self.cfg.trainer_workers + replica
        return self._options(index, self.cfg.engine_cpus, self.cfg.engine_gpus)

    def _options(self, bundle: int, cpus: float, gpus: float) -> dict[str, Any]:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(self.placement_group, placement_group_bundle_index=bundle)
        return {"num_cpus": cpus, "num_gpus": gpus, "scheduling_strategy": strategy}

    def track(self, actor: Any) -> Any:
        """Remember ``actor`` so that `close` kills it; returns it."""
        self.actors.append(actor)
        return actor

    def close(self) -> None:
        """Kill the tracked actors, remove the placement group, and shut down a cluster sao started (its
        processes gone, its session directory removed). Safe to call twice."""
        import ray

        if ray.is_initialized():
            for actor in self.actors:
                with contextlib.suppress(Exception):  # already dead
                    ray.kill(actor, no_restart=True)
            if self.placement_group is not None:
                from ray.util.placement_group import remove_placement_group

                with contextlib.suppress(Exception):
                    remove_placement_group(self.placement_group)
            ray.shutdown()
        self.actors.clear()
        self.placement_group = None
        if self.started and self.temp_dir is not None:
            self._wait_for_exit()
            if self._own_temp_dir:
                shutil.rmtree(self.temp_dir, ignore_errors=True)
        if self.started:
            _advertise_loopback(False)
        for name, value in self._env_before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._env_before = {}

    def _wait_for_exit(self, timeout_s: float = 15.0) -> None:
        assert self.temp_dir is not None
        deadline = time.monotonic() + timeout_s
        while (left := session_processes(self.temp_dir)) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in left:  # what ray.shutdown did not stop in time
            log.warning("killing leftover Ray process %d of session %s", pid, self.temp_dir)
            with contextlib.suppress(OSError):
                os.kill(pid, 9)


def _advertise_loopback(on: bool = True) -> None:
    """Make this process's Ray advertise 127.0.0.1. Ray reads ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` once,
    when it is imported, and otherwise replaces a loopback ``_node_ip_address`` by the machine's address;
    its processes started from here read the variable themselves."""
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = not on


def _nonzero(resources: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in resources.items() if v > 0}
