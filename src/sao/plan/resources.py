"""The resource plan of a run config: GPUs, model size, KV cache, weight pushes and trainer memory.

Arithmetic on the config and the model's architecture, not a measurement; `sao plan` prints it
(`resource_plan` then `format_resource_plan`). Nothing is downloaded and torch is not imported: the
architecture comes from `sao.plan.architecture` (``model.path``'s ``config.json``, else the shipped table of
public configs, else sao's tiny config), the trainer's memory from `sao.plan.memory`.

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

from rich.table import Table

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
    activation_bytes_per_token,
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
    "format_resource_plan",
    "model_architecture",
    "parameter_sizes",
    "resource_plan",
    "resource_rows",
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
    engine_on_gpu, trainer_on_gpu = _placement(cfg)
    dtype = _auto_dtype(cfg.engine.dtype, engine_on_gpu)
    compute = _auto_dtype(cfg.model.dtype, trainer_on_gpu)
    master = cfg.model.master_dtype
    if cfg.engine.dtype == "auto":
        where = "a GPU" if engine_on_gpu else "the CPU"
        notes.append(f"engine.dtype 'auto' taken as {dtype} (engine on {where})")
    checkpointing = cfg.model.gradient_checkpointing
    if checkpointing is None:
        checkpointing = trainer_on_gpu
    dtype_bytes = DTYPE_BYTES[dtype]

    cluster, ray = cfg.cluster, cfg.runtime.backend == "ray"
    if ray:
        workers, replicas = cluster.trainer_workers, cluster.engine_replicas
        per_worker, per_replica = cluster.trainer_gpus, cluster.engine_gpus
        trainer_gpus, engine_gpus = workers * per_worker, replicas * per_replica
        total = trainer_gpus + engine_gpus
    else:
        shared = 1.0 if trainer_on_gpu else 0.0
        workers = replicas = 1
        per_worker = per_replica = trainer_gpus = engine_gpus = total = shared

    sizes = parameter_sizes(arch)
    params = sum(sizes.values())
    weight_bytes = params * dtype_bytes
    kv_token = arch.kv_bytes_per_token(dtype_bytes)
    kv_sequence = kv_token * cfg.data.max_total_tokens

    sequences = None
    if ray and per_replica > 0:
        budget = int(per_replica * gpu_memory_gib * GIB * engine_memory_fraction) - weight_bytes
        sequences = max(0, budget // kv_sequence)
        if budget <= 0:
            notes.append("the weights alone exceed an engine replica's memory: give it more GPUs")

    critic_params = critic_trainable = 0
    if cfg.algo.uses_critic:
        critic = critic_parameter_sizes(arch)
        is_frozen = _freeze_matcher(cfg.critic.freeze)
        critic_params = sum(critic.values())
        critic_trainable = critic_params - sum(s for n, s in critic.items() if is_frozen(n))
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
        engine_weights = engine_kv = 0
        if not ray:  # the local engine shares the trainer's GPU
            engine_weights = weight_bytes
            if cfg.runtime.mode == "async":
                engine_kv = local_engine_kv_bytes(
                    arch, dtype, cfg.engine.max_concurrent, cfg.data.max_total_tokens
                )
        memory = trainer_memory(
            arch, tokens, compute=compute, master=master, checkpointing=checkpointing,
            world=max(1, math.floor(trainer_gpus)), sharded=ray, unsharded_gradient=accumulate,
            critic_trainable=critic_trainable,
            critic_frozen=critic_params - critic_trainable, engine_weights=engine_weights,
            engine_kv=engine_kv,
        )  # fmt: skip
        if memory.peak > gpu_memory_gib * GIB:
            fixes = "add trainer GPUs (state) or lower data.max_total_tokens / trainer.micro_batch_tokens"
            if accumulate:
                fixes += ", or set trainer.gradient_sync=micro_batch (no full unsharded gradient)"
            if not checkpointing:
                fixes += ", or turn on model.gradient_checkpointing"
            notes.append(f"the trainer's predicted peak exceeds a GPU: {fixes} (activations)")
    if master == "bfloat16":
        notes.append(
            "model.master_dtype bfloat16: weights and AdamW states in bf16 (8 B per parameter); updates "
            "below ~2^-8 of a weight round away (the paper's lr 1e-6 needs float32 master weights)"
        )
    return ResourcePlan(
        model=cfg.model.path or f"tiny {cfg.model.tiny_arch}/{cfg.model.tiny_size}",
        architecture=arch,
        architecture_source=source,
        runtime_backend=cfg.runtime.backend,
        trainer_workers=workers,
        gpus_per_trainer_worker=per_worker,
        engine_replicas=replicas,
        gpus_per_engine_replica=per_replica,
        trainer_gpus=trainer_gpus,
        engine_gpus=engine_gpus,
        total_gpus=total,
        params_total=params,
        params_active=active_parameters(arch),
        engine_dtype=dtype,
        kv_bytes_per_token=kv_token,
        max_total_tokens=cfg.data.max_total_tokens,
        kv_bytes_per_sequence=kv_sequence,
        weight_bytes=weight_bytes,
        weight_sync=cfg.runtime.resolved_weight_sync(cfg.engine.backend, cfg.cluster),
        gpu_memory_gib=gpu_memory_gib,
        engine_memory_fraction=engine_memory_fraction,
        sequences_per_replica=sequences,
        max_in_flight=cfg.runtime.max_in_flight,
        critic_params=critic_params,
        critic_trainable_params=critic_trainable,
        compute_dtype=compute,
        master_dtype=master,
        gradient_checkpointing=checkpointing,
        micro_batch_tokens=tokens,
        unsharded_gradient=accumulate,
        trainer_state_bytes=state,
        trainer_state_bytes_per_gpu=per_gpu,
        trainer_memory=memory,
        notes=tuple(notes),
    )


def _bytes(n: float) -> str:
    for unit, size in (("TiB", 1024**4), ("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}" if n % size else f"{n // size:g} {unit}"
    return f"{n:g} B"


def _count(n: int) -> str:
    for unit, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= size:
            return f"{n / size:.4g}{unit}"
    return str(n)


def _n(count: float, noun: str) -> str:
    return f"{count:g} {noun}" + ("" if count == 1 else "s")


def _engine_rows(plan: ResourcePlan) -> list[tuple[str, str, str]]:
    a, gpu, dtype = plan.architecture, f"{plan.gpu_memory_gib:g} GiB", plan.engine_dtype
    kv = f"2 × {a.num_layers} layers × {a.num_kv_heads} KV heads × {a.head_dim} head dim × "
    rows = [
        ("engine dtype", dtype, "engine.dtype; each push casts the trainer's weights to it"),
        ("KV cache per token", _bytes(plan.kv_bytes_per_token), kv + f"{DTYPE_BYTES[dtype]} B"),
        ("KV per full sequence", _bytes(plan.kv_bytes_per_sequence),
         f"data.max_total_tokens = {plan.max_total_tokens:,} tokens"),
        ("weights per replica", _bytes(plan.weight_bytes), f"all parameters in {dtype}"),
    ]  # fmt: skip
    if plan.sequences_per_replica is None:
        rows.append(("full sequences per replica", "–", "engines without GPUs of their own"))
    else:
        budget = f"({plan.gpus_per_engine_replica:g} × {gpu} × {plan.engine_memory_fraction:g} − weights)"
        every = str(plan.sequences_per_replica * plan.engine_replicas)
        how = f"{budget} / KV per full sequence"
        rows.append(("full sequences per replica", str(plan.sequences_per_replica), how))
        rows.append(("full sequences, all replicas", every, f"runtime.max_in_flight = {plan.max_in_flight}"))
    pushes = f"{plan.weight_sync}, to {_n(plan.engine_replicas, 'replica')} after every actor step"
    rows.append(("weight sync per push", _bytes(plan.weight_bytes), pushes))
    return rows


def _trainer_rows(plan: ResourcePlan) -> list[tuple[str, str, str]]:
    gpu, master = f"{plan.gpu_memory_gib:g} GiB", plan.master_dtype
    m = DTYPE_BYTES[master]
    critic = "no critic"
    if plan.critic_params:
        critic = f"critic {_count(plan.critic_params)} ({_count(plan.critic_trainable_params)} trainable)"
    state = (f"actor {_count(plan.params_total)}, {critic}: {4 * m} B per trainable parameter ({master} "
             f"weight, gradient, AdamW m and v), {m} B frozen")  # fmt: skip
    precision = f"compute {plan.compute_dtype}, master {master}"
    rows = [
        ("trainer precision", precision, "model.dtype, model.master_dtype"),
        ("trainer state", _bytes(plan.trainer_state_bytes), state),
    ]
    mem, peak = plan.trainer_memory, plan.trainer_peak_bytes_per_gpu
    if plan.trainer_state_bytes_per_gpu is None or mem is None or peak is None:
        return [*rows, ("trainer state per GPU", "–", "trainer on CPU")]
    share = f"{_bytes(plan.trainer_state_bytes_per_gpu)} of {gpu}"
    over = "one process" if plan.runtime_backend == "local" else f"FSDP over {plan.trainer_gpus:g} GPUs"
    rows.append(("trainer state per GPU", share, over))
    ckpt_on = plan.gradient_checkpointing
    kept, working = activation_bytes_per_token(plan.architecture, plan.compute_dtype, ckpt_on)
    ckpt = "on" if ckpt_on else "off"
    activations = _bytes(mem.activations_kept + max(mem.activations_working, mem.lm_head_chunk))
    how = (f"{plan.micro_batch_tokens:,} tokens (max of trainer.micro_batch_tokens, data.max_total_tokens);"
           f" checkpointing {ckpt}: {kept:,} B/token kept + {working:,} B/token in backward's layer, or the"
           f" LM head's chunk {_bytes(mem.lm_head_chunk)}")  # fmt: skip
    rows.append(("activations per GPU", activations, how))
    if mem.gathered:
        units = f"FSDP units in {plan.compute_dtype}: root + 2 layers, and unsharded gradients"
        if plan.unsharded_gradient:
            units += "; a full unsharded gradient (trainer.gradient_sync: step, several micro-batches a rank)"
        rows.append(("gathered parameters", _bytes(mem.gathered), units))
    if mem.engine:
        kv = f" + KV {_bytes(mem.engine_kv)} (async rollouts)" if mem.engine_kv else ""
        weights = f"weights {_bytes(mem.engine_weights)}{kv}"
        rows.append(("engine on the trainer GPU", _bytes(mem.engine), weights))
    left = plan.trainer_headroom_bytes
    verdict = f"{_bytes(left)} left" if left is not None and left > 0 else "DOES NOT FIT"
    rows.append(("trainer peak per GPU", f"{_bytes(peak)} of {gpu}", f"sao.plan.memory; {verdict}"))
    return rows


def resource_rows(plan: ResourcePlan) -> list[tuple[str, str, str]]:
    """The plan as (quantity, value, how it is computed) rows, in the order `format_resource_plan` shows."""
    a = plan.architecture
    moe = f"{a.num_experts} experts, top-{a.experts_per_token}; " if a.num_experts else ""
    head = "tied embeddings" if a.tie_word_embeddings else "embeddings and LM head"
    layout = f"trainer {plan.trainer_gpus:g} + engines {plan.engine_gpus:g}"
    if plan.runtime_backend == "local":
        layout = "local runtime: trainer and engine share " + ("one GPU" if plan.total_gpus else "the CPU")
    rows = [
        ("model", f"{plan.model} ({a.model_type})", plan.architecture_source),
        ("parameters", f"{_count(plan.params_total)} total, {_count(plan.params_active)} active",
         f"{moe}{head} included"),
        ("GPUs", f"{plan.total_gpus:g}", layout),
        ("trainer GPUs", f"{plan.trainer_gpus:g}",
         f"{_n(plan.trainer_workers, 'worker')} × {_n(plan.gpus_per_trainer_worker, 'GPU')}"),
        ("engine GPUs", f"{plan.engine_gpus:g}",
         f"{_n(plan.engine_replicas, 'replica')} × {_n(plan.gpus_per_engine_replica, 'GPU')}"),
    ]  # fmt: skip
    rows += _engine_rows(plan) + _trainer_rows(plan)
    return rows + [("note", "", note) for note in plan.notes]


def format_resource_plan(plan: ResourcePlan) -> Table:
    """The plan as a rich table (quantity, value, how it is computed)."""
    table = Table(title=f"Resource plan: {plan.model}", title_justify="left")
    for column in ("quantity", "value", "how"):
        table.add_column(column, overflow="fold")
    for row in resource_rows(plan):
        table.add_row(*row)
    return table
