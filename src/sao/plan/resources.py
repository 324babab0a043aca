"""The resource plan of a run config: GPUs, model size, KV cache, weight pushes and trainer memory.

Arithmetic on the config and the model's architecture, not a measurement; `sao plan` prints it
(`resource_plan` then `format_resource_plan`). Nothing is downloaded and torch is not imported: the
architecture comes from ``model.path``'s ``config.json`` when that is a local checkpoint, else from
`KNOWN_ARCHITECTURES` (transcribed from the public config.json of every model a paper config names), and
for ``model.tiny_arch`` from sao's tiny config (`sao.models.tiny`, imported only then; it imports torch).

Figures and the assumptions behind them:

- parameters: one entry per Hugging Face tensor of Qwen3 / Qwen3-MoE (`parameter_sizes`, the names of
  ``named_parameters()``, fused experts as in transformers 5); *active* counts top-k of the experts;
- KV cache per token = 2 (K and V) × layers × KV heads × head dim × bytes of the engine dtype
  (``model.dtype``, the engines' dtype too); a full sequence is ``data.max_total_tokens`` tokens;
- sequences per engine replica = ⌊(GPUs × ``gpu_memory_gib`` × ``engine_memory_fraction`` − weights) / KV
  of a full sequence⌋, the weights in the engine dtype (``engine_memory_fraction`` 0.9: vLLM's default
  ``--gpu-memory-utilization``; activations and CUDA graphs come out of the rest);
- a weight push moves every policy parameter in the engine dtype;
- trainer state, sharded evenly over the trainer GPUs (FSDP2): 16 B per trainable parameter (fp32 weights,
  gradients, AdamW m and v) and 4 B per frozen one, for the actor and, when the algorithm has one, the
  critic (the backbone without the LM head, plus a scalar value head; ``critic.freeze`` applied by name as
  `sao.models.freezing` does). Activations are not counted: the headroom is what is left for them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from sao.config.schema import ConfigError, ModelConfig, RunConfig

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
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_TRAINABLE_BYTES = 16  # fp32 weight + fp32 gradient + AdamW m and v in fp32
_FROZEN_BYTES = 4  # fp32 weight only
_ATTENTION_MARKER = ".self_attn."  # as sao.models.freezing.ATTENTION_MARKER (that module imports torch)

# The architecture keys of the public config.json of each model a paper config names (model card: the
# Hugging Face repository of that name). Read only when model.path is not a local checkpoint.
KNOWN_ARCHITECTURES: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3-30B-A3B": {
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "vocab_size": 151936,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "max_position_embeddings": 40960,
    },
}


@dataclass(frozen=True)
class Architecture:
    """The shape of a Qwen3 (dense) or Qwen3-MoE decoder, as its config.json gives it."""

    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # the dense MLP width (also of the dense layers of a MoE model)
    vocab_size: int
    tie_word_embeddings: bool
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    attention_bias: bool = False

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> Architecture:
        """From a config.json mapping; raises ValueError for a model type other than qwen3 / qwen3_moe."""
        model_type = config.get("model_type")
        if model_type not in ("qwen3", "qwen3_moe"):
            raise ValueError(f"model_type {model_type!r} is not supported (qwen3, qwen3_moe)")
        moe = model_type == "qwen3_moe"
        heads = int(config["num_attention_heads"])
        return cls(
            model_type=model_type,
            hidden_size=int(config["hidden_size"]),
            num_layers=int(config["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // heads),
            intermediate_size=int(config["intermediate_size"]),
            vocab_size=int(config["vocab_size"]),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            # config.json says num_experts; transformers 5's Qwen3MoeConfig.to_dict() num_local_experts.
            num_experts=int(config.get("num_experts") or config.get("num_local_experts") or 0) if moe else 0,
            experts_per_token=int(config.get("num_experts_per_tok", 0)) if moe else 0,
            moe_intermediate_size=int(config.get("moe_intermediate_size", 0)) if moe else 0,
            decoder_sparse_step=int(config.get("decoder_sparse_step", 1)) if moe else 1,
            mlp_only_layers=tuple(config.get("mlp_only_layers") or ()) if moe else (),
            attention_bias=bool(config.get("attention_bias", False)),
        )

    def is_sparse(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` has a MoE block (transformers' Qwen3-MoE rule)."""
        return (
            self.num_experts > 0
            and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0
        )

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of one token over all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


