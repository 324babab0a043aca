"""The resource plan of a run config: GPUs, model size, KV cache, weight pushes and trainer memory.

Arithmetic on the config and the model's architecture, not a measurement; `sao plan` prints it
(`resource_plan` then `format_resource_plan`, whose rows `sao.plan.resource_table` writes). Nothing is
downloaded and torch is not imported: the architecture comes from `sao.plan.architecture`
(``model.path``'s ``config.json``, else the shipped table of public configs, else sao's tiny config), the
trainer's memory from `sao.plan.memory`.

Figures and the assumptions behind them:

- parameters: one entry per Hugging Face tensor of Qwen3 / Qwen3-MoE (`parameter_sizes`); *active* counts
  top-k of the experts;
- the engine dtype is ``engine.dtype`` ('auto': bfloat16 when the engine is on a GPU, float32 on the CPU);
  the engines hold, and every weight push moves, every policy parameter in it;
- KV cache per token = 2 (K and V) × layers × KV heads × head dim × bytes of the engine dtype; a full
  sequence is ``data.max_total_tokens`` tokens;
- sequences per engine replica = ⌊(GPUs × ``gpu_memory_gib`` × ``engine_memory_fraction`` − weights) / KV
  of a full sequence⌋ (``engine_memory_fraction`` 0.9: vLLM's default ``--gpu-memory-utilization``;
  activations and CUDA graphs come out of the rest);
- trainer state, sharded evenly over the trainer GPUs (FSDP2): ``4 × master bytes`` per trainable
  parameter (weight, gradient, AdamW m and v in ``model.master_dtype``: 16 B fp32, 8 B bf16) and the weight
  alone per frozen one, for the actor and, when the algorithm has one, the critic (the backbone without the
  LM head, plus a scalar value head; ``critic.freeze`` applied by name as `sao.models.freezing` does);
- the trainer's peak per GPU for one micro-batch (`sao.plan.memory.trainer_memory`) of
  max(``trainer.micro_batch_tokens``, ``data.max_total_tokens``) tokens (a longer trajectory is a
  micro-batch of its own): state, FSDP's gathered units in ``model.dtype``, activations with or without
  ``model.gradient_checkpointing`` (null: on when the trainer is on a GPU), the LM head's chunk, and, for
  the local runtime whose engine shares the GPU, the engine's weights (and its KV cache when rollouts run
  during training: ``runtime.mode`` async).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from sao.config.schema import RunConfig
from sao.plan.architecture import (
    KNOWN_ARCHITECTURES,
    Architecture,
    active_parameters,
    critic_parameter_sizes,
    model_architecture,
    parameter_sizes,
)
from sao.plan.memory import (
    DTYPE_BYTES,
    TrainerMemory,
    local_engine_kv_bytes,
    state_bytes_per_parameter,
    trainer_memory,
)

__all__ = [
    "DEFAULT_ENGINE_MEMORY_FRACTION",
    "DEFAULT_GPU_MEMORY_GIB",
    "KNOWN_ARCHITECTURES",
    "Architecture",
    "ResourcePlan",
    "active_parameters",
    "critic_parameter_sizes",
    "model_architecture",
    "parameter_sizes",
    "resource_plan",
]

DEFAULT_GPU_MEMORY_GIB = 80.0  # an 80 GB A100 / H100; pass 141 for an H200
DEFAULT_ENGINE_MEMORY_FRACTION = 0.9  # vLLM's --gpu-memory-utilization default
GIB = 1024**3
_ATTENTION_MARKER = ".self_attn."  # as sao.models.freezing.ATTENTION_MARKER (that module imports torch)


def _freeze_matcher(freeze: str | list[str]) -> Callable[[str], bool]:
    # The rule of sao.models.freezing.apply_freeze, by parameter name.
    if freeze == "none":
        return lambda name: False
    if freeze == "attention":
        return lambda name: _ATTENTION_MARKER in name
    patterns = [re.compile(p) for p in freeze]
    return lambda name: any(p.search(name) for p in patterns)


@dataclass(frozen=True)
class ResourcePlan:
    """What a run config asks for; bytes are exact integers, None where a figure does not apply."""

    model: str
    architecture: Architecture
    architecture_source: str
    runtime_backend: str
    trainer_workers: int
    gpus_per_trainer_worker: float
    engine_replicas: int
    gpus_per_engine_replica: float
    trainer_gpus: float
    engine_gpus: float
    total_gpus: float  # the local runtime's trainer and engine share one device
    params_total: int
    params_active: int
    engine_dtype: str
    kv_bytes_per_token: int
    max_total_tokens: int
    kv_bytes_per_sequence: int
    weight_bytes: int  # the policy in the engine dtype: what a replica holds and a weight push moves
    weight_sync: str
    gpu_memory_gib: float
    engine_memory_fraction: float
    sequences_per_replica: int | None
    max_in_flight: int
    critic_params: int  # 0 without a critic
    critic_trainable_params: int
    compute_dtype: str
    master_dtype: str
    gradient_checkpointing: bool
    micro_batch_tokens: int  # the largest micro-batch: max(trainer.micro_batch_tokens, max_total_tokens)
    unsharded_gradient: bool  # FSDP ranks hold a full unsharded gradient between micro-batches
    trainer_state_bytes: int
    trainer_state_bytes_per_gpu: int | None  # None: the trainer runs on CPU
    trainer_memory: TrainerMemory | None  # one trainer GPU at its peak; None: the trainer runs on CPU
    notes: tuple[str, ...]

    @property
    def trainer_peak_bytes_per_gpu(self) -> int | None:
        """Predicted peak of one trainer GPU (for the local runtime: with the engine beside it)."""
        return None if self.trainer_memory is None else self.trainer_memory.peak

    @property
    def trainer_headroom_bytes(self) -> int | None:
        """GPU memory a trainer GPU has left at its predicted peak (negative: it does not fit)."""
        peak = self.trainer_peak_bytes_per_gpu
        return None if peak is None else int(self.gpu_memory_gib * GIB) - peak


def _auto_dtype(dtype: str, on_gpu: bool) -> str:
    return dtype if dtype != "auto" else ("bfloat16" if on_gpu else "float32")


def _placement(cfg: RunConfig) -> tuple[bool, bool]:
    """(engine on a GPU, trainer on a GPU), as the runtime places them ('auto' devices: the Ray backend's
    GPU requests; the local runtime's ``model.device`` 'auto' is taken as the CPU, which `sao plan` cannot
    probe)."""
    if cfg.runtime.backend == "ray":
        return cfg.cluster.engine_gpus > 0, cfg.cluster.trainer_gpus > 0
    on_gpu = cfg.model.device.startswith("cuda")
    return on_gpu, on_gpu


def resource_plan(
    cfg: RunConfig,
    gpu_memory_gib: float = DEFAULT_GPU_MEMORY_GIB,
    engine_memory_fraction: float = DEFAULT_ENGINE_MEMORY_FRACTION,
) -> ResourcePlan:
    """The resource plan of ``cfg`` on GPUs of ``gpu_memory_gib`` GiB each (default 80: an A100 / H100
    80 GB; 141 for an H200), the engines using ``engine_memory_fraction`` of theirs. Raises `ConfigError`
    naming ``model.path`` when its architecture cannot be found (see `model_architecture`)."""
    if gpu_memory_gib <= 0 or not 0 < engine_memory_fraction <= 1:
        raise ValueError("gpu_memory_gib must be > 0 and engine_memory_fraction in (0, 1]")
    arch, source = model_architecture(cfg.model)
    notes: list[str] = []
    precision = _precision(cfg, notes)
    gpus = _gpus(cfg, precision.trainer_on_gpu)
    params = sum(parameter_sizes(arch).values())
    engine = _engine_sizes(cfg, arch, precision, params, gpus, gpu_memory_gib, engine_memory_fraction, notes)
    trainer = _trainer_sizes(cfg, arch, precision, gpus, params, engine.weight_bytes, gpu_memory_gib, notes)
    return ResourcePlan(
        model=cfg.model.path or f"tiny {cfg.model.tiny_arch}/{cfg.model.tiny_size}",
        architecture=arch,
        architecture_source=source,
        runtime_backend=cfg.runtime.backend,
        trainer_workers=gpus.workers,
        gpus_per_trainer_worker=gpus.per_worker,
        engine_replicas=gpus.replicas,
        gpus_per_engine_replica=gpus.per_replica,
        trainer_gpus=gpus.trainer,
        engine_gpus=gpus.engine,
        total_gpus=gpus.total,
        params_total=params,
        params_active=active_parameters(arch),
        engine_dtype=precision.engine_dtype,
        kv_bytes_per_token=engine.kv_bytes_per_token,
        max_total_tokens=cfg.data.max_total_tokens,
        kv_bytes_per_sequence=engine.kv_bytes_per_sequence,
        weight_bytes=engine.weight_bytes,
        weight_sync=cfg.runtime.resolved_weight_sync(cfg.engine.backend, cfg.cluster),
        gpu_memory_gib=gpu_memory_gib,
        engine_memory_fraction=engine_memory_fraction,
        sequences_per_replica=engine.sequences_per_replica,
        max_in_flight=cfg.runtime.max_in_flight,
        critic_params=trainer.critic_params,
        critic_trainable_params=trainer.critic_trainable,
        compute_dtype=precision.compute,
        master_dtype=precision.master,
        gradient_checkpointing=precision.checkpointing,
        micro_batch_tokens=trainer.micro_batch_tokens,
        unsharded_gradient=trainer.unsharded_gradient,
        trainer_state_bytes=trainer.state_bytes,
        trainer_state_bytes_per_gpu=trainer.state_bytes_per_gpu,
        trainer_memory=trainer.memory,
        notes=tuple(notes),
    )


@dataclass(frozen=True)
class _Precision:
    """Whether the trainer runs on a GPU, and the dtypes with 'auto' and null resolved as the runtime does."""

    trainer_on_gpu: bool
    engine_dtype: str
    compute: str  # the trainer's forward and backward
    master: str  # weights, gradients and AdamW state
    checkpointing: bool


def _precision(cfg: RunConfig, notes: list[str]) -> _Precision:
    """The placement (`_placement`) and the dtypes it implies; notes how an 'auto' engine dtype was read."""
    engine_on_gpu, trainer_on_gpu = _placement(cfg)
    dtype = _auto_dtype(cfg.engine.dtype, engine_on_gpu)
    compute = _auto_dtype(cfg.model.dtype, trainer_on_gpu)
    if cfg.engine.dtype == "auto":
        where = "a GPU" if engine_on_gpu else "the CPU"
        notes.append(f"engine.dtype 'auto' taken as {dtype} (engine on {where})")
    checkpointing = cfg.model.gradient_checkpointing
    if checkpointing is None:
        checkpointing = trainer_on_gpu
    return _Precision(trainer_on_gpu, dtype, compute, cfg.model.master_dtype, checkpointing)


@dataclass(frozen=True)
class _Gpus:
    """Trainer workers and engine replicas, GPUs each and in all (the local runtime: one shared device)."""

    workers: int
    per_worker: float
    replicas: int
    per_replica: float
    trainer: float
    engine: float
    total: float


def _gpus(cfg: RunConfig, trainer_on_gpu: bool) -> _Gpus:
    """The Ray backend's cluster; the local runtime's trainer and engine on one GPU (or the CPU: 0)."""
    if cfg.runtime.backend == "ray":
        cluster = cfg.cluster
        workers, replicas = cluster.trainer_workers, cluster.engine_replicas
        per_worker, per_replica = cluster.trainer_gpus, cluster.engine_gpus
        trainer_gpus, engine_gpus = workers * per_worker, replicas * per_replica
        total = trainer_gpus + engine_gpus
        return _Gpus(workers, per_worker, replicas, per_replica, trainer_gpus, engine_gpus, total)
    shared = 1.0 if trainer_on_gpu else 0.0
    return _Gpus(1, shared, 1, shared, shared, shared, shared)


@dataclass(frozen=True)
class _EngineSizes:
    """Bytes an engine replica holds: the weights, the KV cache, and the full sequences that fit."""

    weight_bytes: int
    kv_bytes_per_token: int
    kv_bytes_per_sequence: int
    sequences_per_replica: int | None  # None: engines without GPUs of their own


def _engine_sizes(
    cfg: RunConfig,
    arch: Architecture,
    precision: _Precision,
    params: int,
    gpus: _Gpus,
    gpu_memory_gib: float,
    engine_memory_fraction: float,
    notes: list[str],
) -> _EngineSizes:
    """The engine's figures in its dtype (module docstring); notes weights that fill a replica alone."""
    dtype_bytes = DTYPE_BYTES[precision.engine_dtype]
    per_replica = gpus.per_replica
    weight_bytes = params * dtype_bytes
    kv_token = arch.kv_bytes_per_token(dtype_bytes)
    kv_sequence = kv_token * cfg.data.max_total_tokens
    sequences = None
    if cfg.runtime.backend == "ray" and per_replica > 0:
        budget = int(per_replica * gpu_memory_gib * GIB * engine_memory_fraction) - weight_bytes
        sequences = max(0, budget // kv_sequence)
        if budget <= 0:
            notes.append("the weights alone exceed an engine replica's memory: give it more GPUs")
    return _EngineSizes(weight_bytes, kv_token, kv_sequence, sequences)


@dataclass(frozen=True)
class _TrainerSizes:
    """The critic's size, the trainer's state (in all and per GPU) and its predicted peak."""

    critic_params: int  # 0 without a critic
    critic_trainable: int
    state_bytes: int
    state_bytes_per_gpu: int | None  # None: the trainer runs on CPU
    micro_batch_tokens: int
    unsharded_gradient: bool
    memory: TrainerMemory | None  # None: the trainer runs on CPU


def _trainer_sizes(
    cfg: RunConfig,
    arch: Architecture,
    precision: _Precision,
    gpus: _Gpus,
    params: int,
    weight_bytes: int,
    gpu_memory_gib: float,
    notes: list[str],
) -> _TrainerSizes:
    """The trainer's figures (module docstring); notes a peak over a GPU (with its fixes) and bf16 master
    weights."""
    critic_params, critic_trainable = _critic_sizes(cfg, arch)
    master, ray, trainer_gpus = precision.master, cfg.runtime.backend == "ray", gpus.trainer
    state = (params + critic_trainable) * state_bytes_per_parameter(master)
    state += (critic_params - critic_trainable) * state_bytes_per_parameter(master, trainable=False)
    per_gpu = math.ceil(state / trainer_gpus) if trainer_gpus > 0 else None
    tokens = max(cfg.trainer.micro_batch_tokens, cfg.data.max_total_tokens)
    memory = None
    # FSDP ranks with gradient_sync 'step' hold a full unsharded gradient when a rank gets more than one
    # micro-batch: counted whenever the batch can make more than one per rank (the plan's worst case).
    per_rank = cfg.trainer.batch_size / max(1, math.floor(trainer_gpus))
    accumulate = ray and cfg.trainer.gradient_sync == "step" and per_rank * cfg.data.max_total_tokens > tokens
    if trainer_gpus > 0:
        engine_weights, engine_kv = _engine_beside_trainer(cfg, arch, precision.engine_dtype, weight_bytes)
        memory = trainer_memory(
            arch, tokens, compute=precision.compute, master=master, checkpointing=precision.checkpointing,
            world=max(1, math.floor(trainer_gpus)), sharded=ray, unsharded_gradient=accumulate,
            critic_trainable=critic_trainable,
            critic_frozen=critic_params - critic_trainable, engine_weights=engine_weights,
            engine_kv=engine_kv,
        )  # fmt: skip
        if memory.peak > gpu_memory_gib * GIB:
            fixes = "add trainer GPUs (state) or lower data.max_total_tokens / trainer.micro_batch_tokens"
            if accumulate:
                fixes += ", or set trainer.gradient_sync=micro_batch (no full unsharded gradient)"
            if not precision.checkpointing:
                fixes += ", or turn on model.gradient_checkpointing"
            notes.append(f"the trainer's predicted peak exceeds a GPU: {fixes} (activations)")
    if master == "bfloat16":
        notes.append(
            "model.master_dtype bfloat16: weights and AdamW states in bf16 (8 B per parameter); updates "
            "below ~2^-8 of a weight round away (the paper's lr 1e-6 needs float32 master weights)"
        )
    return _TrainerSizes(critic_params, critic_trainable, state, per_gpu, tokens, accumulate, memory)


def _critic_sizes(cfg: RunConfig, arch: Architecture) -> tuple[int, int]:
    """``(parameters, trainable parameters)`` of the critic (``critic.freeze`` applied); (0, 0) without."""
    if not cfg.algo.uses_critic:
        return 0, 0
    critic = critic_parameter_sizes(arch)
    is_frozen = _freeze_matcher(cfg.critic.freeze)
    critic_params = sum(critic.values())
    return critic_params, critic_params - sum(s for n, s in critic.items() if is_frozen(n))


def _engine_beside_trainer(
    cfg: RunConfig, arch: Architecture, dtype: str, weight_bytes: int
) -> tuple[int, int]:
    """``(weight bytes, KV bytes)`` of an engine on the trainer's GPU: the local runtime's (its KV cache only
    when rollouts run during training, ``runtime.mode`` async); (0, 0) on Ray."""
    if cfg.runtime.backend == "ray":
        return 0, 0
    engine_kv = 0
    if cfg.runtime.mode == "async":
        engine_kv = local_engine_kv_bytes(arch, dtype, cfg.engine.max_concurrent, cfg.data.max_total_tokens)
    return weight_bytes, engine_kv
