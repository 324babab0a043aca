"""How producer, trainer and engines are wired: `RuntimeConfig` (with push checks and the drift alarm) and
the distributed runtime's `ClusterConfig`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, model_validator

from .section import ConfigError, Section

__all__ = [
    "ClusterConfig",
    "MismatchDriftConfig",
    "PushCheckConfig",
    "RuntimeConfig",
    "check_cluster_resources",
    "requested_resources",
    "weight_sync_path",
]


class PushCheckConfig(Section):
    """After every weight push, each engine replica and the trainer score one fixed probe sequence
    (teacher-forced log-probs, temperature 1) and are compared (docs/engine.md, "Every push verified")."""

    action: Literal["error", "warn", "none"] = Field(
        "error",
        description="A replica whose mean |Δ log-prob| on the probe exceeds the threshold: 'error' stops the "
        "run with a checkpoint, naming the replica and the version; 'warn' logs it and trains on; 'none': no "
        "probe.",
    )
    threshold: float = Field(
        0.5,
        gt=0,
        description="Mean |log p_engine − log p_trainer| over the probe's tokens (nats) above which a push "
        "failed. Same weights give ~1e-6 in fp32 and ~1e-2–1e-1 for a bf16 engine against an fp32 trainer; "
        "wrong, partial or scrambled weights give >= 1.",
    )
    probe_tokens: int = Field(128, ge=2, le=8192, description="Length of the probe sequence in tokens.")
    probe: Literal["vocab", "prompt"] = Field(
        "vocab",
        description="'vocab': token ids drawn from the tokenizer's vocabulary (special tokens excluded) with "
        "trainer.seed; 'prompt': the first training task's rendered prompt, cut to probe_tokens.",
    )


class MismatchDriftConfig(Section):
    """An alarm when the per-step lag-0 mismatch between the engine's log-probs and the trainer's grows over
    the run (docs/engine.md, "Every push verified")."""

    action: Literal["warn", "error", "none"] = Field(
        "warn",
        description="When the alarm fires: 'warn' logs it once (again only after it cleared); 'error' stops "
        "the run with a checkpoint; 'none': no alarm (the metrics are logged either way).",
    )
    window: int = Field(
        20, ge=1, description="Steps (with lag-0 tokens) in the early-run and in the recent mean."
    )
    factor: float = Field(
        2.0, ge=1, description="The alarm fires when the recent mean exceeds factor x the early-run mean."
    )
    min_abs_diff: float = Field(
        0.01,
        ge=0,
        description="...and exceeds this mean |Δ log-prob| (nats): a mismatch below it moves token ratios by "
        "about 1 % on average, well inside the DIS band, whatever its growth.",
    )


class RuntimeConfig(Section):
    """How producer and trainer are wired."""

    mode: Literal["async", "sync"] = Field(
        "async", description="'async': train on trajectories as they finish; 'sync': generate then train."
    )
    max_in_flight: int = Field(256, ge=1, description="Episodes being generated at once.")
    max_staleness: int = Field(
        1, ge=0, description="Max policy versions a new episode may start behind the trainer (admission)."
    )
    drop_older_than: int | None = Field(
        None, ge=0, description="Drop trajectories with tokens more than this many versions old; null = keep."
    )
    max_consecutive_drops: int | None = Field(
        1000,
        ge=1,
        description="Episodes in a row that yield no trajectory (env or engine failures) before the run "
        "stops with a checkpoint: a broken env or grader ends the run instead of spinning; null = never.",
    )
    backend: Literal["local", "ray"] = Field(
        "local",
        description="'local': one process; 'ray': engine replicas and FSDP2 trainer ranks as Ray actors "
        "(the cluster section), with the same run loop in the driver.",
    )
    weight_sync: Literal["auto", "inproc", "object_store", "broadcast", "disk", "vllm", "sglang"] = Field(
        "auto",
        description="How new weights reach the engines: 'inproc' (local runtime), 'object_store' (Ray's, "
        "small models), 'broadcast' (a process group of trainer rank 0 and the engine replicas, gloo/NCCL), "
        "'disk' (a safetensors directory the engines reload), 'vllm' / 'sglang' (trainer rank 0 into the "
        "servers' own NCCL weight-transfer group, bucketed; needs engine.backend to match and GPUs on both "
        "sides). 'auto': inproc for local; for ray broadcast with LocalEngine replicas, the servers' native "
        "transfer with vLLM / SGLang replicas when cluster.engine_gpus and cluster.trainer_gpus are > 0, "
        "else disk.",
    )
    weight_bucket_mb: int = Field(
        512,
        ge=1,
        description="Bucket size (MiB) of pushes over a process group ('broadcast', 'vllm', 'sglang'): the "
        "tensors travel packed in flat buffers of about this size, one broadcast each ('vllm': vLLM's packed "
        "chunks, this size plus at most one tensor; 'sglang': one update request per bucket). Costs one "
        "bucket of memory on the trainer's device and on each receiver's.",
    )
    weight_sync_timeout_s: float = Field(
        900.0,
        gt=0,
        description="Deadline of one weight push (and of its probe), whatever the path: a push still running "
        "then stops the run with a checkpoint, naming the path, the replicas that did not confirm and the "
        "version. The broadcast path falls back to the object store within it.",
    )
    push_check: PushCheckConfig = Field(default_factory=PushCheckConfig, description="Push verification.")
    mismatch_drift: MismatchDriftConfig = Field(
        default_factory=MismatchDriftConfig, description="The lag-0 mismatch drift alarm."
    )

    @model_validator(mode="after")
    def _sync_fits_backend(self) -> RuntimeConfig:
        if self.backend == "local" and self.weight_sync not in ("auto", "inproc"):
            raise ValueError(
                f"runtime.weight_sync={self.weight_sync!r} applies to runtime.backend='ray'; the local "
                "runtime hands the weights over in process ('inproc')"
            )
        if self.backend == "ray" and self.weight_sync == "inproc":
            raise ValueError("runtime.weight_sync='inproc' needs runtime.backend='local'")
        bucket_unused = self.backend == "local" or self.weight_sync in ("object_store", "disk")
        if bucket_unused and self.weight_bucket_mb != type(self).model_fields["weight_bucket_mb"].default:
            raise ValueError(
                "runtime.weight_bucket_mb applies to pushes over a process group (runtime.backend='ray', "
                f"runtime.weight_sync 'broadcast', 'vllm' or 'sglang'), not to {self.weight_sync!r} on "
                f"{self.backend!r}"
            )
        return self

    def resolved_weight_sync(self, engine_backend: str = "local", cluster: Any = None) -> str:
        """``weight_sync`` with 'auto' resolved (`weight_sync_path`); ``cluster``: the `ClusterConfig` whose
        GPUs decide between the servers' native transfer and disk (None: as if no GPUs)."""
        if cluster is None:
            return weight_sync_path(self.weight_sync, self.backend, engine_backend)
        gpus = {"engine_gpus": cluster.engine_gpus, "trainer_gpus": cluster.trainer_gpus}
        return weight_sync_path(self.weight_sync, self.backend, engine_backend, **gpus)