def parameter_sizes(arch: Architecture) -> dict[str, int]:
    """Element count of every parameter of the causal LM, by its Hugging Face name (a tied LM head is the
    embedding and not listed twice, as in ``named_parameters()``)."""
    h, d = arch.hidden_size, arch.head_dim
    sizes = {"model.embed_tokens.weight": arch.vocab_size * h}
    projections = {
        "q_proj": (arch.num_heads * d, h),
        "k_proj": (arch.num_kv_heads * d, h),
        "v_proj": (arch.num_kv_heads * d, h),
        "o_proj": (h, arch.num_heads * d),
    }
    for i in range(arch.num_layers):
        layer = f"model.layers.{i}."
        for name, (out, inp) in projections.items():
            sizes[f"{layer}self_attn.{name}.weight"] = out * inp
            if arch.attention_bias:
                sizes[f"{layer}self_attn.{name}.bias"] = out
        sizes[f"{layer}self_attn.q_norm.weight"] = d
        sizes[f"{layer}self_attn.k_norm.weight"] = d
        if arch.is_sparse(i):
            e, m = arch.num_experts, arch.moe_intermediate_size
            sizes[f"{layer}mlp.experts.gate_up_proj"] = e * 2 * m * h
            sizes[f"{layer}mlp.experts.down_proj"] = e * h * m
            sizes[f"{layer}mlp.gate.weight"] = e * h
        else:
            for name in ("gate_proj", "up_proj", "down_proj"):
                sizes[f"{layer}mlp.{name}.weight"] = arch.intermediate_size * h
        sizes[f"{layer}input_layernorm.weight"] = h
        sizes[f"{layer}post_attention_layernorm.weight"] = h
    sizes["model.norm.weight"] = h
    if not arch.tie_word_embeddings:
        sizes["lm_head.weight"] = arch.vocab_size * h
    return sizes


def critic_parameter_sizes(arch: Architecture) -> dict[str, int]:
    """The critic's parameters (`sao.models.critic`: the backbone and a scalar ``score`` head with bias)."""
    sizes = {n: s for n, s in parameter_sizes(arch).items() if not n.startswith("lm_head.")}
    return {**sizes, "score.weight": arch.hidden_size, "score.bias": 1}


def active_parameters(arch: Architecture) -> int:
    """Parameters one token passes through: all but the experts it is not routed to."""
    sizes = parameter_sizes(arch)
    idle = 0
    if arch.num_experts:
        unused = 1 - arch.experts_per_token / arch.num_experts
        for name, size in sizes.items():
            if ".mlp.experts." in name:
                idle += round(size * unused)
    return sum(sizes.values()) - idle


def _freeze_matcher(freeze: str | list[str]) -> Callable[[str], bool]:
    # The rule of sao.models.freezing.apply_freeze, by parameter name.
    if freeze == "none":
        return lambda name: False
    if freeze == "attention":
        return lambda name: _ATTENTION_MARKER in name
    patterns = [re.compile(p) for p in freeze]
    return lambda name: any(p.search(name) for p in patterns)


def model_architecture(model: ModelConfig) -> tuple[Architecture, str]:
    """The architecture of the run's model and where it came from. Raises `ConfigError` naming
    ``model.path`` when it is neither a local checkpoint nor in `KNOWN_ARCHITECTURES`, or its model type
    is not supported."""
    if model.tiny_arch is not None:
        from sao.models.tiny import tiny_config  # imports torch: only for tiny models

        config = tiny_config(model.tiny_arch, model.tiny_size).to_dict()
        return Architecture.from_hf_config(config), f"sao tiny config {model.tiny_arch}/{model.tiny_size}"
    assert model.path is not None  # ModelConfig holds exactly one of path / tiny_arch
    config_file = Path(model.path) / "config.json"
    if config_file.is_file():
        config, source = json.loads(config_file.read_text()), str(config_file)
    else:
        name = model.path if model.path in KNOWN_ARCHITECTURES else _known_by_name(model.path)
        if name is None:
            raise ConfigError(
                f"model.path: {model.path!r} has no config.json (not written yet?) and is not a known "
                f"architecture ({', '.join(KNOWN_ARCHITECTURES)}); point it at a local checkpoint directory"
            )
        config, source = KNOWN_ARCHITECTURES[name], f"shipped table: {name} (its public config.json)"
    try:
        return Architecture.from_hf_config(config), source
    except (KeyError, ValueError) as err:
        raise ConfigError(f"model.path: {source}: {err}") from None


def _known_by_name(path: str) -> str | None:
    # A local copy named after the model (…/Qwen3-30B-A3B) whose directory is not there (yet).
    return next((k for k in KNOWN_ARCHITECTURES if k.split("/")[-1] == Path(path).name), None)


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
    trainer_state_bytes: int
    trainer_state_bytes_per_gpu: int | None  # None: the trainer runs on CPU
    notes: tuple[str, ...]

    @property
    def trainer_headroom_bytes(self) -> int | None:
        """GPU memory a trainer GPU has left beside its share of the state (negative: it does not fit)."""
        if self.trainer_state_bytes_per_gpu is None:
            return None
        return int(self.gpu_memory_gib * GIB) - self.trainer_state_bytes_per_gpu


