"""Models: the local byte-level tokenizer, tiny Qwen3 / Qwen3-MoE checkpoints, loading, MoE weight names.

Owns building actor and critic backbones from HF checkpoints or tiny configs; knows nothing of RL algorithms.
"""

from __future__ import annotations

from sao.models.loading import load_policy, load_tokenizer, model_from_config, resolve_device, resolve_dtype
from sao.models.moe_names import checkpoint_names, fuse_experts, unfuse_experts
from sao.models.tiny import (
    TINY_ARCHS,
    TINY_SIZES,
    build_tiny_model,
    count_parameters,
    tiny_checkpoint,
    tiny_config,
)
from sao.models.tokenizer import build_tokenizer, padded_vocab_size

# critic / forward exports are added by their modules' owner

__all__ = [
    "TINY_ARCHS",
    "TINY_SIZES",
    "build_tiny_model",
    "build_tokenizer",
    "checkpoint_names",
    "count_parameters",
    "fuse_experts",
    "load_policy",
    "load_tokenizer",
    "model_from_config",
    "padded_vocab_size",
    "resolve_device",
    "resolve_dtype",
    "tiny_checkpoint",
    "tiny_config",
    "unfuse_experts",
]
