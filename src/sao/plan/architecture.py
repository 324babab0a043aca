"""The shape of a Qwen3 / Qwen3-MoE decoder and its parameter counts, from a config.json, without torch.

`model_architecture` finds the architecture of a run's model: ``model.path``'s ``config.json`` when that is
a local checkpoint, else `KNOWN_ARCHITECTURES` (transcribed from the public config.json of the models the
paper configs and the GPU check name), and for ``model.tiny_arch`` sao's tiny config (`sao.models.tiny`,
imported only then; it imports torch). `parameter_sizes` lists every tensor under its Hugging Face name
(fused experts as in transformers 5), `critic_parameter_sizes` the critic's (`sao.models.critic`).

Owns: the table and the counts. Does not own: what the counts cost in memory (`sao.plan.memory`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sao.config.schema import ConfigError, ModelConfig

__all__ = [
    "KNOWN_ARCHITECTURES",
    "Architecture",
    "active_parameters",
    "critic_parameter_sizes",
    "known_config",
    "layer_parameter_counts",
    "model_architecture",
    "parameter_sizes",
]

_QWEN3_COMMON: dict[str, Any] = {
    "vocab_size": 151936,
    "attention_bias": False,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000,
    "rms_norm_eps": 1e-06,
    "hidden_act": "silu",
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}

# The architecture keys of the public config.json of each model a paper config or the GPU check names (model
# card: the Hugging Face repository of that name). Read only when model.path is not a local checkpoint.
KNOWN_ARCHITECTURES: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3-0.6B": {
        **_QWEN3_COMMON,
        "model_type": "qwen3",
        "hidden_size": 1024,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 3072,
        "tie_word_embeddings": True,
    },
    "Qwen/Qwen3-8B": {
        **_QWEN3_COMMON,
        "model_type": "qwen3",
        "hidden_size": 4096,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 12288,
        "tie_word_embeddings": False,
    },
    "Qwen/Qwen3-30B-A3B": {
        **_QWEN3_COMMON,
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
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "tie_word_embeddings": False,
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
    max_position_embeddings: int | None = None

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
            max_position_embeddings=config.get("max_position_embeddings"),
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


def layer_parameter_counts(sizes: Mapping[str, int]) -> list[int]:
    """Parameters of each decoder layer (``model.layers.<i>.`` names of ``sizes``), in layer order."""
    counts: dict[int, int] = {}
    for name, size in sizes.items():
        parts = name.split(".")
        if len(parts) > 3 and parts[0] == "model" and parts[1] == "layers":
            counts[int(parts[2])] = counts.get(int(parts[2]), 0) + size
    return [counts[i] for i in sorted(counts)]


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


def known_config(name: str) -> tuple[str, dict[str, Any]] | None:
    """``(table key, config)`` of `KNOWN_ARCHITECTURES` for ``name``: the key itself, or a path or alias
    ending in the model's name, case-insensitively (``…/Qwen3-30B-A3B``, ``qwen3-0.6b``); None if unknown."""
    if name in KNOWN_ARCHITECTURES:
        return name, dict(KNOWN_ARCHITECTURES[name])
    short = Path(name).name.lower()
    key = next((k for k in KNOWN_ARCHITECTURES if k.split("/")[-1].lower() == short), None)
    return None if key is None else (key, dict(KNOWN_ARCHITECTURES[key]))


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
        known = known_config(model.path)
        if known is None:
            raise ConfigError(
                f"model.path: {model.path!r} has no config.json (not written yet?) and is not a known "
                f"architecture ({', '.join(KNOWN_ARCHITECTURES)}); point it at a local checkpoint directory"
            )
        name, config = known
        source = f"shipped table: {name} (its public config.json)"
    try:
        return Architecture.from_hf_config(config), source
    except (KeyError, ValueError) as err:
        raise ConfigError(f"model.path: {source}: {err}") from None