def _engine_dtype(cfg: RunConfig) -> tuple[str, str | None]:
    if cfg.model.dtype != "auto":
        return cfg.model.dtype, None
    device = cfg.model.device
    on_gpu = device.startswith("cuda") or (
        device == "auto" and cfg.runtime.backend == "ray" and cfg.cluster.engine_gpus > 0
    )
    dtype = "bfloat16" if on_gpu else "float32"
    return dtype, f"model.dtype 'auto' taken as {dtype} (model.device {device!r})"


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
    dtype, dtype_note = _engine_dtype(cfg)
    if dtype_note:
        notes.append(dtype_note)
    dtype_bytes = _DTYPE_BYTES[dtype]

    cluster, ray = cfg.cluster, cfg.runtime.backend == "ray"
    if ray:
        workers, replicas = cluster.trainer_workers, cluster.engine_replicas
        per_worker, per_replica = cluster.trainer_gpus, cluster.engine_gpus
        trainer_gpus, engine_gpus = workers * per_worker, replicas * per_replica
        total = trainer_gpus + engine_gpus
    else:
        shared = 1.0 if cfg.model.device.startswith("cuda") else 0.0
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

    frozen = (0, 0)
    if cfg.algo.uses_critic:
        critic = critic_parameter_sizes(arch)
        is_frozen = _freeze_matcher(cfg.critic.freeze)
        frozen_count = sum(s for n, s in critic.items() if is_frozen(n))
        frozen = (sum(critic.values()), sum(critic.values()) - frozen_count)
    critic_params, critic_trainable = frozen
    state = params * _TRAINABLE_BYTES
    state += critic_trainable * _TRAINABLE_BYTES + (critic_params - critic_trainable) * _FROZEN_BYTES
    per_gpu = math.ceil(state / trainer_gpus) if trainer_gpus > 0 else None
    if per_gpu is not None and per_gpu > gpu_memory_gib * GIB:
        notes.append("the trainer state does not fit its GPUs: add trainer workers or GPUs")
    if dtype != "float32":
        notes.append(
            f"the trainer keeps weights, gradients and AdamW states in model.dtype ({dtype}, "
            f"{4 * dtype_bytes} B per parameter); the trainer state above is the fp32 recipe (16 B)"
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
        weight_sync=cfg.runtime.resolved_weight_sync(cfg.engine.backend),
        gpu_memory_gib=gpu_memory_gib,
        engine_memory_fraction=engine_memory_fraction,
        sequences_per_replica=sequences,
        max_in_flight=cfg.runtime.max_in_flight,
        critic_params=critic_params,
        critic_trainable_params=critic_trainable,
        trainer_state_bytes=state,
        trainer_state_bytes_per_gpu=per_gpu,
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


def resource_rows(plan: ResourcePlan) -> list[tuple[str, str, str]]:
    """The plan as (quantity, value, how it is computed) rows, in the order `format_resource_plan` shows."""
    a, gpu, dtype = plan.architecture, f"{plan.gpu_memory_gib:g} GiB", plan.engine_dtype
    moe = f"{a.num_experts} experts, top-{a.experts_per_token}; " if a.num_experts else ""
    head = "tied embeddings" if a.tie_word_embeddings else "embeddings and LM head"
    layout = f"trainer {plan.trainer_gpus:g} + engines {plan.engine_gpus:g}"
    if plan.runtime_backend == "local":
        layout = "local runtime: trainer and engine share " + ("one GPU" if plan.total_gpus else "the CPU")
    kv = f"2 × {a.num_layers} layers × {a.num_kv_heads} KV heads × {a.head_dim} head dim × "
    rows = [
        ("model", f"{plan.model} ({a.model_type})", plan.architecture_source),
        ("parameters", f"{_count(plan.params_total)} total, {_count(plan.params_active)} active",
         f"{moe}{head} included"),
        ("GPUs", f"{plan.total_gpus:g}", layout),
        ("trainer GPUs", f"{plan.trainer_gpus:g}",
         f"{_n(plan.trainer_workers, 'worker')} × {_n(plan.gpus_per_trainer_worker, 'GPU')}"),
        ("engine GPUs", f"{plan.engine_gpus:g}",
         f"{_n(plan.engine_replicas, 'replica')} × {_n(plan.gpus_per_engine_replica, 'GPU')}"),
        ("engine dtype", dtype, "model.dtype"),
        ("KV cache per token", _bytes(plan.kv_bytes_per_token), kv + f"{_DTYPE_BYTES[dtype]} B"),
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
    critic = "no critic"
    if plan.critic_params:
        critic = f"critic {_count(plan.critic_params)} ({_count(plan.critic_trainable_params)} trainable)"
    state = f"actor {_count(plan.params_total)}, {critic}: 16 B per trainable parameter, 4 B frozen"
    rows.append(("trainer state", _bytes(plan.trainer_state_bytes), state))
    left = plan.trainer_headroom_bytes
    if plan.trainer_state_bytes_per_gpu is None or left is None:
        rows.append(("trainer state per GPU", "–", "trainer on CPU"))
    else:
        share = f"{_bytes(plan.trainer_state_bytes_per_gpu)} of {gpu}"
        verdict = f"{_bytes(left)} left for activations" if left > 0 else "DOES NOT FIT"
        rows.append(("trainer state per GPU", share, f"FSDP over {plan.trainer_gpus:g} GPUs; {verdict}"))
    return rows + [("note", "", note) for note in plan.notes]


def format_resource_plan(plan: ResourcePlan) -> Table:
    """The plan as a rich table (quantity, value, how it is computed)."""
    table = Table(title=f"Resource plan: {plan.model}", title_justify="left")
    for column in ("quantity", "value", "how"):
        table.add_column(column, overflow="fold")
    for row in resource_rows(plan):
        table.add_row(*row)
    return table
