"""Models: the local byte-level tokenizer, tiny Qwen3 / Qwen3-MoE checkpoints, loading, MoE weight names.

Owns building actor and critic backbones from HF checkpoints or tiny configs; knows nothing of RL algorithms.
"""

from __future__ import annotations

from sao.models.attention import (
    PACKED_ATTENTION,
    enable_packed_attention,
    packed_attention_kwargs,
    packed_context,
)
from sao.models.critic import CriticModel, load_critic
from sao.models.forward import token_logprobs, token_values
from sao.models.freezing import ATTENTION_MARKER, FreezeReport, FreezeRule, apply_freeze, trainable_parameters
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

__all__ = [
    "ATTENTION_MARKER",
    "PACKED_ATTENTION",
    "TINY_ARCHS",
    "TINY_SIZES",
    "CriticModel",
    "FreezeReport",
    "FreezeRule",
    "apply_freeze",
    "build_tiny_model",
    "build_tokenizer",
    "checkpoint_names",
    "count_parameters",
    "enable_packed_attention",
    "fuse_experts",
    "load_critic",
    "load_policy",
    "load_tokenizer",
    "model_from_config",
    "packed_attention_kwargs",
    "packed_context",
    "padded_vocab_size",
    "resolve_device",
    "resolve_dtype",
    "tiny_checkpoint",
    "tiny_config",
    "token_logprobs",
    "token_values",
    "trainable_parameters",
    "unfuse_experts",
]