def weight_sync_path(
    setting: str, runtime_backend: str, engine_backend: str, *, engine_gpus: float = 0.0,
    trainer_gpus: float = 0.0,
) -> str:  # fmt: skip
    """``runtime.weight_sync`` with 'auto' resolved: inproc (local runtime); for ray, broadcast with
    LocalEngine replicas, with vLLM / SGLang server replicas their native NCCL transfer ('vllm' /
    'sglang') when both the replicas (``engine_gpus``) and the trainer ranks (``trainer_gpus``) have GPUs,
    else disk."""
    if setting != "auto":
        return setting
    if runtime_backend == "local":
        return "inproc"
    if engine_backend not in ("vllm", "sglang"):
        return "broadcast"
    return engine_backend if engine_gpus > 0 and trainer_gpus > 0 else "disk"


class ClusterConfig(Section):
    """Where the distributed runtime (``runtime.backend=ray``) places its actors (docs/distributed.md)."""

    address: str | None = Field(
        None,
        description="Ray cluster to join ('auto', 'host:port' of `ray start --head`); null: start a "
        "private one on this machine, bound to 127.0.0.1, shut down at the end of the run.",
    )
    num_cpus: float | None = Field(
        None,
        gt=0,
        description="Local start only: logical CPUs of the started cluster (null: this machine's).",
    )
    num_gpus: int | None = Field(
        None, ge=0, description="Local start only: GPUs of the started cluster (null: those Ray detects)."
    )
    auth: Literal["disabled", "token"] = Field(
        "disabled",
        description="Local start only: Ray's token authentication; 'disabled' is set explicitly (the "
        "cluster listens on 127.0.0.1 only), 'token' leaves Ray's token auth on.",
    )
    temp_dir: str | None = Field(
        None, description="Local start only: Ray's session directory (null: a fresh one under /tmp)."
    )
    trainer_workers: int = Field(1, ge=1, description="Trainer ranks (one FSDP2 world).")
    trainer_cpus: float = Field(1.0, gt=0, description="CPUs per trainer rank (its torch threads).")
    trainer_gpus: float = Field(0.0, ge=0, description="GPUs per trainer rank (0: train on CPU, gloo).")
    engine_replicas: int = Field(1, ge=1, description="Rollout engine replicas.")
    engine_cpus: float = Field(1.0, gt=0, description="CPUs per engine replica (its torch threads).")
    engine_gpus: float = Field(0.0, ge=0, description="GPUs per engine replica.")
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="Ray placement-group strategy of the trainer and engine bundles."
    )
    start_timeout_s: float = Field(
        300.0, gt=0, description="Seconds to wait for the actors' resources and their start-up."
    )

    def requested(self) -> dict[str, float]:
        """Resources the actors ask for in total: ``{"CPU": …, "GPU": …}``."""
        return requested_resources(self)


def requested_resources(cluster: Any) -> dict[str, float]:
    """Resources the actors of ``cluster`` (a `ClusterConfig`, or settings with its field names) ask for in
    total: ``{"CPU": …, "GPU": …}``."""
    return {
        "CPU": cluster.trainer_workers * cluster.trainer_cpus + cluster.engine_replicas * cluster.engine_cpus,
        "GPU": cluster.trainer_workers * cluster.trainer_gpus + cluster.engine_replicas * cluster.engine_gpus,
    }


def check_cluster_resources(cluster: ClusterConfig, available: Mapping[str, float]) -> None:
    """Raise `ConfigError` naming the key when the actors ask for more ``CPU``/``GPU`` than ``available``."""
    for kind, need in cluster.requested().items():
        have = float(available.get(kind, 0.0))
        if need > have + 1e-9:
            lower = kind.lower()
            raise ConfigError(
                f"cluster.trainer_{lower}s / cluster.engine_{lower}s: the run asks for {need:g} {kind} "
                f"(trainer_workers={cluster.trainer_workers} x {getattr(cluster, f'trainer_{lower}s'):g} + "
                f"engine_replicas={cluster.engine_replicas} x {getattr(cluster, f'engine_{lower}s'):g}) but "
                f"the cluster has {have:g}"
                + (
                    " (a cluster sao starts has cluster.num_cpus logical CPUs: raise it to share cores)"
                    if kind == "CPU"
                    else ""
                )
            )
